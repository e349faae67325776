"""Watching a fit: the progress bar, the HTML report, MLflow tracking and the cost model behind ``advise``.

May import :mod:`..config`, :mod:`..runtime` and the shared side; never :mod:`..fit` or :mod:`..api`.

Its other modules:

* :mod:`.costmodel`: the cost model of an epoch: whether parameter averaging beats one process, from measured
  constants.
* :mod:`.memory`: what memory a fit needs, estimated before its first round, and the refusal of one that
  cannot fit.
* :mod:`.pyfunc`: the MLflow pyfunc model of a fit with a preprocessing function: the function, then the Keras
  model.
"""
