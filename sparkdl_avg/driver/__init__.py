"""The driver's side: what runs in the user's Python process (a spark-submit job, a notebook, a pipeline).

Nothing here runs on executors, and nothing here is imported by
:mod:`sparkdl_avg.executor` or :mod:`sparkdl_avg.shared` (``tests/test_layering.py``).
The public names are re-exported by :mod:`sparkdl_avg`; import them from there.
The folders, one concern each, in the order data flows through a fit:

- :mod:`.api`: the thin public surface (the trainer, the Spark ML stages, ``advise``, the jobs' plumbing);
- :mod:`.config`: the options table and the checks of one configuration;
- :mod:`.data`: the user's data on its way in (adapters, staging, inference);
- :mod:`.fit`: one fit's life (rounds, stale and async chunks);
- :mod:`.algorithms`: update rules and averaging schedules;
- :mod:`.transport`: how state goes out and sums come back (the aggregation paths);
- :mod:`.checkpoint`: checkpoint files and the policy of when to write and what to resume;
- :mod:`.elastic`: how many workers each round has;
- :mod:`.observe`: progress, the report, tracking, the cost model;
- :mod:`.runtime`: the Spark engine (classic or Connect), warm-up, the executors' check.

``sparkdl_avg.driver.ml`` and ``sparkdl_avg.driver.pyfunc`` are kept as shims:
saved Spark ML pipelines and MLflow models record those class paths.
"""
