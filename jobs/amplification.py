"""``python -m jobs.amplification``: the amplification study, kept as a name the README and
the ``rknn-ray-amplification`` script use. The study lives in benchmarks/amplification.py."""
import sys

from benchmarks.amplification import main, point, run_grid  # noqa: F401  (the entrypoint's API)

if __name__ == "__main__":
    sys.exit(main())
