"""What every baseline shares: the data, the public queries, small batched models,
RDP conversion and noise calibration, the student, and the row (the report-row schema).

All baselines run on exactly the data reverse k-NN runs on: the job layer's
``rknn_ray.job.baselines.prepare_baseline`` runs ``prepare_stages`` (same dataset, split,
partition into clients, same public encoder and the same ``s`` k-means queries). A labeling baseline labels
those ``s`` queries privately; the labels propagate to the public set along the
query clusters and ``rknn_ray.student.stage.train_on_labels`` trains the project's student
(the config's student section, in this process) on them and scores it on the
evaluation split -- the same path reverse k-NN takes. Teachers and local models
are small: multinomial logistic regressions (optionally one hidden layer) on the
public-fitted representation, trained in torch as one batch of ``G`` independent
models.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
import dataclasses

import numpy as np
import torch

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.guarantee import Guarantee
from rknn_ray.labeling.stage import derive_labels
from rknn_ray.report_row import NAN, ReportRow

# RDP/PLD conversion is the accountant's (re-exported: the baselines' tests use these names)
from rknn_ray.accounting.accountants import (DEFAULT_COSTING, RDP_ORDERS, Costing,  # noqa: F401
                                             event_cost, pld_epsilon, rdp_epsilon)
from rknn_ray.student import StudentConfig
from rknn_ray.student.stage import train_on_labels
from rknn_ray.rng import make_generator

NEIGHBOUR_ADD_REMOVE = "add-remove-one"
NEIGHBOUR_LABEL = "change-one-query-label"


# ----------------------------------------------------------------------------- data

@dataclass
class BaselineSetup:
    """The run's data in the representation space (everything public-fitted)."""
    cfg: object
    data: object                 # rknn_ray.data.prepared.PreparedData
    encoder: object
    public_emb: np.ndarray       # (N_pub, D)
    queries: object              # rknn_ray.labeling.queries.QuerySet: the s points every method labels
    private_emb: np.ndarray      # (m, D) private records, embedded with the public encoder
    eval_emb: np.ndarray         # (N_eval, D)
    seconds: float = 0.0
    # where FedMD-NFDP's parties run: a host class (rknn_ray.baselines.nfdp.InProcessParties
    # when None) over ``party_shards`` groups; the job injects Ray actors, the library has none
    party_hosts: object = None
    party_shards: int = 2

    @classmethod
    def from_stages(cls, st, seconds: float = 0.0) -> "BaselineSetup":
        """The setup of a run's prepared stages (``rknn_ray.job.stages.Stages``: data, encoder,
        queries; the job layer prepares them, rknn_ray.job.baselines.prepare_baseline), its
        private and evaluation records embedded with the public encoder."""
        st.data.require_private_rows("a baseline")
        sp = st.data.splits
        return cls(st.cfg, st.data, st.encoder, st.public_emb, st.queries,
                   st.encoder.transform(sp.private_x), st.encoder.transform(sp.eval_x), seconds)

    @property
    def num_classes(self) -> int:
        return int(self.data.num_classes)

    @property
    def splits(self):
        return self.data.splits

    @property
    def query_emb(self) -> np.ndarray:
        return self.public_emb[self.queries.public_index]

    @property
    def query_truth(self) -> np.ndarray:
        """Public ground truth of the queries: measurement only, never trains."""
        return self.splits.public_y[self.queries.public_index]


# ----------------------------------------------------------------------------- accounting

def calibrate_decreasing(eps_of, target: float, lo: float = 1e-3, hi: float = 1e4,
                         iters: int = 60, rel_tol: float = 1e-6) -> float:
    """Smallest noise ``x`` in [lo, hi] with ``eps_of(x) <= target`` (eps_of decreasing in x),
    to within a factor ``1 + rel_tol``.

    Bisection in log space; the returned ``x`` always satisfies the target (it is the
    upper end of the final bracket), so a calibrated mechanism never overspends. It stops
    once the bracket is ``rel_tol`` wide: every halving is a full RDP evaluation, and
    halvings past that width buy nothing a release could notice.
    """
    if eps_of(hi) > target:
        raise ValueError(f"even noise {hi:g} gives eps {eps_of(hi):.4g} > target {target:g}")
    if eps_of(lo) <= target:
        return lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        if b - a <= rel_tol:                # log-space width = relative width of the bracket
            break
        m = 0.5 * (a + b)
        if eps_of(math.exp(m)) <= target:
            b = m
        else:
            a = m
    return math.exp(b)


