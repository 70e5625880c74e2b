"""Private / public / evaluation splits: the paper's, and a seeded stratified one.

Paper 000 (Sec. "Experiments", same text in 002):

* MNIST-style (MNIST, Fashion-MNIST): private = the whole training set; public =
  5,000 of the 10,000 test images; evaluation = the other 5,000. Here: public is a
  seeded random half of the test set (``public_size`` overrides), eval the rest.
* SVHN: private = train (+ extra, when loaded with ``include_extra=True``); eval =
  1,000 test images; public = the rest of test. The paper writes "26k public + 1k
  eval", which exceeds the 26,032 test images; we keep the stated 1,000 for
  evaluation and make all remaining 25,032 public.
* CIFAR-10: public = 30,000 of the 50,000 training images; eval = 1,000 test
  images; private = "the other 29,000", i.e. the remaining 20,000 training images
  plus the remaining 9,000 test images (the only reading in which the sizes add up).
* digits and synthetic (one pool, no official test set): rule "stratified".

Rule "stratified" (any data set): pool train and test, then per class 60 % private,
20 % public, 20 % eval (largest-remainder rounding, seeded). Why: the private side
needs most records (label-count gaps grow with |D_priv| / s), the public side must
hold enough samples to cluster into s queries and train a student, and 20 % of
1,797 digits (~360) measures accuracy to about +-2 points. Stratifying keeps every
class in every part even for small pools.

The public labels are ground truth kept only to *measure* label accuracy; nothing
may train on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rknn_ray.errors import ConfigError
from rknn_ray.data.readers import Dataset
from rknn_ray.rng import seeded_generator
from rknn_ray.data.registry import kinds

RULES = ("paper", "stratified")
STRATIFIED_FRACTIONS = (0.6, 0.2, 0.2)  # private, public, eval
RULE_TEXT = {
    "mnist": "private = all train; public = seeded random half of test (5,000 of 10,000); eval = other half",
    "svhn": "private = train (+extra if loaded); eval = seeded 1,000 of test; public = rest of test",
    "cifar10": "public = seeded 30,000 of train; eval = seeded 1,000 of test; "
               "private = rest of train + rest of test (29,000)",
    "stratified": "pool train+test; per class 60% private / 20% public / 20% eval, seeded",
    "table": "the user's own parts (data.private / public / evaluation), as given",
}


@dataclass
class Splits:
    """The three disjoint parts. ``*_index`` are positions in ``concat(train, test)``.

    Arrays may share memory with the Dataset (the MNIST/SVHN private part *is*
    ``train_x``): treat them as read-only.
    """
    dataset: str
    rule: str
    seed: int
    private_x: np.ndarray
    private_y: np.ndarray
    public_x: np.ndarray
    public_y: np.ndarray     # ground truth: measures label accuracy only, never trains
    eval_x: np.ndarray
    eval_y: np.ndarray
    num_classes: int
    image_shape: tuple
    private_index: np.ndarray = field(repr=False, default=None)
    public_index: np.ndarray = field(repr=False, default=None)
    eval_index: np.ndarray = field(repr=False, default=None)
    public_ids: np.ndarray | None = None     # the user's public row ids (None: row numbers)
    class_names: tuple | None = None         # declared class names, in label-index order
    #: a user's table: how a raw row becomes a model input (public facts only: the fitted
    #: Featurizer.to_dict(), the id and label column names); saved as predictor.json
    table_input: dict | None = field(repr=False, default=None)

    def describe(self) -> dict:
        """Sizes and the rule, for report.json."""
        return {"dataset": self.dataset, "rule": self.rule, "rule_text": RULE_TEXT[self.rule],
                "seed": int(self.seed), "private": int(len(self.private_y)),
                "public": int(len(self.public_y)), "eval": int(len(self.eval_y)),
                "num_classes": int(self.num_classes), "image_shape": list(self.image_shape)}


def paper_rule(name: str) -> str:
    """The split 'paper' means for data set ``name`` (its registry entry's; else stratified)."""
    kind = kinds().get(name)
    return kind.paper_split if kind is not None else "stratified"


def _check_size(key: str, value, low: int, high: int, what: str) -> int:
    if value is None:
        return None
    if int(value) != value or not low <= value <= high:
        raise ConfigError(key, f"must be an integer in [{low}, {high}] ({what}), got {value!r}",
                          f"set {key} between {low} and {high}")
    return int(value)


def allocate(counts: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` over classes proportionally to ``counts`` (largest remainder, capped)."""
    n = counts.sum()
    quota = counts * (total / n) if n else np.zeros(len(counts))
    base = np.minimum(np.floor(quota).astype(np.int64), counts)
    short = total - base.sum()
    if short > 0:
        room = counts - base
        order = np.lexsort((np.arange(len(counts)), -(quota - np.floor(quota))))
        order = order[room[order] > 0]
        # one extra per class in remainder order; repeat if the cap left a deficit
        while short > 0 and len(order):
            take = order[:short]
            base[take] += 1
            short -= len(take)
            order = order[(counts - base)[order] > 0]
    return base


def stratified_parts(y: np.ndarray, n_public: int, n_eval: int, rng) -> tuple:
    """(private, public, eval) index arrays into ``y``; each class split in proportion."""
    classes, counts = np.unique(y, return_counts=True)
    pub_c = allocate(counts, n_public)
    eval_c = allocate(counts - pub_c, n_eval)
    perm = rng.permutation(len(y))
    grouped = perm[np.argsort(y[perm], kind="stable")]      # by class, random within class
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    cls = np.repeat(np.arange(len(classes)), counts)
    rank = np.arange(len(y)) - starts[cls]
    is_pub = rank < pub_c[cls]
    is_eval = ~is_pub & (rank < (pub_c + eval_c)[cls])
    return (np.sort(grouped[~is_pub & ~is_eval]), np.sort(grouped[is_pub]),
            np.sort(grouped[is_eval]))


def stratified_public_count(n: int) -> int:
    """The public part of a pool of ``n`` records under the rule 'stratified'."""
    return max(1, int(round(n * STRATIFIED_FRACTIONS[1])))


def paper_mnist_public_count(n_test: int) -> int:
    """The public part under the paper's rule for MNIST-style data: half the test set."""
    return n_test // 2


def make_splits(dataset: Dataset, rule: str = "paper", seed: int = 0,
                public_size: int | None = None, eval_size: int | None = None) -> Splits:
    """Split ``dataset`` by ``rule`` ('paper' or 'stratified'); see the module docstring.

    ``public_size`` / ``eval_size`` override the rule's counts (e.g. smaller public
    sets); they must leave every part non-empty.
    """
    if rule not in RULES:
        raise ConfigError("split.rule", f"unknown split rule {rule!r}", f"use one of {RULES}")
    kind = paper_rule(dataset.name) if rule == "paper" else "stratified"
    rng = seeded_generator(seed)
    n_tr, n_te = len(dataset.train_y), len(dataset.test_y)

    if kind == "stratified":
        n = n_tr + n_te
        if n < 3:
            raise ConfigError("dataset", f"{dataset.name} has {n} records; a split needs >= 3",
                              "use a larger data set")
        pub = _check_size("split.public_size", public_size, 1, n - 2, f"{n} records in the pool")
        pub = pub if pub is not None else stratified_public_count(n)
        ev = _check_size("split.eval_size", eval_size, 1, n - pub - 1,
                         f"{n} records, {pub} public, >= 1 private")
        ev = ev if ev is not None else max(1, min(n - pub - 1, int(round(n * STRATIFIED_FRACTIONS[2]))))
        y_all = np.concatenate([dataset.train_y, dataset.test_y])
        priv_i, pub_i, eval_i = stratified_parts(y_all, pub, ev, rng)
    elif kind == "mnist":
        if n_te < 2:
            raise ConfigError("dataset", f"{dataset.name} test set has {n_te} records; "
                              "the paper split needs >= 2", "use the full test files")
        pub = _check_size("split.public_size", public_size, 1, n_te - 1, f"{n_te} test records")
        pub = pub if pub is not None else paper_mnist_public_count(n_te)
        ev = _check_size("split.eval_size", eval_size, 1, n_te - pub, f"{n_te - pub} test records left")
        perm = n_tr + rng.permutation(n_te)
        pub_i, eval_i = np.sort(perm[:pub]), np.sort(perm[pub:pub + ev] if ev else perm[pub:])
        priv_i = np.arange(n_tr)
    elif kind == "svhn":
        ev = _check_size("split.eval_size", eval_size, 1, n_te - 1, f"{n_te} test records")
        ev = ev if ev is not None else 1000
        if ev >= n_te:
            raise ConfigError("split.eval_size", f"the paper's SVHN split keeps {ev} test images for "
                              f"evaluation but the test set has {n_te}",
                              f"pass eval_size < {n_te} (and public_size) for small files")
        pub = _check_size("split.public_size", public_size, 1, n_te - ev, f"{n_te - ev} test records left")
        perm = n_tr + rng.permutation(n_te)
        eval_i = np.sort(perm[:ev])
        pub_i = np.sort(perm[ev:ev + pub] if pub else perm[ev:])
        priv_i = np.arange(n_tr)
    else:  # cifar10
        pub = _check_size("split.public_size", public_size, 1, n_tr - 1, f"{n_tr} train records")
        pub = pub if pub is not None else 30_000
        ev = _check_size("split.eval_size", eval_size, 1, n_te, f"{n_te} test records")
        ev = ev if ev is not None else 1000
        if pub >= n_tr or ev > n_te:
            raise ConfigError("split.public_size", f"the paper's CIFAR-10 split needs {pub} public of "
                              f"{n_tr} train and {ev} eval of {n_te} test images",
                              "pass smaller public_size / eval_size for small files")
        tr_perm, te_perm = rng.permutation(n_tr), n_tr + rng.permutation(n_te)
        pub_i, eval_i = np.sort(tr_perm[:pub]), np.sort(te_perm[:ev])
        priv_i = np.sort(np.concatenate([tr_perm[pub:], te_perm[ev:]]))

    def take(idx):
        if kind in ("mnist", "svhn") and idx is priv_i:
            return dataset.train_x, dataset.train_y            # whole train set: no copy
        tr, te = idx[idx < n_tr], idx[idx >= n_tr] - n_tr
        if len(te) == 0:
            return dataset.train_x[tr], dataset.train_y[tr]
        if len(tr) == 0:
            return dataset.test_x[te], dataset.test_y[te]
        return (np.concatenate([dataset.train_x[tr], dataset.test_x[te]]),
                np.concatenate([dataset.train_y[tr], dataset.test_y[te]]))

    (px, py), (ux, uy), (ex, ey) = take(priv_i), take(pub_i), take(eval_i)
    return Splits(dataset.name, kind, seed, px, py, ux, uy, ex, ey, dataset.num_classes,
                  tuple(dataset.image_shape), priv_i, pub_i, eval_i)


def has_public_labels(splits) -> bool:
    """Whether any public row carries a (measurement-only) label."""
    y = np.asarray(splits.public_y)
    return bool(y.size) and bool((y >= 0).any())


def has_evaluation(splits) -> bool:
    """Whether a labelled evaluation set was given (0 rows: none)."""
    return int(np.asarray(splits.eval_x).shape[0]) > 0
