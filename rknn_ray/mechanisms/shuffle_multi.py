"""Multi-message shuffle model: true messages plus distributed discrete-Laplace noise.

Every message is a (cell, sign) pair packed in 4 bytes: ``cell << 1 | negative``.
A client sends one (cell, +1) message per cell each of its records votes into
(k*r per record) plus its share of the noise: negative-binomial NB(1/n, 1-p)
messages (j, +1) and (j, -1) and NB(r/n, q) flooding pairs per cell j (mean mu/n;
Poisson(mu/n) where Poisson needs fewer, see below).
The n shares of a cell add up to a discrete Laplace DLap(p) on the difference,
so the server's estimate N+_j - N-_j is unbiased with the central discrete
Laplace variance 2p/(1-p)^2.

Noise messages per cell (all clients together; per client divide by m, below): 2p/(1-p)
geometric-share messages plus 2 mu flooding messages. mu is the smallest mean whose exact
PLD (rknn_ray.accounting.multi_message) meets (eps, delta), over Poisson and NB(r)
flooding laws; NB flooding needs ~3x fewer. At eps = 1, delta = 1e-6, k r = 1: 2p/(1-p)
= 3.8 and mu = 192 (NB r = 16; Poisson needed 609), i.e. ~387 messages per cell instead of
~1,222. mu does not depend on n or d (per client it falls as 1/n, grows as d); measured,
it grows about as eps^-0.85 with NB (eps^-1.7 with Poisson) and as (ln 1/delta)^1.7-2 for
both (docs/results.md, "Multi-message noise messages per cell"). These numbers are at the
DLap's default share 0.85 of the per-cell eps (``privacy.options.dlap_share``); with
``queries.s: auto`` under a message cap the job picks the share that allows the most queries
(rknn_ray.mechanisms.stage.free_dlap_shares): 0.55 on Fashion-MNIST at eps = 1, mu = 67
(NB r = 32), at 2.4x the DLap's variance. Calibration, the (eps, delta) statement and its
derivation are in rknn_ray.accounting.multi_message (Ghazi et al., ICML 2021,
arXiv 2109.13158; Ghazi et al., ICML 2020). Guarantee: record level,
replace-one, for the n clients whose noise shares were counted.

The shares are drawn by exact integer samplers (:mod:`rknn_ray.mechanisms.exact`,
ChaCha20 stream): NB with decay rate -ln p (and -ln q) rounded down and Poisson means
rounded up on a 2^-40 grid, i.e. at least the calibrated noise (relative change < 1e-12).

Simulation shortcut (the server's view is unchanged): within one batch of B
clients the per-client shares of a cell are summed exactly -- a sum of B
NB(1/n) is NB(B/n), a sum of B NB(r/n, q) is NB(B r/n, q), a sum of B Poisson(mu/n)
is Poisson(B mu/n) -- and each
noise message is attributed to a uniformly chosen client of the batch. The
multiset the shuffler forwards has exactly the protocol's distribution; only
the per-client split of noise messages (invisible after shuffling) differs.

Clients that drop out take their noise shares with them, so calibration uses
``n_cal = floor(n * (1 - expected_dropout))`` and the shuffler refuses fewer
distinct senders than that.

Corrupt clients (docs/threat-model.md, "Corrupt clients"). A client that sends its true
messages but withholds its noise (or sends garbage the server rejects) removes its
share; with shares of 1/n_cal, ten honest clients out of 1,000 leave 1% of the noise and
most counts exact. So the protocol assumes an honest fraction gamma
(``privacy.honest_fraction``, default 0.5: an honest majority, the usual assumption
of distributed noise generation, e.g. Shi et al., NDSS 2011) and every client sends
the shares of ``m = ceil(gamma * n_cal)`` clients, NB(1/m) and NB(r/m, q): any m
honest clients together add the full DLap(p) and flooding mu, so the guarantee holds
whenever at least m senders follow the protocol; more honest senders only add noise
(post-processing). Below m no guarantee is claimed: h < m honest senders leave
NB(h/m) noise per sign, a fraction h/m of the variance the guarantee needs. The cost
when everyone is honest: n/m times the noise variance (about 1/gamma) and as many
more noise messages.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import (Mechanism, MechanismParams, MessageBatch,
                                     honest_count, honest_fraction_of)
from rknn_ray.mechanisms.central import central_error_bound
from rknn_ray.mechanisms.exact import negative_binomial, noisier_mean, noisier_rate, poisson
from rknn_ray.accounting.multi_message import calibrate_multi_message
from rknn_ray.mechanisms.options import DEFAULT_DLAP_SHARE, option

#: Shares ``queries.s: auto`` tries under a message cap (rknn_ray.job.stages.resolve_auto):
#: a smaller one buys fewer flooding messages per cell, hence more queries, with more noise.
AUTO_DLAP_SHARES = (DEFAULT_DLAP_SHARE, 0.7, 0.55)

MESSAGE_BYTES = 4
CAP_DELTA_SHARE = 1e-3      # share of delta spent on an honest client exceeding the message cap


def noise_message_cap(dlap_p: float, flood_mean_total: float, n: int, num_cells: int,
                      beta: float, flood_shape: float = 0.0) -> int:
    """Smallest M with P[one client's noise messages >= M] <= beta (Chernoff bound).

    ``n`` is the number of clients the noise is split over (m, the honest ones).

    A client's noise messages are X = sum over d cells of NB(1/n, p) + NB(1/n, p) +
    2 F with F ~ Poisson(mu/n): log E[e^{tX}] = d (2/n ln((1-p)/(1-p e^t)) + mu/n
    (e^{2t} - 1)), or F ~ NB(r/n, q) (``flood_shape`` r > 0, q = mu/(mu + r)): the flood
    term is r/n ln((1-q)/(1-q e^{2t})); for t < -ln p (and t < -ln(q)/2),
    P[X >= M] <= exp(log E[e^{tX}] - t M). The admitting party drops a
    sender's messages beyond its allowance; an honest client loses noise only with
    probability <= n beta, which the guarantee adds to delta: with caller's beta =
    cap_failure / ((1 + e^eps) n), capped and uncapped outputs differ by at most
    cap_failure in the (eps, delta) inequality in both directions (composed at another eps
    E, by (1 + e^E) phi, phi <= cap_failure / (1 + e^eps): accountants.cap_failure_mass).
    (The simulation shortcut attributes a batch's noise to uniform clients of the batch: a
    thinning of NB(B/n), lighter-tailed than the protocol's per-client NB(1/n).)
    """
    from scipy import optimize  # defers scipy
    d, log_beta = float(num_cells), math.log(beta)
    t_max = -math.log(dlap_p)
    if flood_shape > 0:
        q = flood_mean_total / (flood_mean_total + flood_shape)
        t_max = min(t_max, -math.log(q) / 2)

    def flood(t):
        if flood_shape > 0:
            return flood_shape / n * math.log((1 - q) / (1 - q * math.exp(2 * t)))
        return flood_mean_total / n * (math.exp(2 * t) - 1)

    def log_mgf(t):
        return d * (2.0 / n * math.log((1 - dlap_p) / (1 - dlap_p * math.exp(t))) + flood(t))

    def m_at(t):
        return (log_mgf(t) - log_beta) / t

    res = optimize.minimize_scalar(m_at, bounds=(1e-9 * t_max, t_max * (1 - 1e-9)),
                                   method="bounded")
    return int(math.ceil(min(res.fun, m_at(t_max / 2))))


def nb_difference_quantile(shape: float, p: float, beta: float) -> int:
    """Smallest t with P[|X - Y| > t] <= beta for independent X, Y ~ NB(shape, p).

    (P[X = k] prop. p^k C(k + shape - 1, k); the pmfs are summed on a grid that holds
    all but 1e-15 of each, and that lost mass is added to the tail.)
    """
    from scipy import stats  # defers scipy
    hi = int(stats.nbinom.isf(1e-15, shape, 1 - p)) + 1
    pmf = stats.nbinom.pmf(np.arange(hi + 1), shape, 1 - p)
    diff = np.convolve(pmf, pmf[::-1])              # P[X - Y = j - hi], j = 0 .. 2 hi
    lost = 2 * max(0.0, 1.0 - float(pmf.sum()))
    tail = np.cumsum(diff[::-1])[::-1]               # P[X - Y >= j - hi]
    for t in range(hi + 1):                          # symmetric: P[|Z| > t] = 2 P[Z >= t + 1]
        if 2 * (tail[hi + t + 1] if hi + t + 1 < tail.size else 0.0) + lost <= beta:
            return t
    return hi


def encode_messages(cells: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """(M,) cells and signs -> (M, 4) uint8 rows."""
    words = (cells.astype(np.uint32) << np.uint32(1)) | negative.astype(np.uint32)
    return words.astype("<u4").view(np.uint8).reshape(-1, MESSAGE_BYTES)


def decode_messages(payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, 4) uint8 rows -> (cells int64, negative bool)."""
    words = np.ascontiguousarray(payloads).view("<u4").reshape(-1).astype(np.int64)
    return words >> 1, (words & 1).astype(bool)


class MultiMessageShuffle(Mechanism):
    name = "multi"
    model = "shuffle"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        if not 0 < params.delta < 1:
            raise ConfigError("privacy.delta", f"the shuffle model needs 0 < delta < 1, got "
                              f"{params.delta}", "set privacy.delta, e.g. 1e-6")
        self.expected_dropout = float(option(params.options, "expected_dropout"))
        self.n_cal = max(1, int(math.floor(params.num_clients * (1 - self.expected_dropout))))
        self.honest_fraction = honest_fraction_of(params, self.name)
        # each client sends the noise share of one of m honest clients (module docstring)
        self.n_honest = max(1, honest_count(self.honest_fraction, self.n_cal))
        # delta = delta_core (the protocol's accounting) + the cap's failure probability
        self.cap_failure = CAP_DELTA_SHARE * params.delta
        share = float(option(params.options, "dlap_share"))
        self.cal = calibrate_multi_message(params.eps, params.delta - self.cap_failure,
                                           self.n_honest, params.sensitivity_l1, params.num_cells,
                                           dlap_share=share)
        # the cap is for one honest client's NB(1/m) shares; the union bound runs over every
        # client that may be honest (all n)
        n_all = max(self.n_cal, int(params.num_clients))
        self.noise_cap = noise_message_cap(self.cal.dlap_p, self.cal.flood_mean_total,
                                           self.n_honest, params.num_cells, self.cap_failure
                                           / ((1 + math.exp(self.cal.eps)) * n_all),
                                           self.cal.flood_shape)
        # exact samplers: NB(B/n, q) with q = e^-rate >= p and Poisson means rounded up
        # (both towards more noise, by < 2^-40 relative; see rknn_ray.mechanisms.exact)
        self.nb_rate = noisier_rate(-math.log(self.cal.dlap_p))
        if self.cal.flood_shape > 0:     # NB(r, q) flooding: q = mu/(mu + r), rate -ln q
            self.flood_rate = noisier_rate(math.log1p(self.cal.flood_shape
                                                      / self.cal.flood_mean_total))

    @property
    def message_size(self) -> int:
        return MESSAGE_BYTES

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        d, cal = self.params.num_cells, self.cal
        true_cells = answers.flat_cells().ravel()
        true_senders = np.repeat(answers.client_ids, answers.k * answers.r)
        ids = np.unique(answers.client_ids)
        share = Fraction(int(ids.size), self.n_honest)      # B / m, exactly
        plus = negative_binomial(rng, share, self.nb_rate, d)
        minus = negative_binomial(rng, share, self.nb_rate, d)
        if cal.flood_shape > 0:
            flood = negative_binomial(rng, share * Fraction(cal.flood_shape), self.flood_rate, d)
        else:
            flood = poisson(rng, noisier_mean(share * Fraction(cal.flood_mean_total)), d)
        cells = np.concatenate([true_cells,
                                np.repeat(np.arange(d), plus + flood),
                                np.repeat(np.arange(d), minus + flood)])
        negative = np.zeros(cells.size, dtype=bool)
        negative[true_cells.size + int((plus + flood).sum()):] = True
        n_noise = cells.size - true_cells.size
        senders = np.concatenate([true_senders, ids[rng.integers(0, ids.size, n_noise)]])
        order = np.argsort(senders, kind="stable")
        return MessageBatch(encode_messages(cells[order], negative[order]), senders[order])

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        if payloads.ndim != 2 or payloads.shape[1] != MESSAGE_BYTES:
            return np.zeros(payloads.shape[0] if payloads.ndim else 0, dtype=bool)
        cells, _ = decode_messages(payloads)
        return cells < self.params.num_cells

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Per cell: (+) messages minus (-) messages (noise and flooding pairs included)."""
        d = self.params.num_cells
        cells, negative = decode_messages(payloads)
        if cells.size and cells.max() >= d:
            raise ValueError("message cell index out of range; drop malformed messages first")
        return (np.bincount(cells[~negative], minlength=d)
                - np.bincount(cells[negative], minlength=d)).astype(np.int64)

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        return np.asarray(stat).reshape(self.params.num_queries,
                                        self.params.num_classes).astype(np.float64)

    def min_senders(self) -> int:
        """Every calibrated noise share must be present: n_cal distinct senders."""
        return self.n_cal

    def messages_per_sender(self) -> int:
        """True messages (k r per record) plus the noise cap (see :func:`noise_message_cap`)."""
        p = self.params
        return int(p.k * p.r * p.max_records_per_client) + self.noise_cap

    def _check_senders(self, n: int) -> None:
        if n < self.n_cal:
            raise PrivacyBudgetError(
                f"only {n} distinct senders were shuffled but the noise was split over "
                f"{self.n_cal}; round refused, nothing released. Set "
                "privacy.options.expected_dropout to the dropout you expect")

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        return {**super().guarantee_facts(event, n, opened),
                "n": int(self.n_cal if n is None else n),
                "note": f"multi-message: NB shares of DLap(p={self.cal.dlap_p:.4g}) "
                        f"over {self.n_honest} clients + {self._flood_law()} flooding "
                        f"(mu={self.cal.flood_mean_total:.4g} pairs/cell); at most "
                        f"{self.messages_per_sender()} messages per sender "
                        f"(noise cap {self.noise_cap}, failure probability "
                        f"{self.cap_failure:.2g} included in delta); holds "
                        f"if at least {self.n_honest} senders follow the "
                        f"protocol (honest fraction {self.honest_fraction:g} "
                        f"of {self.n_cal})"}

    def event(self, n: int | None = None):
        self._check_senders(self.n_cal if n is None else int(n))     # refuses below n_cal
        return self._event()

    def _event(self):
        """The release: the noise of the n_cal calibrated senders (whoever else sends)."""
        from rknn_ray.accounting.events import MultiMessageShuffleDpEvent  # defers dp_accounting
        c = self.cal
        return MultiMessageShuffleDpEvent(c.dlap_p, c.flood_mean_total, self.n_cal,
                                          int(self.params.sensitivity_l1),
                                          int(self.params.num_cells), float(c.delta),
                                          float(self.cap_failure), float(self.honest_fraction),
                                          int(self.n_honest), float(c.flood_shape),
                                          float(c.eps))

    def _flood_law(self) -> str:
        r = self.cal.flood_shape
        return f"NB(r={r:g})" if r > 0 else "Poisson"

    def noise_shape(self, senders: int | None = None) -> float:
        """NB shape of the noise per sign when ``senders`` (default n_cal) all send shares."""
        return (self.n_cal if senders is None else int(senders)) / self.n_honest

    def error_bound(self, beta: float, num_clients: int = 0) -> float:
        """(eta, beta)-accuracy per query when the n_cal calibrated senders all add noise.

        The noise per cell is NB(a, p) - NB(a, p) with a = n_cal / m (more than the
        guarantee needs when gamma < 1); its tail is summed exactly.
        """
        a = self.noise_shape()
        if a <= 1 + 1e-12:             # NB(a <= 1) is stochastically below the geometric
            scale = -1.0 / math.log(self.cal.dlap_p)
            return central_error_bound(scale, self.params.num_classes, beta, "discrete")
        return float(nb_difference_quantile(a, self.cal.dlap_p,
                                            beta / self.params.num_classes))

    def describe(self) -> dict:
        c = self.cal
        a = self.noise_shape()
        return {**super().describe(), "calibration": c.to_dict(),
                "messages_per_client_expected": c.true_messages_per_record
                * self.params.max_records_per_client + c.noise_messages_per_client,
                "bytes_per_message_payload": MESSAGE_BYTES, "n_calibrated": self.n_cal,
                "honest_fraction": self.honest_fraction, "noise_senders": self.n_honest,
                # what the release carries when all n_cal send: a times the needed variance
                "error_variance_all_honest": a * c.error_variance}


register("shuffle", "multi")(MultiMessageShuffle)
