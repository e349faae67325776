"""The public surface on the driver: :class:`~.trainer.ParameterAveragingTrainer`, the Spark ML stages, ``advise``, the jobs' plumbing and the MLflow pyfunc.

Modules here are thin: they validate through :mod:`..config` and hand the work to
:mod:`..fit`, :mod:`..data` and :mod:`..observe`. Any driver folder may be imported
from here; no other driver folder imports :mod:`.api` (it is the top of the driver's layers).
"""
