"""Local model: the shared base of every local randomizer, and randomized response.

Randomized response (paper 000, "Local Private Mechanisms"; Theorem 1) flips each
of the d = s*|Y| bits of a record's flattened answer independently with
probability q = 1 / (e^{eps/(2kr)} + 1). Two valid inputs (kr ones each, whichever
``rknn.connection`` rule chose the k queries: :mod:`rknn_ray.labeling.connection`) differ
in at most 2kr bits, so the likelihood ratio is at most e^{2kr * eps/(2kr)} = e^eps,
reached for two records whose cells are disjoint. q is rounded *up* to a multiple of
2^-53 from an exact lower bound of e^{eps/(2kr)} and each flip is a uniform integer compared
with an integer (:func:`rknn_ray.mechanisms.exact.coin`), so the ratio holds in exact
arithmetic, not only in float64. The report is the flipped bit
vector packed with ``np.packbits`` (ceil(d/8) bytes). The unbiased estimate of a
cell is (bit - q) / (1 - 2q) per report, with variance e'/(e'-1)^2, e' = e^{eps/(2kr)},
whatever the true bit is.

``LocalMechanism`` holds what all local randomizers share: the eps they run at
(``local_eps``, overridable by a shuffle subclass that runs them at an amplified
eps0), clients holding several records (``multi_record``), payload checks,
chunking, the guarantee, and exact per-cell variances from per-client variances.

Clients with several records (``options["multi_record"]``):
* ``sample`` (default): the client picks one of its m_i records uniformly, with
  randomness independent of the data, and randomizes it at eps. The report is a
  mixture of eps-LDP reports, so it is eps-DP for any change of the client's
  records: eps at record level and at client level (a record is even protected at
  ln(1 + (e^eps - 1)/m_i) by sampling; not claimed). The estimate is unbiased for
  the *normalized* sum sum_i A^i / m_i.
* ``normalize``: the client's answer A^i / m_i (L1 norm kr, entries in [0, 1]).
  Any two such vectors are at L1 distance <= 2kr, so sensitivity 2kr serves for
  the whole client (client-level eps; one record moves it by <= 2kr/m_i, so
  record-level eps/m_i <= eps). Laplace perturbs A^i/m_i directly. The 0/1
  randomizers (RR, Collision, Separation, Concatenation) cannot take a
  fractional input: its only unbiased rounding to a valid (kr-hot) input draws
  a vertex with probability 1/m_i each, i.e. samples a record, so for them
  ``normalize`` is exactly ``sample`` (same report, same accounting, same target).
* ``each``: every record the client keeps sends its own report at eps (the job deals each
  kept record to a virtual client of its own: rknn_ray.data.prepared.PreparedData.
  records_as_clients). One record's value changes one report: eps at record level; a
  holder of m records is protected at m * eps (composition over its m reports), at most
  ``data.max_records_per_client`` * eps. The estimate targets the plain sum of every kept
  record's answers, as the central model's; in the shuffle model n is every report opened.
"""
from __future__ import annotations

import functools
import math
from abc import abstractmethod
from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError, DataError, ReportError
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import Mechanism, MechanismParams, MessageBatch
from rknn_ray.mechanisms.exact import COIN_BITS, coin, exp_lower, grid_up

MULTI_RECORD = ("sample", "normalize", "each")
CHUNK_ELEMENTS = 1 << 21   # elements of the largest (clients x cells) working array
# Hash decoding (Collision, Separation, Concatenation) makes several passes over a (reports x
# cells) uint64 array, in place (collision.hash_every_key); at 2^16 elements (512 KiB) the arrays
# stay in cache: 1.2-3.7x faster than the old temporaries at 2^21 (docs/results.md,
# "Decoding"). Bit and integer decoding gain nothing; randomizing keeps CHUNK_ELEMENTS (its
# draws, hence seeded reports, depend on it).
DECODE_CHUNK_ELEMENTS = 1 << 16


