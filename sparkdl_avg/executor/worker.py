"""Executor-side code: train or evaluate a cached replica on staged examples.

Nothing here touches driver state. A task receives a small picklable description (:class:`RoundTask` or
:class:`EvalTask`) holding handles to the model and state (broadcasts or files,
:mod:`sparkdl_avg.shared.wire.exchange`), and yields what its result sink makes of its
:class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` (the RDD entry points) or Arrow rows (the ``mapInArrow``
entry points of the Spark SQL round; the standing job's task,
:func:`~sparkdl_avg.executor.arrow_entries.run_standing_rounds`, trains round after round as the driver announces
them). Every function also runs in-process with plain values in place of broadcasts, as the unit tests call it.

The compiled replica is built once per Python worker process and kept in the ``_REPLICAS`` cache, keyed by the model's
fingerprint, so later rounds and fits of the same model only assign weights. The Spark entry points consume their whole
input iterator, which PySpark requires to reuse the worker.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

import numpy as np

from ..errors import WorkerError
from ..shared.model import quiet
from ..shared.errors import remote_errors
from ..shared.wire.aggregation import PartialResult, WeightedArrays, nbytes_of, specs_of, weighted_in_place
from ..shared.model.custom_objects import import_custom_modules
from ..shared.wire.delta_sums import pack_result
from ..shared.model.devices import configure_task_devices
from ..shared.data.example_order import EpochOrder, split_evenly, worker_positions
from ..shared.wire.kept import WorkerRound
from ..shared.wire.local_state import host_names
from ..shared.model.modelspec import ModelSpec, assign_state, state_of
from ..shared.model.tracing import build_training_state
from ..shared.data.staged_dataset import StagedDataset, read_examples
from ..shared.wire.stats import PeakMemory, WorkerRecord
from .arrow_entries import probe_path_batches, run_standing_rounds  # noqa: F401 (their old home)
from .arrow_entries import task_ids as _task_ids

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MAX_REPLICAS = 2
"""Compiled replicas a Python worker keeps (the most recently used). A notebook that re-runs its model cell builds a
new model, a new fingerprint, each time: kept forever, each would grow the worker's memory every fit
(docs/benchmarks/fit_memory.md). Two let a session alternate between two models without rebuilding."""

_REPLICAS: "OrderedDict[str, Any]" = OrderedDict()
_STEP_FUNCTIONS: Dict[tuple, Any] = {}
_LOCK = threading.Lock()
_THREADS_CONFIGURED = False
BUILD_COUNT = 0  # replicas this process has built; reported with each result
_NO_WEIGHTS = np.zeros((0,), np.float32)  # the step function's weights argument for unweighted data


def _value(handle):
    """The value behind a Spark broadcast (or the in-process engine's stand-in) or a stored spec (:class:`~sparkdl_avg.shared.wire.exchange.StoredSpec`), or the value itself."""
    from pyspark.broadcast import Broadcast

    from ..shared.wire.exchange import StoredSpec
    from ..shared.wire.local_broadcast import LocalBroadcast

    return handle.value if isinstance(handle, (Broadcast, LocalBroadcast, StoredSpec)) else handle


def configure_threads() -> None:
    """Sizes TensorFlow's thread pools to the task's CPUs (``spark.task.cpus``).

    Must run before TensorFlow starts its runtime; afterwards TensorFlow refuses and the pools keep their size.
    """
    global _THREADS_CONFIGURED
    if _THREADS_CONFIGURED:
        return
    _THREADS_CONFIGURED = True
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return
    tf = quiet.import_tensorflow()

    cpus = max(1, int(ctx.cpus()))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(cpus)
        tf.config.threading.set_inter_op_parallelism_threads(cpus)
    except RuntimeError:
        pass


def get_replica(spec_handle, fingerprint: str):
    """Returns ``(model, built_now)``, building and caching the replica on first use.

    Keeps the :data:`MAX_REPLICAS` most recently used; building another first frees the least recently used one.
    """
    global BUILD_COUNT
    with _LOCK:
        # The task's Spark-assigned GPUs, before TensorFlow's GPU runtime starts.
        configure_task_devices()
        model = _REPLICAS.get(fingerprint)
        if model is not None:
            _REPLICAS.move_to_end(fingerprint)
            return model, False
        configure_threads()
        spec: ModelSpec = _value(spec_handle)
        import_custom_modules(spec.keras_bytes)  # the user's custom layers (shipped with --py-files)
        while len(_REPLICAS) >= MAX_REPLICAS:
            _evict(next(iter(_REPLICAS)))
        with quiet.filtered_stderr():  # the first model starts TensorFlow's devices (cuInit on CPU-only hosts)
            model = spec.build()  # registers those from the driver's __main__ (shipped in the spec) first
        _REPLICAS[fingerprint] = model
        BUILD_COUNT += 1
        # A reused PySpark worker runs gc.collect() after every task, slow with TensorFlow loaded: freezing the
        # long-lived objects (modules, the replica) keeps those collections cheap.
        gc.freeze()
        return model, True


def _evict(fingerprint: str) -> None:
    """Frees a cached replica and its compiled step functions (under ``_LOCK``).

    The replica was frozen out of the collector's reach (:func:`get_replica`), and a Keras model is full of reference
    cycles: only unfreezing before a collection frees it. (Not ``keras.backend.clear_session``: it also resets the
    global settings the other cached replica was built under.)
    """
    del _REPLICAS[fingerprint]
    for key in [k for k in _STEP_FUNCTIONS if k[0] == fingerprint]:
        del _STEP_FUNCTIONS[key]
    _forget_custom_gradients()
    gc.unfreeze()
    gc.collect()


def _forget_custom_gradients() -> None:
    """Drops the gradient functions ``tf.custom_gradient`` registered while tracing, and the graphs they hold.

    Each trace of a ``tf.custom_gradient`` op (Keras' losses use them) registers a gradient function under a new name
    in TensorFlow's global gradient registry and never removes it; its closure holds the traced graph, so a worker that
    trains a new architecture each fit would grow with every fit (``benchmarks/fit_memory.py --vary``). The registry
    is read only while a function is traced, and none is traced between tasks, so dropping them all is safe: a later
    trace registers its own. Private TensorFlow state: where it is not there, nothing is dropped.
    """
    try:
        from tensorflow.python.framework import ops

        registry = ops._gradient_registry._registry  # noqa: SLF001 - no public way to unregister
    except (ImportError, AttributeError):
        return
    for name in [n for n in registry if isinstance(n, str) and n.startswith("CustomGradient-")]:
        del registry[name]


def _step_key(fingerprint: str, dataset: StagedDataset) -> tuple:
    """The key of a replica's step function in ``_STEP_FUNCTIONS``: the replica and the data's shapes."""
    return (fingerprint, dataset.signature)


def _steps_function(model, fingerprint: str, dataset: StagedDataset):
    """A compiled function that trains ``steps`` minibatches in one call.

    It runs the model's own ``train_step`` (what ``model.fit`` runs, custom overrides included) in a graph loop, which
    saves the per-minibatch Python dispatch of ``train_on_batch`` (a large share of a small CNN's step time:
    docs/benchmarks/cnn.md). It takes one tensor per model input and per output, in the dtype each takes, and the
    sample weights (a tensor, empty when the data has none); cached per replica and data signature, with the number of
    examples left open, so shorter rounds do not retrace.
    """
    import tensorflow as tf

    from ..shared.data.staged_dataset import structure

    key = _step_key(fingerprint, dataset)
    fn = _STEP_FUNCTIONS.get(key)
    if fn is not None:
        return fn
    weighted = dataset.weighted
    # The compiled metrics' variables, created here rather than in the first trace, which TensorFlow would
    # then repeat (two traces instead of one: shared/model/tracing.py).
    build_training_state(model, dataset.x_fields, dataset.y_fields, weighted)

    # One function for both call sites below, traced once (as Keras' own multi-step loop calls its
    # one_step_on_data): calling train_step itself traced the model's step twice.
    one_step = tf.function(model.train_step)
    one_step._omit_frequent_tracing_warning = True

    @tf.function(
        input_signature=[
            [tf.TensorSpec((None, *f.shape), f.dtype) for f in dataset.x_fields],
            [tf.TensorSpec((None, *f.shape), f.dtype) for f in dataset.y_fields],
            tf.TensorSpec((None,), tf.float32),
            tf.TensorSpec((), tf.int32),
            tf.TensorSpec((), tf.int32),
        ]
    )
    def train_steps(xs, ys, weights, steps, batch):
        def minibatch(lo):
            inputs = structure([a[lo : lo + batch] for a in xs])
            labels = structure([a[lo : lo + batch] for a in ys])
            return (inputs, labels, weights[lo : lo + batch]) if weighted else (inputs, labels)

        logs = one_step(minibatch(0))
        for i in tf.range(1, steps):
            logs = one_step(minibatch(i * batch))
        return logs

    # TensorFlow's retracing warning counts traces per code object, across every replica's closure: one trace each,
    # by design, which after five models reads as a retracing bug.
    train_steps._omit_frequent_tracing_warning = True
    _STEP_FUNCTIONS[key] = train_steps
    return train_steps


@contextlib.contextmanager
def naming_failing_rows(model, dataset: StagedDataset, examples, indices: np.ndarray, what: str):
    """Turns a failure of the model on string inputs (bytes a layer cannot decode) into a ``DataError`` naming the row.

    Only for models with a string input, where a layer of the model decodes the data (``tf.io.decode_png``, a
    tokenizer): on an error, each example is run through the model alone until one fails, and the error names its
    input, column and row (its index in the staged data). Other failures pass through unchanged.
    """
    from ..errors import DataError
    from ..shared.data.columns import TEXT
    from ..shared.data.staged_dataset import structure

    try:
        yield
    except Exception as exc:
        text = [k for k, f in enumerate(dataset.x_fields) if f.dtype == TEXT]
        if not text or isinstance(exc, DataError):
            raise
        for i in range(min(len(examples), 4096)):
            try:
                model(structure([x[i: i + 1] for x in examples.xs]), training=False)
            except Exception as row_exc:  # noqa: BLE001 - the example the model cannot take
                k = text[0] if len(text) == 1 else next(
                    (j for j in text if str(examples.xs[j][i]) in str(row_exc)), text[0])
                column = next((c.source for c in dataset.columns if c.name == dataset.x_names[k]), dataset.x_names[k])
                value = repr(examples.xs[k][i].reshape(-1)[0])[:60]
                cause = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(row_exc).__name__}: {row_exc}")  # Keras' bold text
                raise DataError(
                    f"The model failed on row {int(indices[i])} of the {what}: its string input {k} (column "
                    f"{column!r}) holds {value}, which the model's layers cannot take: "
                    f"{remote_errors.one_line(cause)}"
                ) from exc
        raise


