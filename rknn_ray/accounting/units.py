"""The names a guarantee is stated in: trust models, protected units, neighbour relations.

Kept apart from :mod:`.guarantee` (which imports dp_accounting and scipy): the mechanisms
read these names in processes that never cost a release (openers, client shards).
"""

MODELS = ("central", "local", "shuffle")
UNITS = ("record", "client", "label")
NEIGHBOUR_REPLACE_ONE = "replace-one"