class LocalMechanism(Mechanism):
    """Base of the local randomizers: one fixed-length report per client."""

    model = "local"
    name = "abstract-local"
    #: True where the randomizer perturbs A^i / m_i itself (Laplace) rather than a
    #: sampled record.
    takes_fractional_input = False

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        p = params
        if not (math.isfinite(p.eps) and p.eps > 0):
            raise ConfigError("privacy.eps", f"local eps must be finite and > 0, got {p.eps}",
                              "set privacy.eps to a positive number")
        if not (1 <= p.k <= p.num_queries and 1 <= p.r <= p.num_classes):
            raise ConfigError("rknn.k / rknn.r", f"need 1 <= k={p.k} <= s={p.num_queries} and "
                              f"1 <= r={p.r} <= |Y|={p.num_classes}", "lower k or r")
        self.multi_record = p.options.get("multi_record", "sample")
        if self.multi_record not in MULTI_RECORD:
            raise ConfigError("privacy.options.multi_record",
                              f"must be one of {MULTI_RECORD}, got {self.multi_record!r}",
                              "use 'sample' (one record per client) or 'normalize'")

    # ------------------------------------------------------------------ eps and inputs
    @property
    def local_eps(self) -> float:
        """The eps each report satisfies (a shuffle subclass returns its eps0)."""
        return float(self.params.eps)

    def _check_answers(self, answers: RecordAnswers) -> None:
        p = self.params
        got = (answers.num_queries, answers.num_classes, answers.k, answers.r)
        want = (p.num_queries, p.num_classes, p.k, p.r)
        if got != want:
            raise DataError(f"answers have (s, |Y|, k, r) = {got} but the mechanism was "
                            f"calibrated for {want}; calibrate with the answers' shape")

    def client_records(self, answers: RecordAnswers,
                       rng: np.random.Generator) -> tuple[np.ndarray, RecordAnswers]:
        """(client ids, one record per client): the input of a 0/1 randomizer."""
        self._check_answers(answers)
        ids, _, count = answers.clients()
        if count.size and count.max() > 1:
            answers = answers.one_record_per_client(rng)
        return ids, answers

    @staticmethod
    def _chunks(n: int, width: int, elements: int = CHUNK_ELEMENTS):
        step = max(1, elements // max(1, width))
        for a in range(0, n, step):
            yield slice(a, min(n, a + step))

    # ------------------------------------------------------------------ payloads
    def _shape_ok(self, payloads: np.ndarray) -> np.ndarray:
        if payloads.ndim != 2 or payloads.dtype != np.uint8 \
                or payloads.shape[1] != self.message_size:
            return np.zeros(payloads.shape[0] if payloads.ndim else 0, dtype=bool)
        return np.ones(payloads.shape[0], dtype=bool)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        """Rows that decode to a valid report (the server drops and counts the rest)."""
        return self._shape_ok(payloads)

    def _checked(self, payloads: np.ndarray, num_clients: int | None = None) -> np.ndarray:
        payloads = np.asarray(payloads)
        ok = self.well_formed(payloads)
        if not ok.all():
            raise ReportError("malformed", f"{int((~ok).sum())} of {ok.size} {self.name} "
                              f"reports are not valid {self.message_size}-byte rows; drop them "
                              "with well_formed() before estimate()")
        return payloads

    # ------------------------------------------------------------------ variance
    @abstractmethod
    def _class_variances(self) -> dict:
        """Per-report variance of a cell estimate by input class.

        Flat mechanisms: keys 1 (cell in the record) and 0; product mechanisms:
        (a, b) for query-in-record a and label-in-record b.
        """

    def client_fractions(self, answers: RecordAnswers) -> dict:
        """Sums over clients of the fractions F_i = A^i/m_i (and its parts).

        ``S`` (s, |Y|) = sum_i F_i (the estimand), ``SF2`` = sum_i F_i^2,
        ``ST`` (s,) and ``SY`` (|Y|,): sums of query / label fractions, ``n``.
        """
        self._check_answers(answers)
        p = self.params
        _, start, count = answers.clients()
        n = int(count.size)
        client = np.repeat(np.arange(n), count)
        w = 1.0 / np.repeat(count, count)
        cells = answers.flat_cells()
        kr = cells.shape[1]
        S = np.bincount(cells.ravel(), weights=np.repeat(w, kr), minlength=p.num_cells)
        keys, mult = np.unique(client[:, None] * p.num_cells + cells, return_counts=True)
        frac = mult / count[keys // p.num_cells]
        SF2 = np.bincount(keys % p.num_cells, weights=frac ** 2, minlength=p.num_cells)
        ST = np.bincount(answers.neighbors.ravel(), weights=np.repeat(w, p.k),
                         minlength=p.num_queries)
        SY = np.bincount(answers.labels.ravel(), weights=np.repeat(w, p.r),
                         minlength=p.num_classes)
        shape = (p.num_queries, p.num_classes)
        return {"n": n, "S": S.reshape(shape), "SF2": SF2.reshape(shape), "ST": ST, "SY": SY}

    def estimand(self, answers: RecordAnswers) -> np.ndarray:
        """E[estimate]: sum_i A^i / m_i (the plain counts when m_i = 1)."""
        return self.client_fractions(answers)["S"]

    def cell_variance(self, answers: RecordAnswers) -> np.ndarray:
        """Exact Var[estimate] per cell for these answers (sampling variance included)."""
        f = self.client_fractions(answers)
        V, n, S = self._class_variances(), f["n"], f["S"]
        if 1 in V:
            var = S * V[1] + (n - S) * V[0]
        else:
            ST, SY = f["ST"][:, None], f["SY"][None, :]
            var = (S * V[1, 1] + (ST - S) * V[1, 0] + (SY - S) * V[0, 1]
                   + (n - ST - SY + S) * V[0, 0])
        if not self.takes_fractional_input:
            var = var + (S - f["SF2"])       # which record was sampled
        return var

    # ------------------------------------------------------------------ bounds
    def _range(self) -> float:
        """Largest |per-report estimate - its mean| over cells (for Bernstein).

        Bounded randomizers override this; unbounded ones (Laplace) have no range.
        """
        raise ValueError(f"{self.name}: reports are unbounded, so the Bernstein bound does not "
                         "apply; use this mechanism's own error_bound method")

    def _bernstein(self, beta: float, num_clients: int, method: str) -> float:
        from rknn_ray.mechanisms import bounds  # defers scipy
        if method != "bernstein":
            raise ValueError(f"unknown error-bound method {method!r} for {self.name}; "
                             "use 'bernstein' (or 'theorem' where the paper has one)")
        return bounds.bernstein_bound(num_clients, max(self._class_variances().values()),
                                      self._range(), self.params.num_classes, beta)

    # ------------------------------------------------------------------ reporting
    def _multi_record_note(self) -> str:
        if self.multi_record == "each":
            return ("multi_record=each: every kept record sends its own report at eps: eps-DP "
                    "at record level; a holder of m records at m*eps (at most the record "
                    "bound times eps); the estimate targets the sum of every kept record")
        if self.takes_fractional_input and self.multi_record == "normalize":
            return ("multi_record=normalize: each client perturbs A^i/m_i (L1 diameter 2kr), "
                    "so the report is eps-DP at client level and eps/m_i at record level; "
                    "the estimate targets sum_i A^i/m_i")
        how = ("multi_record=normalize on a 0/1 randomizer: the unbiased rounding of A^i/m_i "
               "to a valid input samples one record, so this is the same as 'sample'; "
               if self.multi_record == "normalize" else "multi_record=sample: ")
        return (how + "each client randomizes one uniformly sampled record at eps: eps-DP at "
                "record level and at client level (record level amplified to "
                "ln(1+(e^eps-1)/m_i) by sampling, not claimed); the estimate targets "
                "sum_i A^i/m_i")

    def event(self, n: int | None = None):
        from rknn_ray.accounting.events import LocalRandomizerDpEvent  # defers dp_accounting
        return LocalRandomizerDpEvent(self.name, float(self.local_eps))

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        return {**super().guarantee_facts(event, n),
                "note": f"eps-LDP per report ({self.name}, replace-one record); "
                        + self._multi_record_note()}

    def _facts(self) -> dict:
        return {}

    def describe(self) -> dict:
        p = self.params
        return {**super().describe(), "eps": self.local_eps, "s": p.num_queries,
                "num_classes": p.num_classes, "k": p.k, "r": p.r,
                "messages_per_client": 1, "bytes_per_client": self.message_size,
                "multi_record": self.multi_record,
                "multi_record_accounting": self._multi_record_note(), **self._facts()}


# ---------------------------------------------------------------------- randomized response

@functools.lru_cache(maxsize=256)
def rr_flip_threshold(eps: float, k: int, r: int) -> int:
    """t with q = t / 2^53 the flip probability: the smallest such q >= 1/(e^{eps/(2kr)} + 1),
    from an exact lower bound w of e^{eps/(2kr)}, so (1-q)/q <= w: every bit is at most
    eps/(2kr)-LDP in exact arithmetic (a float q may round the other way)."""
    w = exp_lower(Fraction(eps) / (2 * k * r))
    t = int(grid_up(1 / (1 + w)) * (1 << COIN_BITS))
    if 2 * t >= 1 << COIN_BITS:
        raise ConfigError("privacy.eps", f"eps/(2kr) = {eps / (2 * k * r):.3g} is too small for "
                          "randomized response: the flip probability rounds to 1/2",
                          "raise privacy.eps or lower k, r")
    return t


def rr_flip_probability(eps: float, k: int, r: int) -> float:
    """q ~ 1 / (e^{eps/(2kr)} + 1), rounded up to a multiple of 2^-53 (exact as a float)."""
    return rr_flip_threshold(eps, k, r) / float(1 << COIN_BITS)


def rr_client_variance(eps: float, k: int, r: int) -> float:
    """q(1-q)/(1-2q)^2 (= e'/(e'-1)^2, e' = e^{eps/(2kr)}, but for the rounded q that
    is sampled) per report and cell, whatever the true bit."""
    q = rr_flip_probability(eps, k, r)
    return q * (1 - q) / (1 - 2 * q) ** 2


def rr_output_probability(outputs: np.ndarray, inputs: np.ndarray, q: float) -> np.ndarray:
    """Exact P[output | input] for 0/1 rows: (I, O) = q^H (1-q)^(d-H), H = Hamming."""
    outputs = np.asarray(outputs, dtype=bool)
    inputs = np.asarray(inputs, dtype=bool)
    ham = (inputs[:, None, :] != outputs[None, :, :]).sum(axis=2)
    d = outputs.shape[1]
    return q ** ham * (1 - q) ** (d - ham)


class FlatLocalMechanism(LocalMechanism):
    """A randomizer of the flattened d-cell vector: two variance classes per cell."""

    @abstractmethod
    def flat_variances(self) -> tuple[float, float]:
        """(variance of a cell the record holds, variance of a cell it does not)."""

    def _class_variances(self) -> dict:
        v1, v0 = self.flat_variances()
        return {1: v1, 0: v0}


class RandomizedResponse(FlatLocalMechanism):
    """Per-bit randomized response on the flattened s*|Y| answer (Theorem 1)."""

    name = "rr"

    @property
    def flip_probability(self) -> float:
        """The exact flip probability the sampler uses (a multiple of 2^-53)."""
        return rr_flip_probability(self.local_eps, self.params.k, self.params.r)

    @property
    def message_size(self) -> int:
        return (self.params.num_cells + 7) // 8

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        ids, rec = self.client_records(answers, rng)
        cells, d = rec.flat_cells(), self.params.num_cells
        t = rr_flip_threshold(self.local_eps, self.params.k, self.params.r)
        out = np.empty((len(ids), self.message_size), dtype=np.uint8)
        for sl in self._chunks(len(ids), d):
            bits = coin(rng, t, (sl.stop - sl.start, d))             # flips, P = t / 2^53
            rows = np.arange(sl.stop - sl.start)[:, None]
            bits[rows, cells[sl]] ^= True
            out[sl] = np.packbits(bits, axis=1)
        return MessageBatch(out, ids)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        ok = self._shape_ok(payloads)
        pad = 8 * self.message_size - self.params.num_cells
        if pad and ok.any():
            ok &= (payloads[:, -1] & np.uint8((1 << pad) - 1)) == 0   # padding bits are 0
        return ok

    def _ones(self, payloads: np.ndarray) -> np.ndarray:
        d = self.params.num_cells
        ones = np.zeros(d, dtype=np.int64)
        for sl in self._chunks(payloads.shape[0], d):
            ones += np.unpackbits(payloads[sl], axis=1, count=d).sum(axis=0, dtype=np.int64)
        return ones

    def client_estimates(self, payloads: np.ndarray) -> np.ndarray:
        payloads, q, p = self._checked(payloads), self.flip_probability, self.params
        bits = np.unpackbits(payloads, axis=1, count=p.num_cells)
        return ((bits - q) / (1 - 2 * q)).reshape(-1, p.num_queries, p.num_classes)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Per cell: how many reports have its bit set."""
        return self._ones(self._checked(payloads))

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        q, p = self.flip_probability, self.params
        est = (np.asarray(stat, np.float64) - num_reports * q) / (1 - 2 * q)
        return est.reshape(p.num_queries, p.num_classes)

    def flat_variances(self) -> tuple[float, float]:
        v = rr_client_variance(self.local_eps, self.params.k, self.params.r)
        return v, v

    def _range(self) -> float:
        q = self.flip_probability
        return (1 - q) / (1 - 2 * q)

    def error_bound(self, beta: float, num_clients: int, method: str = "theorem") -> float:
        """Theorem 1 (square root as in its proof and in paper 002), or 'bernstein'."""
        from rknn_ray.mechanisms import bounds  # defers scipy
        if method == "theorem":
            p = self.params
            return bounds.theorem1_bound(self.local_eps, p.k, p.r, p.num_classes,
                                         num_clients, beta)
        return self._bernstein(beta, num_clients, method)

    def _facts(self) -> dict:
        return {"flip_probability": self.flip_probability,
                "eps_per_bit": self.local_eps / (2 * self.params.k * self.params.r),
                "payload": f"{self.params.num_cells} bits, np.packbits (big bit order)"}


@register("local", "rr")
def _build(params: MechanismParams) -> RandomizedResponse:
    return RandomizedResponse(params)