@dataclass(frozen=True)
class RoundTask:
    """What every worker of one round needs (pickled into the round's closure).

    Attributes:
        spec: The :class:`ModelSpec`: a broadcast, a :class:`~sparkdl_avg.shared.wire.exchange.StoredSpec` or the spec.
        fingerprint: ``spec.fingerprint``, to find a cached replica without reading the spec.
        state: Where the round's ``(weights, optimizer_variables)`` are: a state source of
            :mod:`sparkdl_avg.shared.wire.exchange` (its ``load()``).
        results: How the worker hands back its sums: a result sink of :mod:`sparkdl_avg.shared.wire.exchange`
            (its ``deliver()``).
        dataset: The staged training data.
        epoch: 0-based.
        round: 0-based, within the epoch.
        steps_before: Minibatches per worker in this epoch's earlier rounds.
        steps: Minibatches each worker trains this round (``k``).
        num_workers: Workers in the round (``N``).
        batch_size: Examples per minibatch (``B``).
        seed: The run's seed (data order).
        shuffle: Whether the epoch visits examples in shuffled order.
        average_optimizer: Whether to return the optimizer variables for averaging.
        skip_nonfinite: A worker whose loss or weights are not finite leaves itself out of the average (returns no
            examples) instead of returning NaN sums; either way its record says ``finite: False``.
        slot: In the stale-synchronous and asynchronous modes (:mod:`sparkdl_avg.driver.fit.stale_async`), the
            driver's worker that runs this chunk (its data is worker ``i``'s of round ``round``); ``None`` in
            synchronous rounds, where the two are the same.
        start: Elastic rounds: the epoch position of the round's first example
            (:func:`~sparkdl_avg.shared.data.example_order.worker_positions`); ``None``: from ``steps_before``, every
            round of the epoch having had ``num_workers``.
        kept: What each worker keeps between rounds, one :class:`~sparkdl_avg.shared.wire.kept.Kept` per kind
            (error feedback's residuals, ``optimizer_state="local"``'s states, ``overlap_rounds``' own terms,
            ``sync_fragments``' own weights), in the kinds' order; empty: none.
    """

    spec: Any
    fingerprint: str
    state: Any
    results: Any
    dataset: StagedDataset
    epoch: int
    round: int
    steps_before: int
    steps: int
    num_workers: int
    batch_size: int
    seed: int
    shuffle: bool
    average_optimizer: bool
    skip_nonfinite: bool = False
    slot: Any = None
    start: Optional[int] = None
    kept: Tuple[Any, ...] = ()


