"""PySpark's worker daemon, with TensorFlow imported before it forks workers.

Executors start Python workers by forking them from one daemon process per
Python environment (``spark.python.daemon.module``, default
``pyspark.daemon``). Every new worker then imports TensorFlow and Keras on
its own (seconds: docs/benchmarks.md, "Cold start"), paid by the session's
first fit, by the first ``predict`` (the SQL runner has a pool of its own),
and again after PySpark drops workers idle for a minute. This module owns
importing them once, in the daemon: workers forked from it start with the
modules loaded (shared copy-on-write), so a new worker costs a fork.

Use it with ``spark.python.daemon.module=sparkdl_avg.daemon`` (what
:func:`sparkdl_avg.driver.api.cli.spark_session`, so the jobs, and the notebooks set). Only imports happen
here: TensorFlow's runtime (thread pools, devices) starts in each worker at
its first operation, after the fork, as it does today; a failed import is
reported on stderr and the daemon serves workers as ``pyspark.daemon`` would.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback


def preload() -> None:
    """Imports what every training and inference worker needs, with stdout kept clean.

    The daemon's stdout is its channel to the JVM (it writes its port
    there), so anything an import prints goes to stderr instead.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        from ..shared.model import quiet

        quiet.import_tensorflow()
        import keras  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark.worker  # noqa: F401

        from . import predict, worker  # noqa: F401
    except BaseException:  # the workers will report the same failure where it matters
        print("sparkdl_avg.daemon: preloading failed; workers will import on their own:\n"
              + traceback.format_exc(), file=sys.stderr)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    # Moves what was imported out of the collector's generations: the
    # workers' collections stay cheap and do not touch (and so copy) the
    # daemon's pages.
    gc.freeze()


def quiet_when_killed(worker):
    """PySpark's ``daemon.worker``, returning 1 where the JVM had closed the worker's socket (its task was killed).

    A cancelled job (a Ctrl-C during a fit, :mod:`sparkdl_avg.shared.errors.interrupt`)
    kills its running tasks: the JVM closes their workers' sockets, and each
    worker's last flush then fails. PySpark's daemon printed that
    ``BrokenPipeError`` with a traceback on the executor's stderr (the
    user's console under ``local[N]``) and ended the worker, which is all it
    can do; this ends it the same way (the daemon's "no reuse" path),
    without the traceback.
    """

    def quiet(sock, authenticated):
        try:
            return worker(sock, authenticated)
        except (BrokenPipeError, ConnectionResetError):
            return 1

    return quiet


def main() -> None:
    """Preloads, then runs PySpark's daemon with :func:`quiet_when_killed` workers (``python -m sparkdl_avg.daemon``)."""
    preload()
    from pyspark import daemon

    daemon.worker = quiet_when_killed(daemon.worker)
    daemon.manager()
