"""A run folder as jobs.distill leaves it, written without running a job (report tests)."""
import json
import os

import matplotlib

matplotlib.use("Agg")


def write_png(path, color="#4477aa"):
    """A small real PNG (a bar chart), as the job's plots are."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar([0, 1], [0.9, 0.8], color=color)
    fig.savefig(path, format="png")
    plt.close(fig)


def write_run(folder, model, mechanism, eps=1.0, delta=0.0, shuffler=False, diagnostics=False,
              resumed=False):
    """A run folder as jobs.distill leaves it (report.json, summary.png, history.json);
    ``resumed``: finished with --resume after an interrupt."""
    os.makedirs(folder, exist_ok=True)
    rejected = {"malformed": 0, "wrong_job": 0, "wrong_round": 0, "tampered": 2, "replayed": 0}
    report = {
        "accuracy": {"labels": 0.9164, "student": 0.9331, "nonprivate_labels": None,
                     "query_labels": 0.9},
        "privacy": {"model": model, "mechanism": mechanism, "eps": eps, "delta": delta,
                    "unit": "record", "neighbour": "replace-one",
                    "rounds": [{"eps": eps, "delta": delta, "model": model, "mechanism": mechanism,
                                "unit": "record", "neighbour": "replace-one", "n": 1079}],
                    "ledger": {}, "details": [{}],
                    "budget": {"description": "digits (test)", "ledger": "/tmp/x",
                               "shown_by": "rknn-ray budget --ledger /tmp/x"}},
        "counts": {"clients": 1079, "records": 1079, "queries": 10, "public": 359, "evaluation": 359,
                   "messages": 1077, "received": 1079, "rejected": rejected, "rounds": 1},
        "student": {"test_accuracy": 0.9331, "epochs": 2, "num_workers": 2, "device": "cpu",
                    "train_samples": 359},
        "timings_s": {"data": 0.1, "queries": 1.5, "actors": 4.2, "round_0": 2.3, "clients": 1.9,
                      "server_open": 0.8, "server_finalize": 0.01, "labels": 0.0, "student": 31.0},
        "rng": "secure", "version": "0.1.0", "job_id": "0123456789abcdef",
        "resumed": {"at": "2026-11-27T10:02:00Z", "release_saved_at": "2026-11-27T09:58:00Z",
                    "after": "interrupted by SIGINT during student"} if resumed else None,
        "config": {"run": {"name": f"{model}-{mechanism}"}, "data": {"dataset": "digits"}},
    }
    if shuffler:
        report["shuffler"] = [{"senders": 1079, "messages": 1079, "bytes": 99}]
    if diagnostics:
        os.makedirs(os.path.join(folder, "diagnostics"))
        write_png(os.path.join(folder, "diagnostics", "summary_nonprivate.png"), "#999999")
        report["diagnostics"] = {"private": False, "nonprivate_labels": 0.95}
    write_png(os.path.join(folder, "summary.png"))
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump([{"epoch": 1, "train_loss": 2.0, "train_accuracy": 0.3},
                   {"epoch": 2, "train_loss": 1.5, "train_accuracy": 0.6}], f)
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump(report, f)
    return folder
