"""Checkpoints: :mod:`.files` writes and reads them atomically; :mod:`.policy` decides when to write one and what a resume restores.

May import :mod:`..config`, :mod:`..algorithms` and the shared side; never :mod:`..fit` or :mod:`..api`.
"""
