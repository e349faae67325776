"""Algorithms on the driver: update rules (how the replicas' average becomes the next weights) and averaging schedules (k per round).

Pure numerics and their parameters: imports only the shared side, :mod:`sparkdl_avg.errors` and Keras
(:mod:`.outer` steps a Keras optimizer). :mod:`.rules` holds the rule registry: a rule class that declares
``names`` is registered, so importing this package registers every built-in rule, ``"outer"`` included.

Its other modules:

* :mod:`.contract`: a user's update rule held to the rules' contract at each call (what its methods return).
* :mod:`.overlap`: ``overlap_rounds``' driver arithmetic: plain averaging applied one round late (eager
  updates).
"""

from . import outer, rules  # noqa: F401  (registers the built-in update rules)
