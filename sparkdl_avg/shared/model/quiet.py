"""Keeps TensorFlow's start-up chatter out of the user's output, and nothing else.

TensorFlow's C++ runtime prints lines at import and at its first operation that look like failures on a machine
without a GPU ("Could not find cuda drivers", "failed call to cuInit") or are only notices (oneDNN's rounding note,
absl's "All log messages before absl::InitializeLog()"); absl prints them before ``TF_CPP_MIN_LOG_LEVEL`` applies,
twice per Python worker. This module owns hiding exactly those lines: :func:`filtered_stderr` passes every other line
through unchanged, so real errors still show. The cuInit line is hidden only where no NVIDIA driver is installed
(where it is then expected).

It also owns how an executor's Python imports TensorFlow (:func:`import_tensorflow`): without the optional packages
Keras pulls in at its own import for integrations a Spark task never uses (:data:`EXECUTOR_SKIPPED_IMPORTS`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import re
import sys
import threading
import time
from typing import Iterator, Mapping, Pattern, Sequence

_NOISE: Sequence[str] = (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"^I\d{4} .*\] oneDNN custom operations are on\.",
    r"^I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.$",
    r"^E\d{4} .*\] Unable to register cu(DNN|FFT|BLAS) factory",
    r"^W\d{4} .*computation_placer\.cc:\d+\] computation placer already registered",
    r"^I\d{4} .*cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU instructions",
    r"^To enable the following instructions: .*, rebuild TensorFlow with the appropriate compiler flags\.$",
)
_NO_GPU_NOISE = r"^E\d{4} .*cuda_platform\.cc:\d+\] failed call to cuInit: "


def _patterns() -> Pattern:
    patterns = list(_NOISE)
    if not os.path.exists("/proc/driver/nvidia"):
        patterns.append(_NO_GPU_NOISE)
    return re.compile("|".join(f"(?:{p})" for p in patterns))


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Drops TensorFlow's start-up notices from file descriptor 2 inside the block (C++ writes there directly).

    Everything else written to stderr in the block is passed on, line by line, when the line ends or the block ends.
    Where stderr is not a real file descriptor (some notebook kernels), the block runs unfiltered.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    noise = _patterns()
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                if not noise.search(raw.decode("utf-8", "replace").rstrip("\r\n")):
                    os.write(saved, raw)

    thread = threading.Thread(target=forward, name="sparkdl_avg-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread reads to its end
        thread.join(timeout=5)
        os.close(saved)


IMPORT_S = 0.0
"""Seconds spent importing TensorFlow through :func:`import_tensorflow` (0 where
it was already imported), by the process :data:`IMPORT_PID`: a worker forked from
a daemon inherits the daemon's, and :func:`take_import_s` tells them apart."""
IMPORT_PID = 0

_devices_listed = False

EXECUTOR_SKIPPED_IMPORTS: Sequence[str] = ("sklearn", "matplotlib", "pandas")
"""Packages that an executor's Python worker (and :mod:`sparkdl_avg.daemon`) does not
import while it imports TensorFlow. Keras 3 imports them at its own import, when
installed, only for optional integrations: its scikit-learn wrappers
(``keras.wrappers``, with the scipy.stats and narwhals scikit-learn loads),
``keras.visualization``'s plots (matplotlib) and pandas DataFrames as ``fit``'s
input (``array_slicing``; the executors give Keras arrays and ``tf.data``). Each
import is guarded in Keras (``try: import sklearn except ImportError``), so Keras
loads as where they are not installed. They were a large share of the CPU an
executor spent importing TensorFlow and Keras (docs/benchmarks/first_fit.md), paid
before a session's first round. Only during that import: a user's function may
import them later as usual (only those Keras integrations stay unavailable in the
worker)."""


