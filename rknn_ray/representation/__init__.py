"""Stage 1 of the method: the representation both sides share.

Owns the public encoders (HOG, raw pixels, PCA, SimCLR; :mod:`.represent`, :mod:`.hog`,
:mod:`.contrastive`, :mod:`.augment`) and the :class:`~.encoder.Encoder` interface every
client and the server embed records with. Fitted on public data only, so nothing here ever
sees a private record's label.

May import: the errors, the atomic writers, the training launcher (rknn_ray.training) and
the key declarations its config section is written with (rknn_ray.keyspec; :mod:`.config`)
(``MAY_IMPORT``, checked by tests/test_layers.py); never labeling, mechanisms or the job.
"""
MAY_IMPORT = ("rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.runio", "rknn_ray.training")