def seed_replica(model, seed: int, epoch: int, round: int, worker: int) -> None:  # noqa: A002
    """Sets the state of the replica's random generators (dropout, noise layers) for one task.

    The state follows from ``(seed, epoch, round, worker)`` alone, not from what the cached replica trained before,
    so a task Spark retries on another Python worker draws the same numbers.
    """
    from ..shared.data.example_order import epoch_key

    generators = [v for v in model.variables if v.path.endswith("seed_generator_state")]
    if not generators:
        return
    base = epoch_key(seed, (epoch * 1_000_003 + round) * 10_007 + worker)
    for i, var in enumerate(generators):
        value = np.zeros(var.shape, dtype=var.dtype)
        value.flat[0] = (base + 7919 * i) % (2**31)
        var.assign(value)


def train_round(task: RoundTask, worker: int) -> PartialResult:
    """Trains the replica of ``worker`` for ``task.steps`` minibatches.

    Returns:
        The worker's example-weighted weights, optimizer variables (when averaged) and metric sums, with its record.
    """
    start = time.time()
    memory = PeakMemory()  # this task's peak, whatever earlier fits' tasks in this Python worker reached
    model, built = get_replica(task.spec, task.fingerprint)
    got = time.time()
    weights, opt_vars = task.state.load()
    t_kept = time.time()
    mine = WorkerRound(worker, task.num_workers, weights, opt_vars, weights, opt_vars)
    begun = [k.begin(mine) for k in task.kept]  # what the worker kept: where it starts (shared/wire/kept.py)
    kept_s = time.time() - t_kept
    assign_state(model, mine.start, mine.start_optimizer)
    if not task.kept and getattr(task.results, "deltas", None) is None:
        weights = opt_vars = mine = None  # not read again: a memory map (files) is unmapped, not kept through training
    seed_replica(model, task.seed, task.epoch, task.round, worker)
    ready = time.time()

    order = EpochOrder(task.dataset.num_examples, task.seed, task.epoch, task.shuffle)
    positions = worker_positions(
        task.steps_before, task.steps, worker, task.num_workers, task.batch_size, start=task.start
    )
    examples = read_examples(task.dataset, order.indices(positions.start, positions.stop), seed=task.seed,
                             epoch=task.epoch, training=True, batch_size=task.batch_size)
    loaded = time.time()

    traced = _step_key(task.fingerprint, task.dataset) not in _STEP_FUNCTIONS
    steps_fn = _steps_function(model, task.fingerprint, task.dataset)
    if traced:  # trace apart, to time it (the call below would trace the same function); its first run costs more still
        steps_fn.get_concrete_function()
    trace_s = time.time() - loaded if traced else 0.0
    model.reset_metrics()
    indices = order.indices(positions.start, positions.stop)
    with naming_failing_rows(model, task.dataset, examples, indices, "training data"):
        logs = steps_fn(
            examples.xs,
            examples.ys,
            examples.weights if examples.weights is not None else _NO_WEIGHTS,
            np.int32(task.steps),
            np.int32(task.batch_size),
        )
    n = len(examples)
    # After reset_metrics() the logs are example-weighted running means over the round, so n · mean is its sum.
    sums = {name: float(value) * n for name, value in logs.items()}
    computed = time.time()

    # read from the replica one array at a time (as packed, checked, written), not copied whole first
    new_weights, new_opt = state_of(model)
    finite = bool(np.isfinite(sums.get("loss", 0.0))) and all(np.isfinite(w).all() for w in new_weights)
    if task.kept:  # keeps what its next round reads; may change what it returns
        t_kept = time.time()
        mine.end, mine.end_optimizer, mine.finite = new_weights, new_opt, finite
        for k, b in zip(task.kept, begun):
            k.end(mine, b)
        new_weights, weights = mine.end, mine.sent
        kept_s += time.time() - t_kept
    record = WorkerRecord(
        worker=worker,
        host=socket.gethostname(),
        pid=os.getpid(),
        examples=n,
        start=start,
        end=time.time(),
        setup_s=ready - start,
        load_s=loaded - ready,
        compute_s=computed - loaded,
        replica_built=built,
        replicas_built_by_process=BUILD_COUNT,
        finite=bool(finite),
        loss=sums.get("loss", float("nan")) / n,
        build_s=got - start if built else 0.0,
        import_s=quiet.take_import_s(),
        traced=traced,
        trace_s=trace_s,
        local_state_s=kept_s,
        local_state_restarted=mine is not None and mine.restarted,
        host_names=host_names() if any(k.host_local for k in task.kept) else (),
    )
    deltas = getattr(task.results, "deltas", None)
    if deltas is not None:  # update_compression: the delta from what was sent, encoded (and the residual kept)
        avg = task.average_optimizer
        packed, times = pack_result(deltas, mine.residuals, worker, n, new_weights, new_opt if avg else None,
                                    weights, opt_vars if avg else None, finite)
        record.encode_s, record.feedback_s = times["encode_s"], times["feedback_s"]
        # a sparse-rows round (shared/wire/sparse_rows.py) knows what this worker's delta took; a codec's is fixed
        record.sent_bytes = getattr(packed, "nbytes", deltas.nbytes) if packed is not None else 0
        record.memory_start, record.memory_peak = memory.start, memory.peak()
        record.end = time.time()
        if packed is None:
            return PartialResult(examples=0 if task.skip_nonfinite else n, metric_sums=sums, workers=[record])
        return PartialResult(examples=n, metric_sums=sums, workers=[record], deltas=[(worker, packed)])
    if not finite and task.skip_nonfinite:
        record.memory_start, record.memory_peak = memory.start, memory.peak()
        return PartialResult(examples=0, workers=[record])
    if getattr(task.results, "streams", False):  # a file sink writes each array as it is read from the replica
        weight_sums = WeightedArrays(new_weights, n)
        optimizer_sums = WeightedArrays(new_opt, n) if task.average_optimizer else None
    else:  # pickled or flattened whole: each a fresh copy, scaled in place (no second copy)
        weight_sums = weighted_in_place(list(new_weights), n)
        optimizer_sums = weighted_in_place(list(new_opt), n) if task.average_optimizer else None
    record.sent_bytes = nbytes_of(weight_sums, optimizer_sums)
    record.memory_start, record.memory_peak = memory.start, memory.peak()
    return PartialResult(
        examples=n,
        weight_sums=weight_sums,
        optimizer_sums=optimizer_sums,
        metric_sums=sums,
        workers=[record],
    )


