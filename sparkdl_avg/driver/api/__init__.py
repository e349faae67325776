"""The public surface on the driver: :class:`~.trainer.ParameterAveragingTrainer`, the Spark ML stages, ``advise``, the jobs' plumbing and the MLflow pyfunc.

Modules here validate through :mod:`..config` and hand the work to
:mod:`..fit`, :mod:`..data` and :mod:`..observe`. Any driver folder may be imported
from here; no other driver folder imports this one (it is the top of the driver's layers).

Its other modules:

* :mod:`.advisor`: should this model be distributed? :func:`advise` measures the user's model, data and
  cluster, and predicts.
* :mod:`.cli`: plumbing shared by the spark-submit jobs in ``jobs/``: flags, models, data, output directories.
* :mod:`.ml`: spark ML layer: the trainer as an ``Estimator`` and the trained model as a ``Model``.
"""
