"""The executors' side: the bodies of the Spark tasks, in the executors' Python workers.

Code here never imports :mod:`sparkdl_avg.driver` (``tests/test_layering.py``):
an executor's Python needs only this package, :mod:`sparkdl_avg.shared` and the
top-level :mod:`sparkdl_avg.errors`. Tasks receive small picklable task objects
from the driver and hand back records defined in :mod:`sparkdl_avg.shared`.
"""