def run_round_partition(task: RoundTask, workers: Iterable[int]) -> Iterator[PartialResult]:
    """``mapPartitions`` body of a training round: one partition per worker id."""
    ids = list(workers)  # consume the whole input so PySpark reuses this worker
    for worker in ids:
        try:
            result = task.results.deliver(train_round(task, worker), f"e{task.epoch}-r{task.round}-w{worker}")
        except Exception as exc:
            raise remote_errors.failure(
                WorkerError,
                f"Worker {worker} failed in epoch {task.epoch}, round {task.round}: "
                f"{type(exc).__name__}: {remote_errors.one_line(str(exc))}",
            ) from exc
        yield result


def run_round_batches(task: RoundTask, batches, entry=None) -> Iterator:
    """``mapInArrow`` body of a Spark SQL round: one task per worker id; yields the sink's Arrow rows.

    ``entry``: the partition body to run (default :func:`run_round_partition`).
    """
    yield from (entry or run_round_partition)(task, _task_ids(batches))


@dataclass(frozen=True)
class EvalTask:
    """What every part of a distributed evaluation needs.

    Attributes:
        spec: The :class:`ModelSpec` (as in :class:`RoundTask`).
        fingerprint: ``spec.fingerprint``.
        state: A state source (:mod:`sparkdl_avg.shared.wire.exchange`) of ``(weights, optimizer_variables)`` to evaluate.
        dataset: The staged evaluation data.
        num_parts: Parts the data is split into (one task each).
        batch_size: Examples per evaluation minibatch.
        what: The data, for messages ("validation data").
    """

    spec: Any
    fingerprint: str
    state: Any
    dataset: StagedDataset
    num_parts: int
    batch_size: int
    what: str = "evaluation data"


