"""Starting or joining Ray the way these machines need it.

With ``RAY_ADDRESS`` set (``ray job submit``, a cluster) we join that cluster and
touch nothing else. Otherwise we start a local instance bound to loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be set before Ray starts (DESIGN.md).
"""
from __future__ import annotations

import logging
import os


class _DropStateApiNoise(logging.Filter):
    """Ray Train V2 logs this repeatedly when the dashboard is off; it is harmless."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "State API may be temporarily unavailable" not in record.getMessage()


def quiet_ray_logs() -> None:
    for name in ("ray", "ray.train", "ray.util.state", "ray.train.v2"):
        logging.getLogger(name).addFilter(_DropStateApiNoise())


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
