"""Ray job entrypoints: ``python -m jobs.<name>`` (fits ``ray job submit``).

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is imported. For local
runs (no RAY_ADDRESS: tests, CI, one machine) it must be 0 so that Ray binds to
127.0.0.1 only (README, "Running on a cluster"); jobs submitted to a cluster carry RAY_ADDRESS and are
left alone.
"""
import os

if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
