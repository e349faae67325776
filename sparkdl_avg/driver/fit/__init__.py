"""One fit's life on the driver: one synchronous round (state out, the job, the update) and stale/async chunks.

May import :mod:`..algorithms`, :mod:`..transport`, :mod:`..config`, :mod:`..runtime`,
:mod:`..elastic`, :mod:`..observe`, :mod:`..data` and the shared side; never :mod:`..api`.
"""
