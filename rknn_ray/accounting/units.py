"""The names a guarantee is stated in: trust models, protected units, neighbour relations.

Kept apart from :mod:`.guarantee` (which imports dp_accounting and scipy): the mechanisms
read these names in processes that never cost a release (openers, client shards).
"""

MODELS = ("central", "local", "shuffle")
UNITS = ("record", "client", "label")
NEIGHBOUR_REPLACE_ONE = "replace-one"

#: the largest eps budget a source may be given (`rknn-ray budget set --eps`, and a config's
#: ``privacy.budget_eps``): above it a budget limits nothing (1e300 was taken as given: an
#: unlimited budget by accident)
MAX_BUDGET_EPS = 100.0
