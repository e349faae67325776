"""Watching a fit: the progress bar, the HTML report, MLflow tracking and the cost model behind ``advise``.

May import :mod:`..config`, :mod:`..runtime` and the shared side; never :mod:`..fit` or :mod:`..api`.
"""
