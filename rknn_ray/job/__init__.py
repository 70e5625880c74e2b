"""The orchestration layer: one job, from a validated config to a run folder, without a CLI.

Owns the job context (:mod:`.context`), the protocol session on the parties' Ray actors and
its failure accounting (:mod:`.session`), the multi-round loop with per-round query
selection (:mod:`.rounds`), the release file (:mod:`.release_file`), Ray start-up
(:mod:`.ray_env`), where the parties run (:mod:`.placement`), the job's stage clock and
bars (:mod:`.progress`), which run folder ``--resume`` may finish and with which config
(:mod:`.resume`), a failure said in one line and in incomplete.json (:mod:`.failure`), and
``run(config) -> RunResult`` (:mod:`.runner`).

May import: the library (the rest of ``rknn_ray``), ``sealing``, ``server``, ``shuffler``
and ``actors``. It sits above ``actors`` and below ``jobs`` (the CLIs) and ``benchmarks``:
nothing else in ``rknn_ray`` and no party package imports it (tests/test_layers.py).
"""

from rknn_ray.job.runner import RunResult, run

__all__ = ["RunResult", "run"]