def new_ledger(accountant: str = "basic") -> PrivacyLedger:
    return PrivacyLedger(accountant=accountant)


# ----------------------------------------------------------------------------- small models

@dataclass
class LinearModels:
    """``G`` independent softmax classifiers (optionally one hidden ReLU layer)."""
    params: list                  # torch tensors, leading dim G
    hidden: int = 0

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, D) shared or (G, N, D) per model -> (G, N, C)."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.params[0].shape[0], -1, -1)
        if self.hidden:
            w1, b1, w2, b2 = self.params
            h = torch.relu(torch.bmm(x, w1) + b1[:, None, :])
            return torch.bmm(h, w2) + b2[:, None, :]
        w, b = self.params
        return torch.bmm(x, w) + b[:, None, :]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.softmax(self.logits(_writable_tensor(x)), -1).numpy()

    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.logits(_writable_tensor(x)).numpy()


def init_models(groups: int, dim: int, num_classes: int, hidden: int = 0,
                seed: int = 0) -> LinearModels:
    g = torch.Generator().manual_seed(int(seed))
    if hidden:
        params = [torch.randn(groups, dim, hidden, generator=g) * (1.0 / math.sqrt(dim)),
                  torch.zeros(groups, hidden),
                  torch.randn(groups, hidden, num_classes, generator=g) * (1.0 / math.sqrt(hidden)),
                  torch.zeros(groups, num_classes)]
    else:
        params = [torch.zeros(groups, dim, num_classes), torch.zeros(groups, num_classes)]
    return LinearModels([p.requires_grad_(True) for p in params], hidden)


def pad_groups(xs: list[np.ndarray], targets: list[np.ndarray], num_classes: int):
    """Stack ragged per-model data into (G, n_max, D), (G, n_max, C) soft targets, (G, n_max) mask."""
    g = len(xs)
    n_max = max(1, max(len(x) for x in xs))
    dim = xs[0].shape[1] if xs and xs[0].ndim == 2 else 0
    X = np.zeros((g, n_max, dim), np.float32)
    T = np.zeros((g, n_max, num_classes), np.float32)
    M = np.zeros((g, n_max), np.float32)
    for i, (x, t) in enumerate(zip(xs, targets)):
        n = len(x)
        if n == 0:
            continue
        X[i, :n] = x
        t = np.asarray(t)
        T[i, :n] = np.eye(num_classes, dtype=np.float32)[t] if t.ndim == 1 else t
        M[i, :n] = 1.0
    return X, T, M


def fit_models(models: LinearModels, X: np.ndarray, T: np.ndarray, M: np.ndarray,
               steps: int = 200, lr: float = 0.05, weight_decay: float = 1e-3) -> LinearModels:
    """Full-batch Adam on the masked soft-target cross-entropy of every model at once."""
    x = torch.as_tensor(X)
    t = torch.as_tensor(T)
    m = torch.as_tensor(M)
    denom = m.sum(1).clamp_min(1.0)
    opt = torch.optim.Adam(models.params, lr=lr)
    for _ in range(int(steps)):
        opt.zero_grad()
        logp = torch.log_softmax(models.logits(x), -1)
        per_model = -((t * logp).sum(-1) * m).sum(1) / denom
        reg = sum((p ** 2).sum() for p in models.params[::2]) * weight_decay
        (per_model.sum() + reg).backward()
        opt.step()
    return models


def fit_classifiers(xs, ys, num_classes: int, hidden: int = 0, steps: int = 200,
                    lr: float = 0.05, weight_decay: float = 1e-3, seed: int = 0) -> LinearModels:
    """One classifier per (x, y) pair (labels (n,) or soft (n, C)), trained together."""
    X, T, M = pad_groups(xs, ys, num_classes)
    models = init_models(len(xs), X.shape[2], num_classes, hidden, seed)
    return fit_models(models, X, T, M, steps, lr, weight_decay)


# ----------------------------------------------------------------------------- result

