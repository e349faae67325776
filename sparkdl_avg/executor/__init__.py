"""The executors' side: the bodies of the Spark tasks, in the executors' Python workers.

Code here never imports :mod:`sparkdl_avg.driver` (``tests/test_layering.py``):
an executor's Python needs only this package, :mod:`sparkdl_avg.shared` and the
top-level :mod:`sparkdl_avg.errors`. Tasks receive small picklable task objects
from the driver and hand back records defined in :mod:`sparkdl_avg.shared`.

Its modules:

* :mod:`.arrow_entries`: the ``mapInArrow`` entry points that need no model replica: a task's ids, the
  standing round job's loop, the staging probe.
* :mod:`.daemon`: pySpark's worker daemon, with TensorFlow imported before it forks workers.
* :mod:`.describe`: executor side of the executors' check: a task's description of its Python (what it
  imported, from where).
* :mod:`.overlap`: ``overlap_rounds`` on the executors: a worker's eager start and the own term it keeps for
  its next round.
* :mod:`.predict`: executor side of distributed prediction: the body of the Arrow UDF that adds a model's
  outputs.
* :mod:`.stage_writer`: executor side of staging: the Spark bodies that write a DataFrame's or an RDD's
  partitions as staged files.
* :mod:`.testing`: helpers that make executors misbehave on purpose, for the tests and benchmarks (not for
  training runs).
* :mod:`.warm`: the warm-up's tasks (``sparkdl_avg.warm_up``): make an executor's Python worker ready to
  train.
* :mod:`.worker`: executor-side code: train or evaluate a cached replica on staged examples.
"""
