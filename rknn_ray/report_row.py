"""One row per private run, for every table the project writes: :class:`ReportRow` names
each field once and :func:`report_row` is the only reader of report.json into a row.

Lives in the library (it imports nothing of the project) so that producers below the job
layer, the baselines of :mod:`rknn_ray.baselines`, return rows of the same schema as the
experiments of ``jobs`` (compare, grid, adaptive rounds, ``rknn-ray report``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NAN = float("nan")
#: bump when ReportRow's fields change: a saved row of another version is not "done"
ROW_SCHEMA = 1
#: the timings that add up to a run's stage total (``stage_s``), in order
STAGES = ("data", "queries", "actors", "labels", "student")


@dataclass(frozen=True)
class ReportRow:
    """What one private run's report.json says, as one flat table row.

    Fields (a run that failed, or a report that lacks one, gives NaN / None / ""):

    - ``model``, ``mechanism``: the trust model (central, local, shuffle) and mechanism.
    - ``dataset``: ``config.data.dataset``.
    - ``eps``, ``delta``: the guarantee the run's accountant reports, all rounds composed.
    - ``unit``, ``neighbour``: what it protects (``record`` / ``label``) and the neighbour
      relation (``replace-one``, ``add-remove``).
    - ``private``: False only for a simulation (``run.rng=seeded``) or a reference.
    - ``accuracy``: the student on the evaluation split; ``label_accuracy``: the released
      labels on the public set (Acc_pl); ``query_label_accuracy``: the labels of the queries.
    - ``nonprivate_label_accuracy``: the same labels from exact counts (diagnostics only,
      NOT private; None unless ``run.diagnostics``).
    - ``rounds``: private rounds; ``round_eps``: each round's eps; ``ledger_events``: the
      events recorded.
    - ``clients``, ``queries`` (labeled, all rounds), ``k_used`` (``rknn.k``), ``messages``
      (accepted by the server), ``bytes_per_client`` (messages x message bytes / clients).
    - ``stage_s``: the sum of the run's stage, round and selection timings (seconds).
    """
    model: str | None = None
    mechanism: str | None = None
    dataset: str | None = None
    eps: float = NAN
    delta: float = NAN
    unit: str = ""
    neighbour: str | None = None
    private: bool | None = None
    accuracy: float = NAN
    label_accuracy: float = NAN
    query_label_accuracy: float | None = None
    nonprivate_label_accuracy: float | None = None
    rounds: int = 0
    round_eps: tuple = ()
    ledger_events: int = 0
    clients: int | None = None
    queries: int | None = None
    k_used: int | None = None
    messages: int | None = None
    bytes_per_client: float = NAN
    stage_s: float | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["round_eps"] = list(self.round_eps)
        return d


#: the schema's field names, in order (every producer's rows hold all of them)
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(ReportRow))


def _num(v, default=NAN):
    return default if v is None else v


def stage_seconds(timings: dict) -> float:
    """The stages plus every round and selection (``round_0``, ``select_1``; not their parts)."""
    return float(sum(timings.get(k, 0.0) for k in STAGES) + sum(
        v for k, v in timings.items() if k.startswith(("round_", "select_")) and k.count("_") == 1))


def report_row(report: dict | None) -> ReportRow:
    """The one reader of report.json for tables; ``None`` (a failed run) gives the empty row."""
    if report is None:
        return ReportRow()
    p = report.get("privacy") or {}
    acc = report.get("accuracy") or {}
    c = report.get("counts") or {}
    cfg = report.get("config") or {}
    details = p.get("details") or [{}]
    msg_bytes = (details[-1] or {}).get("message_bytes") or 0
    rounds = p.get("rounds") or []
    clients = c.get("clients")
    return ReportRow(
        model=p.get("model"), mechanism=p.get("mechanism"),
        dataset=(cfg.get("data") or {}).get("dataset"),
        eps=_num(p.get("eps")), delta=_num(p.get("delta")), unit=p.get("unit") or "",
        neighbour=p.get("neighbour"), private=p.get("private", True),
        accuracy=_num(acc.get("student")), label_accuracy=_num(acc.get("labels")),
        query_label_accuracy=acc.get("query_labels"),
        nonprivate_label_accuracy=(report.get("diagnostics") or {}).get("nonprivate_labels"),
        rounds=int(c.get("rounds") or len(rounds)), round_eps=tuple(r.get("eps") for r in rounds),
        ledger_events=len((p.get("ledger") or {}).get("entries") or []),
        clients=clients, queries=c.get("queries"), k_used=(cfg.get("rknn") or {}).get("k"),
        messages=c.get("messages"),
        bytes_per_client=(float(c.get("messages") or 0) * msg_bytes / max(1, clients or 0)
                          if "messages" in c else NAN),
        stage_s=stage_seconds(report.get("timings_s") or {}) if report.get("timings_s") else None)


def empty_row() -> dict:
    """Every schema field at its 'nothing known' value: the base of a failed cell's row."""
    return ReportRow().to_dict()
