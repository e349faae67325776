"""How state goes out to a round's workers and their sums come back: the state transports, the Spark SQL round's aggregation paths, and the files that chain each worker from round to round.

* :mod:`.base` — the protocol (:class:`~.base.StateTransport`) and the
  settings record a fit's transport is built from (the registries that find
  a transport or an aggregation path by name are the options', which its
  modules fill);
* one module per transport: :mod:`.spark` (broadcast + ``treeAggregate``; its state as bases and patches under
  ``optimizer_state="local"``, :mod:`.downlink`),
  :mod:`.files` (files under the staging directory), :mod:`.sql` (a
  DataFrame job; its aggregation paths in :mod:`.sql_paths`, its standing
  job in :mod:`.standing`, its shard keys in :mod:`.murmur3`);
* :mod:`.policy` — what ``"auto"`` chooses (benchmark-derived) and
  :func:`~.policy.choose`, which builds a fit's transport;
* :mod:`.chains`, :mod:`.feedback`, :mod:`.local_states` — what workers
  keep between rounds (the kinds' protocol and registry, the files chained
  from one round to the next): error feedback's residuals and
  ``optimizer_state="local"``'s optimizer states;
* :mod:`.inprocess` — the in-process engine's transport (the ``"spark"`` transport's, its tree folded in the
  calling process);
* :mod:`.link_rate` — the link's rate, measured from the bytes the workers
  sent, from which ``"auto"`` re-chooses its path.

Importing this package registers the transports and the aggregation paths (its modules below).

May import :mod:`..runtime` (the Spark engine), :mod:`..config` and the shared side's
wire formats (:mod:`sparkdl_avg.shared.wire`); never :mod:`..fit` or :mod:`..api`.
"""

from . import spark, files, sql  # noqa: F401 (registers the transports and the aggregation paths, in the options' order)
