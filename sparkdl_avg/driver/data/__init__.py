"""The user's data on the driver: data adapters (one per container, in one registry), staging (written once per
fit: DataFrames, arrays and RDDs), the checks a model implies, staging roots and distributed inference.

May import :mod:`..runtime`, :mod:`..config` and the shared side (:mod:`sparkdl_avg.shared.data`);
never :mod:`..fit` or :mod:`..api`.

Its other modules:

* :mod:`.frames`: how a Spark DataFrame is staged: its columns checked against the model, chosen by kind,
  written by one Spark job.
* :mod:`.staging_roots`: the trainers' staging roots: their names, their owners, their creation and deletion,
  and the clean-up of dead ones.
"""
