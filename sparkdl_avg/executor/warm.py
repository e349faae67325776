"""The warm-up's tasks (``sparkdl_avg.warm_up``): make an executor's Python worker ready to train.

Imports TensorFlow and sizes the thread pools; given the model
(``warm_up(spark, model)``), also builds its replica into the worker's cache
and traces its step function, so that a fit's first round does neither.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator, Optional

from ..shared.model import quiet
from ..shared.model.tracing import WarmReplica
from .arrow_entries import task_ids as _task_ids
from .worker import _steps_function, configure_threads, get_replica


def warm_up_partition(ids: Iterable, replica: Optional[WarmReplica] = None) -> Iterator[int]:
    """``mapPartitions`` (and, through :func:`warm_up_batches`, ``mapInArrow``) body of a warm-up task.

    Makes this Python worker ready to train: imports TensorFlow (a no-op
    where the daemon, :mod:`sparkdl_avg.daemon`, already has) and sizes its
    thread pools; given a ``replica`` (``warm_up(spark, model)``), also
    builds it and traces its step function for the data a fit most likely
    stages (:func:`_warm_replica`). Then returns the worker to its pool for
    the fit's tasks. Yields the worker's pid.
    """
    list(ids)  # consume the whole input so PySpark reuses this worker
    configure_threads()
    quiet.take_import_s()  # the warm-up's import, not a fit's: no fit waited for it
    if replica is not None:
        _warm_replica(replica)
    yield os.getpid()


def _warm_replica(replica: WarmReplica) -> None:
    """Builds ``replica``'s model into the cache and traces its step function, as a fit's first round would.

    Nothing is trained: every round sets the replica's whole state (weights,
    optimizer variables, random generators, metrics) before it trains. A
    failure is left to the fit, which builds again and reports it.
    """
    try:
        model, _ = get_replica(replica.spec, replica.spec.fingerprint)
        _steps_function(model, replica.spec.fingerprint, replica.fields).get_concrete_function()
    except Exception:  # noqa: BLE001 - the fit's own first round builds and traces again, and reports
        pass


def warm_up_batches(batches, replica: Optional[WarmReplica] = None) -> Iterator:
    """``mapInArrow`` body of a warm-up task: :func:`warm_up_partition`, one ``pid`` row."""
    import pyarrow as pa

    pids = list(warm_up_partition(_task_ids(batches), replica))
    yield pa.RecordBatch.from_pydict({"pid": pa.array(pids, pa.int64())})
