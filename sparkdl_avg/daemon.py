"""``sparkdl_avg.daemon``, the module named by ``spark.python.daemon.module`` (:data:`sparkdl_avg.DAEMON_MODULE`).

Users' Spark settings name this path, so it never moves; the daemon's code
lives in :mod:`sparkdl_avg.executor.daemon`. Spark runs it as
``python -m sparkdl_avg.daemon``.
"""

from .executor.daemon import main

if __name__ == "__main__":
    main()