EXECUTOR_TF_ENVIRONMENT: Mapping[str, str] = {"TF_ENABLE_ONEDNN_OPTS": "1"}
"""Variables an executor's Python worker (and :mod:`sparkdl_avg.daemon`) sets, where the user's environment has not,
before it imports TensorFlow, which reads them only then.

``TF_ENABLE_ONEDNN_OPTS=1``: TensorFlow's oneDNN (MKL-DNN) kernels. TensorFlow turns them on by itself only on CPUs
with AVX-512 VNNI or newer (Intel's since Cascade Lake); elsewhere (AMD EPYC, older Intel) its Eigen kernels run. On
an AMD EPYC, with Eigen's, a whole fit of the benchmarks' CNN took 1.5× as long (docs/benchmarks/cnn.md) and its
inference on one thread 2.7× (docs/benchmarks/inference.md). Rounding differs from Eigen's in the last bits (float32
only; float64 runs on Eigen either way). ``spark.executorEnv.TF_ENABLE_ONEDNN_OPTS=0`` (or the variable in a local
master's environment) keeps TensorFlow's own choice."""


_WORKER_FACTORY_ENV = ("PYTHON_WORKER_FACTORY_SECRET", "PYTHON_UNIX_DOMAIN_ENABLED", "PYTHON_WORKER_FACTORY_SOCK_DIR")
"""Variables Spark's ``PythonWorkerFactory`` gives the executors' Python workers and daemon, and the
driver's Python never has: the secret over TCP, the Unix domain socket's settings without it (Spark 4.1+,
``spark.python.unix.domain.socket.enabled``, in ``RECOMMENDED_CONF``)."""


def on_executor() -> bool:
    """Whether this process is one of PySpark's Python workers or its daemon (:data:`_WORKER_FACTORY_ENV`)."""
    return any(name in os.environ for name in _WORKER_FACTORY_ENV)


class _Skip(importlib.abc.MetaPathFinder):
    """An import finder that reports ``names`` (top-level packages) as not installed."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} is not imported while an executor imports TensorFlow", name=name)
        return None


@contextlib.contextmanager
def _skipping(names: Sequence[str]) -> Iterator[None]:
    """Inside the block, ``import`` of ``names`` not yet imported fails as if they were not installed."""
    names = [n for n in names if n not in sys.modules]
    if not names:
        yield
        return
    finder = _Skip(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow(devices: bool = False):
    """``import tensorflow`` with its start-up notices filtered (see :func:`filtered_stderr`); returns the module.

    The first import's seconds are kept in :data:`IMPORT_S`. On an executor
    (:func:`on_executor`) the import leaves out :data:`EXECUTOR_SKIPPED_IMPORTS` and
    sets :data:`EXECUTOR_TF_ENVIRONMENT` first.

    Args:
        devices: Also list the physical devices (which initialises CUDA, the cuInit notice), once per process, for a
            process that will not pin devices later: the driver. Executors pin the task's GPUs first
            (:mod:`sparkdl_avg.shared.model.devices`).
    """
    global IMPORT_S, IMPORT_PID, _devices_listed
    if "tensorflow" in sys.modules and (_devices_listed or not devices):
        return sys.modules["tensorflow"]
    start = time.perf_counter()
    lean = _skipping(EXECUTOR_SKIPPED_IMPORTS) if on_executor() else contextlib.nullcontext()
    fresh = "tensorflow" not in sys.modules
    if fresh and on_executor():
        for name, value in EXECUTOR_TF_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    with filtered_stderr():
        with lean:
            import tensorflow
            import keras  # noqa: F401 - inside the block too, where TensorFlow left Keras' own import for later

        if fresh:
            IMPORT_S, IMPORT_PID = time.perf_counter() - start, os.getpid()
        if devices:
            tensorflow.config.list_physical_devices()
            _devices_listed = True
    return tensorflow


def take_import_s() -> float:
    """The seconds this process spent importing TensorFlow itself, the first time it is asked; then 0.

    0 also in a process forked after the import (a worker of :mod:`sparkdl_avg.daemon`): the daemon paid it, once.
    """
    global IMPORT_S
    seconds = IMPORT_S if IMPORT_PID == os.getpid() else 0.0
    IMPORT_S = 0.0
    return seconds
