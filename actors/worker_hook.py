"""The Ray worker setup hook, in a module a worker imports cheaply (nothing of the library).

Workers import the hook by name before their first task; the job layer
(rknn_ray.job.ray_env) sets it in the job's runtime env.
"""
import os


def pin_ray_address() -> None:
    """Worker setup hook: name this cluster in the worker's RAY_ADDRESS. Ray Train's
    PlacementGroupCleaner looks its controller up through the State API without an address;
    with a second Ray instance on the machine (a test session, another user's job) that
    lookup finds two and its monitor thread dies printing a traceback on our console."""
    import ray      # a worker has it loaded already; importing this module stays free of it
    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
