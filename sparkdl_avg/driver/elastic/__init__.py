"""Elastic rounds: how many workers each round has (``min_workers``/``max_workers``), and why.

May import :mod:`..runtime` and the shared side; never :mod:`..fit` or :mod:`..api`.

Its modules:

* :mod:`.membership`: elastic rounds' membership, on the driver: how many workers each round has, and why.
"""
