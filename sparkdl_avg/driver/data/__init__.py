"""The user's data on the driver: data adapters (one per container, in one registry), staging (written once per
fit: DataFrames, arrays and RDDs), the checks a model implies, staging roots and distributed inference.

May import :mod:`..runtime`, :mod:`..config` and the shared side (:mod:`sparkdl_avg.shared.data`);
never :mod:`..fit` or :mod:`..api`.
"""