def evaluate_part(task: EvalTask, part: int) -> PartialResult:
    """Evaluates the compiled loss and metrics on one contiguous part of the data."""
    start = time.time()
    model, built = get_replica(task.spec, task.fingerprint)
    weights, opt_vars = task.state.load()
    assign_state(model, weights, opt_vars)
    rows = split_evenly(task.dataset.num_examples, task.num_parts)[part]
    examples = read_examples(task.dataset, np.arange(rows.start, rows.stop), batch_size=task.batch_size,
                             what=task.what)
    loaded = time.time()
    sums: Dict[str, float] = {}
    n = len(examples)
    for lo in range(0, n, task.batch_size):
        hi = min(n, lo + task.batch_size)
        data = examples.data(lo, hi)
        with naming_failing_rows(model, task.dataset, examples, np.arange(rows.start, rows.stop), task.what):
            logs = model.test_on_batch(*data[:2], sample_weight=data[2] if len(data) > 2 else None, return_dict=True)
        for name, value in logs.items():
            sums[name] = sums.get(name, 0.0) + float(value) * (hi - lo)
    return PartialResult(
        examples=n,
        metric_sums=sums,
        workers=[
            WorkerRecord(
                worker=part,
                host=socket.gethostname(),
                pid=os.getpid(),
                examples=n,
                start=start,
                end=time.time(),
                load_s=loaded - start,
                replica_built=built,
            )
        ],
    )


def run_eval_batches(task: EvalTask, batches) -> Iterator:
    """``mapInArrow`` body of a Spark SQL evaluation: yields each part's result as JSON (``meta string``)."""
    import pyarrow as pa

    from ..shared.wire.round_rows import encode_meta

    for result in run_eval_partition(task, _task_ids(batches)):
        yield pa.RecordBatch.from_pydict({"meta": [encode_meta(result)]})


def run_eval_partition(task: EvalTask, parts: Iterable[int]) -> Iterator[PartialResult]:
    """``mapPartitions`` body of a distributed evaluation."""
    ids = list(parts)  # consume the whole input so PySpark reuses this worker
    for part in ids:
        try:
            result = evaluate_part(task, part)
        except Exception as exc:
            raise remote_errors.failure(
                WorkerError, f"Worker {part} failed in the evaluation: {type(exc).__name__}: {remote_errors.one_line(str(exc))}"
            ) from exc
        yield result
