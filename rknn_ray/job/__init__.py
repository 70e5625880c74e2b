"""The orchestration layer: one job, from a validated config to a run folder, without a CLI.

Owns the job context (:mod:`.context`), the protocol session on the parties' Ray actors and
its failure accounting (:mod:`.session`), the multi-round loop with per-round query
selection (:mod:`.rounds`), the release file (:mod:`.release_file`), Ray start-up
(:mod:`.ray_env`), where the parties run (:mod:`.placement`), the job's stage clock and
bars (:mod:`.progress`), and ``run(config) -> RunResult`` (:mod:`.run`).

May import: the library (the rest of ``rknn_ray``), ``sealing``, ``server``, ``shuffler``
and ``actors``. It sits above ``actors`` and below ``jobs`` (the CLIs) and ``benchmarks``:
nothing else in ``rknn_ray`` and no party package imports it (tests/test_layers.py).
"""
