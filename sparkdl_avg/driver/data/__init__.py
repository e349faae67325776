"""The user's data on the driver: checks, staging (written once per fit), staging roots and distributed inference.

May import :mod:`..runtime`, :mod:`..config` and the shared side (:mod:`sparkdl_avg.shared.data`);
never :mod:`..fit` or :mod:`..api`.
"""
