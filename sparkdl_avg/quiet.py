"""Keeps TensorFlow's start-up chatter out of the user's output, and nothing else.

TensorFlow's C++ runtime prints lines at import and at its first operation
that look like failures on a machine without a GPU ("Could not find cuda
drivers", "failed call to cuInit") or are only notices (oneDNN's rounding
note, absl's "All log messages before absl::InitializeLog()"); absl prints
them before ``TF_CPP_MIN_LOG_LEVEL`` applies, twice per Python worker. This
module owns hiding exactly those lines: :func:`filtered_stderr` passes every
other line through unchanged, so real errors still show. The cuInit line is
hidden only where no NVIDIA driver is installed (where it is then expected).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Iterator, Pattern, Sequence

_NOISE: Sequence[str] = (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"^I\d{4} .*\] oneDNN custom operations are on\.",
    r"^I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.$",
    r"^E\d{4} .*\] Unable to register cu(DNN|FFT|BLAS) factory",
    r"^W\d{4} .*computation_placer\.cc:\d+\] computation placer already registered",
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

    Everything else written to stderr in the block is passed on, line by
    line, when the line ends or the block ends. Where stderr is not a real
    file descriptor (some notebook kernels), the block runs unfiltered.
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


def import_tensorflow(devices: bool = False):
    """``import tensorflow`` with its start-up notices filtered (see :func:`filtered_stderr`); returns the module.

    Args:
        devices: Also list the physical devices (which initialises CUDA, the
            cuInit notice), for a process that will not pin devices later:
            the driver. Executors pin the task's GPUs first (:mod:`sparkdl_avg.devices`).
    """
    with filtered_stderr():
        import tensorflow

        if devices:
            tensorflow.config.list_physical_devices()
    return tensorflow
