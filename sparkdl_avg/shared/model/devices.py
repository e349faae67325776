"""Which GPUs a task's replica uses: exactly the ones Spark assigned to the task.

With GPU scheduling on (``spark.executor.resource.gpu.amount`` and
``spark.task.resource.gpu.amount``), Spark hands every task the addresses of
its GPUs (``TaskContext.get().resources()["gpu"].addresses``) but does not
stop TensorFlow from grabbing every GPU of the node, and all its memory. This
module binds the Python worker process to the assigned GPUs by setting
``CUDA_VISIBLE_DEVICES`` before TensorFlow initialises its GPU runtime (the
worker calls :func:`configure_task_devices` before it builds a replica), and
turns on memory growth (``TF_FORCE_GPU_ALLOW_GROWTH``) so that several
replicas can share a GPU (fractional ``spark.task.resource.gpu.amount``).

A process can be bound once: TensorFlow reads ``CUDA_VISIBLE_DEVICES`` when
its GPU runtime starts, and the replica (with its variables on the GPU) is
cached in the reused Python worker. If Spark later gives a task of the same
process other GPUs (possible when an executor has several GPUs and runs
several tasks at once), the process keeps its GPUs and logs a warning once;
one GPU per executor (``spark.executor.resource.gpu.amount=1``) avoids it.

Everything except :func:`configure_task_devices` is a pure function of its
arguments, testable without Spark or a GPU.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping, MutableMapping, Optional, Sequence, Tuple

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
MEMORY_GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_BOUND: Optional[Tuple[str, ...]] = None  # the GPUs this process is bound to
_WARNED: set = set()


@dataclass(frozen=True)
class DeviceBinding:
    """What :func:`configure_task_devices` did for one task.

    Attributes:
        assigned: The GPU addresses Spark assigned to the task (empty: none).
        bound: The GPUs the process uses after the call (``None``: not bound,
            TensorFlow sees whatever the environment allows).
        action: ``"none"`` (no GPU assigned; nothing changed), ``"bind"``
            (first binding of this process), ``"keep"`` (already bound to the
            same GPUs) or ``"mismatch"`` (bound to other GPUs; kept).
    """

    assigned: Tuple[str, ...]
    bound: Optional[Tuple[str, ...]]
    action: str


def assigned_addresses(resources: Optional[Mapping[str, Any]], name: str = "gpu") -> Tuple[str, ...]:
    """The addresses of resource ``name`` in ``TaskContext.resources()``.

    Args:
        resources: ``TaskContext.get().resources()``: a mapping of resource
            name to ``ResourceInformation`` (with ``.addresses``), or to a plain
            sequence of addresses; ``None`` or empty when the task has none.
        name: The resource name. Default ``"gpu"``.

    Returns:
        The addresses as strings, in Spark's order; ``()`` when absent.
    """
    if not resources or name not in resources:
        return ()
    info = resources[name]
    addresses = getattr(info, "addresses", info)
    return tuple(str(a).strip() for a in addresses)


def decide(assigned: Sequence[str], bound: Optional[Sequence[str]]) -> str:
    """The action for a task given its assigned GPUs and the process' binding."""
    if not assigned:
        return "keep" if bound is not None else "none"
    if bound is None:
        return "bind"
    return "keep" if tuple(assigned) == tuple(bound) else "mismatch"


def device_environment(addresses: Sequence[str]) -> dict:
    """The environment variables that restrict TensorFlow to ``addresses``.

    ``CUDA_VISIBLE_DEVICES`` lists the addresses (physical GPU indices, as
    Spark's discovery scripts such as ``getGpusResources.sh`` report them;
    TensorFlow then numbers them ``/GPU:0``, ``/GPU:1``, ...), and memory
    growth lets replicas that share a GPU allocate as they go.
    """
    if not addresses:
        raise ValueError("The 'addresses' parameter must hold at least one GPU address. Got [] instead.")
    return {VISIBLE_DEVICES_ENV: ",".join(addresses), MEMORY_GROWTH_ENV: "true"}


def apply_binding(
    assigned: Sequence[str],
    bound: Optional[Sequence[str]],
    environ: MutableMapping[str, str],
) -> DeviceBinding:
    """Applies :func:`decide` to ``environ``; returns the resulting binding.

    Only ``"bind"`` changes ``environ``: it sets ``CUDA_VISIBLE_DEVICES`` and,
    unless the user set it, ``TF_FORCE_GPU_ALLOW_GROWTH``.
    """
    assigned = tuple(assigned)
    action = decide(assigned, bound)
    if action == "bind":
        env = device_environment(assigned)
        environ[VISIBLE_DEVICES_ENV] = env[VISIBLE_DEVICES_ENV]
        environ.setdefault(MEMORY_GROWTH_ENV, env[MEMORY_GROWTH_ENV])
        return DeviceBinding(assigned, assigned, action)
    return DeviceBinding(assigned, tuple(bound) if bound is not None else None, action)


def configure_task_devices(task_context: Any = None, environ: Optional[MutableMapping[str, str]] = None) -> DeviceBinding:
    """Binds this Python worker to the GPUs Spark assigned to the current task.

    Call before TensorFlow starts its GPU runtime (before the replica is
    built). Outside a Spark task, or when the task has no ``gpu`` resource,
    nothing changes.

    Args:
        task_context: A ``TaskContext``; default ``TaskContext.get()``.
        environ: The environment to change; default ``os.environ``.
    """
    global _BOUND
    if task_context is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
    resources = task_context.resources() if task_context is not None else None
    assigned = assigned_addresses(resources)
    with _LOCK:
        binding = apply_binding(assigned, _BOUND, os.environ if environ is None else environ)
        _BOUND = binding.bound
        if binding.action == "mismatch" and (binding.assigned, binding.bound) not in _WARNED:
            _WARNED.add((binding.assigned, binding.bound))
            log.warning(
                "Spark assigned GPU(s) %s to this task, but this Python worker (pid %d) is bound to GPU(s) %s "
                "since its first task; it keeps using them. Give each executor one GPU "
                "(spark.executor.resource.gpu.amount=1) to make the assignment exact.",
                ",".join(binding.assigned),
                os.getpid(),
                ",".join(binding.bound or ()),
            )
    return binding
