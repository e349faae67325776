"""What memory a fit needs, estimated before its first round, and the refusal of one that cannot fit.

A fit holds, above each process's level before it (measured in
``docs/benchmarks/memory.md``, ``benchmarks/peak_memory.py``):

* **on the driver**: the round's sums (the weights' and, when averaged, the
  optimizer's: ``S`` with Adam and ``optimizer_state="average"``, the weights
  alone otherwise; a fraction of them under ``update_compression``), which
  the update turns into the new state in place, and a few arrays at a time
  beside them (one of the model's, read to publish or to update from, and
  what assigning one to the model allocates). The state it sends is read
  from the model as it is written, not copied whole;
* **on each executor Python worker**: its replica (``S``), one array of the
  received state at a time, and what training allocates (an optimizer's
  dense temporaries: up to about ``S``). Its sums are written to their file
  one array at a time from the replica (``state_transport="files"``; the
  ``spark`` and ``sql`` transports pickle or flatten them whole, a copy of
  them more, which this estimate leaves out).

:func:`estimate` turns a model's state and the fit's options into those two
numbers with the factors below, fitted on those measurements (README's ids
model at two sizes, Adam: close to the driver's, above a worker's);
:func:`check_memory` compares them with the memory there is (the machine's
available memory for ``local[N]``, shared by the driver and its ``N``
workers; ``spark.executor.pyspark.memory`` or else ``spark.executor.memory``
divided among an executor's task slots on a cluster) and refuses a fit that
cannot fit with a :class:`~sparkdl_avg.errors.ConfigurationError` naming the
numbers and what would make it fit, before any Spark job, instead of an
out-of-memory kill minutes later.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

logger = logging.getLogger("sparkdl_avg")

#: Above its level before the fit, the driver holds about this many copies of the round's sums, plus
#: :data:`DRIVER_ARRAY_HEADROOM` of the largest array (the state it sends is read from the model as written).
DRIVER_COPIES = 1.0
#: A worker holds its replica (one copy of the state) and what training allocates, at most
#: :data:`TRAINING_TEMPORARIES` of the state (measured with Adam on an embedding table in keras.Model.fit alone).
WORKER_COPIES = 1.0
TRAINING_TEMPORARIES = 0.75
#: Arrays read or assigned one at a time, and their temporaries: on a worker, and on the driver (which also
#: assigns the new state to the model), in multiples of the largest array. Refitted 2026-12-06 on four models with
#: Adam (an embedding of 2^20, 2^22 and 2^24 + 4 rows, a 1000 → 10,000 dense layer; benchmarks/peak_memory.py): each
#: estimate within 11% of the measured peak above the level before the fit (docs/benchmarks/memory.md).
ARRAY_HEADROOM = 2.5
DRIVER_ARRAY_HEADROOM = 4.5
#: Fixed bytes per process beyond the arrays (buffers, Python objects); small next to a large model. A worker's
#: are more (its traced step function, the staged data's pages: measured on a small model, docs/benchmarks/memory.md).
FIXED_BYTES = 16 << 20
WORKER_FIXED_BYTES = 96 << 20


@dataclass(frozen=True)
class MemoryEstimate:
    """A fit's estimated peak memory above each process's level before it, and the memory there is (bytes).

    Attributes:
        state_bytes: The model's weights and optimizer variables.
        driver_bytes: The driver's estimated peak above its level before the fit.
        worker_bytes: One executor Python worker's.
        workers_per_host: Workers that share one host's (or executor's) memory.
        driver_available: Memory the driver may still take (``None``: not known).
        worker_available: Memory each worker may take (``None``: not known).
        source: Where the available memory was read, for messages.
    """

    state_bytes: int
    driver_bytes: int
    worker_bytes: int
    workers_per_host: int
    driver_available: Optional[int] = None
    worker_available: Optional[int] = None
    source: str = ""

    def problems(self) -> List[str]:
        """What does not fit, in words (empty: it fits, or the memory there is is not known)."""
        out = []
        if self.driver_available is not None and self.driver_bytes > self.driver_available:
            out.append(f"the driver needs about {_gb(self.driver_bytes)} above its level now, "
                       f"{_gb(self.driver_available)} is available")
        if self.worker_available is not None and self.worker_bytes > self.worker_available:
            out.append(f"each of the {self.workers_per_host} workers per host needs about "
                       f"{_gb(self.worker_bytes)}, {_gb(self.worker_available)} is available to each")
        return out


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def estimate(weight_bytes: int, optimizer_bytes: int, largest_array: int, average_optimizer: bool = True,
             local_optimizer: bool = False, compression_ratio: float = 1.0,
             workers_per_host: int = 1) -> MemoryEstimate:
    """The driver's and one worker's peak memory above their levels before the fit (bytes), without the available.

    Args:
        weight_bytes, optimizer_bytes: The model's weights and optimizer variables, as the driver holds them.
        largest_array: The largest of those arrays.
        average_optimizer: Whether the workers send the optimizer's variables to be averaged.
        local_optimizer: ``optimizer_state="local"``: each worker keeps its own optimizer variables
            (the driver sums the weights only, and keeps a copy of the state to take patches against).
        compression_ratio: Bytes of the sums a worker sends over the bytes of plain sums
            (``update_compression``; 1: none).
        workers_per_host: Workers whose memory one host (or executor) holds.
    """
    state = weight_bytes + optimizer_bytes
    summed = weight_bytes + (optimizer_bytes if average_optimizer and not local_optimizer else 0)
    # optimizer variables not averaged: the "spark" transport keeps a copy of the state as last sent, to take the
    # next round's patch against (driver/transport/downlink.py; the patches' broadcasts are the JVM's)
    bases = state if not average_optimizer or local_optimizer else 0
    driver = (DRIVER_COPIES * summed * compression_ratio + bases + DRIVER_ARRAY_HEADROOM * largest_array
              + FIXED_BYTES)
    worker = WORKER_COPIES * state + TRAINING_TEMPORARIES * state + ARRAY_HEADROOM * largest_array + WORKER_FIXED_BYTES
    return MemoryEstimate(state, int(driver), int(worker), max(1, workers_per_host))


def available_memory() -> Optional[int]:
    """This machine's ``MemAvailable`` (bytes; ``None`` where ``/proc/meminfo`` is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def parse_size(text: Optional[str]) -> Optional[int]:
    """Bytes of a JVM-style size (``"4g"``, ``"512m"``, ``"2048k"``; a bare number is MiB, as Spark reads it)."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", str(text).lower())
    if not m:
        return None
    return int(float(m.group(1)) * 1024 ** {"k": 1, "m": 2, "g": 3, "t": 4, "": 2}[m.group(2)])


def with_available(est: MemoryEstimate, engine, num_workers: int) -> MemoryEstimate:
    """``est`` with the memory there is for the driver and each worker of a fit of ``num_workers`` on ``engine``."""
    import dataclasses

    machine = available_memory()
    if engine.one_host:  # local[N]: the driver and every worker share this machine's memory
        workers = max(1, num_workers)
        if machine is None:
            return dataclasses.replace(est, workers_per_host=workers)
        left = machine - est.driver_bytes
        return dataclasses.replace(est, workers_per_host=workers, driver_available=machine,
                                   worker_available=max(0, left) // workers,
                                   source=f"this machine's available memory ({_gb(machine)}), shared by the "
                                          f"driver and its {workers} workers")
    per_executor = parse_size(engine.conf("spark.executor.pyspark.memory"))
    key = "spark.executor.pyspark.memory"
    if per_executor is None:
        per_executor, key = parse_size(engine.conf("spark.executor.memory")), "spark.executor.memory"
    cores = int(engine.conf("spark.executor.cores") or 1)
    task_cpus = int(engine.conf("spark.task.cpus") or 1)
    slots = max(1, min(num_workers, cores // max(1, task_cpus)))
    return dataclasses.replace(
        est, workers_per_host=slots, driver_available=machine,
        worker_available=None if per_executor is None else per_executor // slots,
        source="" if per_executor is None else f"{key}={engine.conf(key)} shared by {slots} task slots")


def _nbytes(v) -> int:
    import numpy as np

    return int(np.prod(v.shape)) * np.dtype(getattr(v.dtype, "name", v.dtype)).itemsize


#: Elements of the stand-in variable an unbuilt optimizer's copy is built on (:func:`_slots_per_element`).
_PROBE_ELEMENTS = 1024


def _slots_per_element(optimizer) -> Optional[Tuple[float, int]]:
    """``(slot elements per trainable element, bytes of the variables it makes whatever the model)`` of an unbuilt
    optimizer, from a copy of it built on one small stand-in variable: Adam's two moments give 2.0. ``None`` where the
    copy cannot be made or built (the optimizer itself is then built)."""
    import numpy as np

    import keras

    try:
        empty = type(optimizer).from_config(optimizer.get_config())
        empty.build([])
        probe = type(optimizer).from_config(optimizer.get_config())
        probe.build([keras.Variable(np.zeros(_PROBE_ELEMENTS, "float32"))])
    except Exception:  # noqa: BLE001 - an optimizer that cannot be copied is measured as it is
        return None
    fixed = sum(_nbytes(v) for v in empty.variables)
    slots = sum(_nbytes(v) for v in probe.variables) - fixed
    return max(0.0, slots / (4.0 * _PROBE_ELEMENTS)), fixed


def model_state_sizes(model) -> Tuple[int, int, int]:
    """``(weight bytes, optimizer variable bytes, largest array bytes)`` of a compiled model, without copying them.

    An optimizer not built yet is not built here: its variables are counted from a copy built on a small stand-in
    (:func:`_slots_per_element`), so a fit too large for memory is refused before the slots are allocated.
    """
    weights = [_nbytes(v) for v in model.weights]
    optimizer = model.optimizer
    if not optimizer.built:
        per = _slots_per_element(optimizer)
        if per is not None:
            ratio, fixed = per
            trainable = [_nbytes(v) for v in model.trainable_variables]
            largest = max(weights + (trainable if ratio > 0 else []), default=0)  # a slot: its variable's size
            return sum(weights), sum(int(ratio * b) for b in trainable) + fixed, largest
        from ...shared.model.modelspec import ensure_optimizer_built

        ensure_optimizer_built(model)
    variables = [_nbytes(v) for v in optimizer.variables]
    return sum(weights), sum(variables), max(weights + variables, default=0)


def check_memory(model, engine, num_workers: int, average_optimizer: bool, local_optimizer: bool,
                 compression_ratio: float = 1.0) -> MemoryEstimate:
    """Estimates the fit's memory (:func:`estimate`, :func:`with_available`); refuses one that cannot fit.

    Raises:
        ConfigurationError: the driver's or a worker's estimate is above the
            memory there is; the message names both and what would make it fit.
    """
    from ...errors import ConfigurationError

    weights, optimizer, largest = model_state_sizes(model)

    def estimated(workers: int, average: bool, local: bool, ratio: float) -> MemoryEstimate:
        return with_available(estimate(weights, optimizer, largest, average, local, ratio), engine, workers)

    est = estimated(num_workers, average_optimizer, local_optimizer, compression_ratio)
    problems = est.problems()
    if not problems:
        return est
    # What would make it fit: each change tried on the estimate, only those that fit offered.
    fixes = []
    fewer = [w for w in range(num_workers - 1, 0, -1)
             if not estimated(w, average_optimizer, local_optimizer, compression_ratio).problems()]
    if fewer and est.workers_per_host > 1:
        fixes.append(f"num_workers={fewer[0]} (fewer workers on a host, each with more of its memory)")
    if not local_optimizer and optimizer and not estimated(num_workers, False, True, compression_ratio).problems():
        fixes.append('optimizer_state="local" (each worker keeps its optimizer variables; only the weights travel '
                     "and are summed on the driver)")
    one = estimated(1, average_optimizer, local_optimizer, compression_ratio)
    need = one.driver_bytes + one.worker_bytes if engine.one_host else one.worker_bytes
    where = "a machine" if engine.one_host else "executors"
    fixes.append(f"{where} with more memory: even one worker needs about {_gb(need)}"
                 + ("" if engine.one_host else " per task slot (spark.executor.pyspark.memory)"))
    raise ConfigurationError(
        f"This fit would not fit in memory: {'; '.join(problems)} ({est.source}). The model's state (weights "
        f"and optimizer variables) is {_gb(est.state_bytes)}; this fit needs about "
        f"{est.driver_bytes / max(1, est.state_bytes):.1f}× it on the driver (the round's sums, and the arrays it "
        f"reads and assigns) and {est.worker_bytes / max(1, est.state_bytes):.1f}× in each worker (its replica and "
        f"training's temporaries) (docs/guides/data.md, memory). What would make it fit: {'; '.join(fixes)}."
    )