@dataclass(frozen=True)
class BaselineRow(ReportRow):
    """A baseline's row: the report-row schema every experiment's rows hold (``model`` and
    ``mechanism`` of its release, the ledger's eps and delta, unit, neighbour, accuracies,
    rounds, ``bytes_per_client``), the comparison's own keys (``method``, ``target_eps``,
    ``wall_s``), ``details``: the release's parameters, which go beside the table
    (ledgers.json), never into it, and ``diagnostics``: NOT PRIVATE figures computed from the
    exact private votes (e.g. the noiseless plurality's accuracy), which only a run that asked
    for simulation diagnostics writes, into its diagnostics/ folder."""
    method: str = ""
    target_eps: float | None = None
    wall_s: float = NAN
    details: dict = field(default_factory=dict, compare=False)
    diagnostics: dict = field(default_factory=dict, compare=False)

    def table_fields(self) -> dict:
        """The row as a table holds it: everything but ``details`` and ``diagnostics``."""
        d = self.to_dict()
        d.pop("details")
        d.pop("diagnostics")
        return d


def baseline_row(setup: BaselineSetup, ledger: PrivacyLedger, method: str, target_eps: float,
                 t0: float, **fields) -> BaselineRow:
    """The row of a baseline run that started at ``t0`` (perf_counter): eps and delta are what
    ``ledger`` reports for everything the run released, ``model`` and ``mechanism`` those of
    its release; ``fields`` are the rest (accuracy, unit, rounds, details, ...)."""
    entries = ledger.to_dict()["entries"]
    eps, delta = ledger.spent()
    return BaselineRow(method=method, dataset=setup.data.dataset, target_eps=target_eps,
                       eps=eps, delta=delta, model=entries[0]["model"],
                       mechanism=entries[0]["mechanism"], ledger_events=len(entries),
                       wall_s=time.perf_counter() - t0, **fields)


def record(ledger: PrivacyLedger, event, costing: Costing, model: str, mechanism: str, unit: str,
           neighbour: str, note: str, n: int | None = None, round_id: int = 0, **extra):
    """Record one release: its guarantee is the accountant's cost of ``event`` under
    ``costing`` (recorded with it), never a number computed beside it. Returns the entry."""
    guarantee = Guarantee(event, model, mechanism, unit=unit, neighbour=neighbour, n=n,
                          note=note, accounting=costing)
    return ledger.record(guarantee, round_id=round_id, **extra)


def student_from_query_counts(setup: BaselineSetup, counts: np.ndarray, epochs: int | None = None,
                              seed: int | None = None) -> tuple[float, float, object]:
    """Labels from per-query (noisy) counts or scores -> public set -> the project's student.

    Returns (student test accuracy, label accuracy on the public set, Labeling).
    """
    cfg = setup.cfg
    lab = derive_labels(np.asarray(counts, dtype=np.float64), setup.queries,
                        setup.splits.public_y, cfg.labels.type)
    # the student reverse k-NN trains (on images, or with student.input: features an MLP on
    # the public encoder's features), with the baseline's epochs and seed, in this process
    scfg = dataclasses.replace(StudentConfig.from_config(cfg), num_workers=1, use_gpu=False,
                               epochs=int(epochs or cfg.student.epochs),
                               seed=cfg.run.seed if seed is None else seed)
    _, res = train_on_labels(cfg, setup.data, setup.encoder, lab, None, setup.queries,
                             setup.public_emb, student=scfg)
    return float(res.test_accuracy), float(lab.label_accuracy), lab


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float64)[np.asarray(labels, dtype=np.int64)]


def vote_histogram(votes: np.ndarray, num_classes: int) -> np.ndarray:
    """(T, Q) integer votes -> (Q, C) counts."""
    q = votes.shape[1]
    h = np.zeros((q, num_classes), np.float64)
    for t in range(votes.shape[0]):
        h[np.arange(q), votes[t]] += 1
    return h


def _writable_tensor(x: np.ndarray) -> torch.Tensor:
    """float32 tensor of ``x``; arrays from Ray's object store are read-only (zero-copy), and
    torch warns on those, so they are copied, and only they."""
    return torch.from_numpy(np.require(x, dtype=np.float32, requirements=["W", "C"]))


def privacy_generator(setup: "BaselineSetup", stream: int, seed: int | None = None):
    """The generator for a baseline's *privacy* randomness (noise, subsampling, randomized
    response): ChaCha20 keyed from the OS CSPRNG under ``run.rng: secure`` (the default),
    as every release of the project; a ``stream``-offset seeded one only when the config
    asked for a seeded simulation (``run.rng: seeded``, NOT PRIVATE). Model initialization
    and the order of training batches stay seeded: no guarantee rests on them (DP-SGD's
    Poisson subsampling does, and draws from this generator)."""
    base = setup.cfg.run.seed if seed is None else seed
    return make_generator(setup.cfg.run.rng, int(base) + int(stream))
