"""The NON-PRIVATE reference of the pipeline: the same run with exact (noise-free) counts.

Same data, split, encoder, queries, reverse k-NN, label smoothing and student as a
private run of ``cfg``; only the released counts are replaced by the exact private
counts. It is what the privacy costs are measured against (the "Non-priv Acc." column
of paper 000, Table 1). No privacy guarantee covers anything computed here: the
results are marked ``"private": false`` and the folder gets a README saying so.
Nothing is released and no ledger is touched (no mechanism runs). The stages are
rknn_ray.job.stages' sequences (prepare_stages, nonprivate_labels) and the student stage's
train_on_labels, the same ones a private run and its diagnostics call. It is a job (it
trains the student with Ray Train and writes a folder), so it sits in the job layer, above
the sequences it runs.
"""
from __future__ import annotations

import os
import time

import numpy as np

from rknn_ray.errors import ConfigError
from rknn_ray.job.stages import nonprivate_labels, prepare_stages
from rknn_ray.runio import write_text
from rknn_ray.student.stage import train_on_labels

NOT_PRIVATE = ("NOT PRIVATE: computed from the private records without noise (the "
               "non-private reference of the same pipeline); no privacy guarantee covers it")

README = """NOT PRIVATE. Everything in this folder was computed from the private data WITHOUT
noise: the labels and the student that the same pipeline gives with the exact private
counts (rknn_ray/job/reference.py). It is a yardstick for the private runs, not a release.
Do not share this folder with anyone who may not see the private data.
"""


def nonprivate_reference(cfg, out_dir: str | None = None, progress=None) -> dict:
    """Run the pipeline of ``cfg`` on exact counts; returns its accuracies (NOT private).

    ``queries.s`` / ``rknn.k`` must be numbers here (resolve ``auto`` first, e.g. from a
    private run's report, so both use the same s and k). With ``out_dir`` the student
    checkpoint and a README land there. Needs Ray for the student (Ray Train).
    """
    if "auto" in (cfg.queries.s, cfg.rknn.k):
        raise ConfigError("queries.s", "the non-private reference needs fixed s and k, got "
                          f"s = {cfg.queries.s}, k = {cfg.rknn.k}",
                          "take s and k from a private run's report.json (config section)")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_text(os.path.join(out_dir, "README.txt"), README)
    t0 = time.perf_counter()
    st = prepare_stages(cfg)
    qs = st.queries
    exact, lab, info = nonprivate_labels(cfg, st.data, st.encoder, [qs], qs, st.public_emb)
    _, student = train_on_labels(cfg, st.data, st.encoder, lab, info, qs, st.public_emb,
                                 out_dir, progress)
    return {"private": False, "warning": NOT_PRIVATE,
            "label_accuracy": float(lab.label_accuracy),
            "query_accuracy": float(lab.query_accuracy),
            "student_accuracy": float(student.test_accuracy),
            "queries": int(qs.size), "k": int(cfg.rknn.k),
            "smoothing": info["denoise"]["neighbours"],
            "records": int(len(st.data.splits.private_y)),
            "votes_per_query": float(np.asarray(exact).sum() / max(1, qs.size)),
            "wall_s": time.perf_counter() - t0}
