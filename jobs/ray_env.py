"""Starting or joining Ray the way these machines need it.

With ``RAY_ADDRESS`` set (``ray job submit``, a cluster) we join that cluster and
touch nothing else. Otherwise we start a local instance bound to loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be set before Ray starts (DESIGN.md).
"""
from __future__ import annotations

import logging
import os


def quiet_ray_logs() -> None:
    """Hide Train's repeated 'State API' warning (logged and forwarded from another
    process; rknn_ray.student.quiet_train_logs knows where)."""
    from rknn_ray.student import quiet_train_logs
    quiet_train_logs()


def ensure_ray(num_cpus: int | None = None) -> bool:
    """Init Ray if needed; returns True when this call started a local instance."""
    import ray
    quiet_ray_logs()
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
             log_to_driver=True, configure_logging=True, logging_level=logging.WARNING)
    return True
