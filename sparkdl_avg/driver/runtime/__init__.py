"""Spark itself, from the driver: the engine (classic session or Spark Connect), job labels, log filters, warm-up and the executors' check.

May import :mod:`..config`, the shared side and (lazily, to warm workers) :mod:`sparkdl_avg.executor`.

Its other modules:

* :mod:`.preflight`: a check, before training, that executors can run the trainer's code.
* :mod:`.inprocess`: the in-process engine: a fit's rounds in the calling process without Spark, for tests of the
  arithmetic.
"""
