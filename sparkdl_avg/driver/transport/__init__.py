"""How state goes out to a round's workers and their sums come back: the aggregation paths and the residual/local-state ledger.

May import :mod:`..runtime` (the Spark engine), :mod:`..config` and the shared side's
wire formats (:mod:`sparkdl_avg.shared.wire`); never :mod:`..fit` or :mod:`..api`.
"""
