"""Ray job entrypoints: ``python -m jobs.<name>`` (fits ``ray job submit``)."""
