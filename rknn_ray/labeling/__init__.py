"""Stages 2-3 of the method: queries, the reverse k-NN vote, and labels from released counts.

Owns choosing the public queries (:mod:`.queries`, k-means and next-round selectors;
:mod:`.adaptive` for uncertainty rounds; :mod:`.autotune` for ``s``/``k`` from public
parameters only), each record's vote into its k nearest queries (:mod:`.rknn`,
:mod:`.answers`: the answer vectors the mechanisms randomize), and turning released counts
into labels (:mod:`.labels`, :mod:`.denoise`).

May import: the errors, the student's trainer (the interim student of uncertainty rounds),
and for its config sections (:mod:`.config`) the key declarations (rknn_ray.keyspec) and
the student's label types (rknn_ray.student.config) (``MAY_IMPORT``, checked by
tests/test_layers.py); never the mechanisms, the accounting or the job, which build on it.
"""
MAY_IMPORT = ("rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.student.config",
              "rknn_ray.student.train")
