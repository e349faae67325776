"""The Elephas arm's own virtual environment, ``benchmarks/.venv-elephas``.

Elephas 7.3.0 (the newest on PyPI) pins ``tensorflow<2.20``,
``pyspark<=4.0.0``, ``numpy<2`` and Python < 3.13, which cannot live in the
project's venv (TensorFlow 2.21, pyspark 4.x). The suite therefore installs it
into a separate venv and runs the Elephas arm (``benchmarks/elephas_arm.py``)
there as a subprocess. The combination that works on the 2-core dev machine
(Java 17): Python 3.11, ``elephas==7.3.0``, ``tensorflow==2.19.*`` (Keras 3),
``pyspark==4.0.0``.

Usage::

    python benchmarks/elephas_env.py          # create or check; prints the python path

:func:`ensure` returns the venv's python, or ``None`` with a reason when it
cannot be installed (no network to PyPI, no suitable Python, ...), so the
suite can skip the arm with a clear message instead of failing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv-elephas")
PACKAGES = ["elephas==7.3.0", "tensorflow==2.19.*", "pyspark==4.0.0", "numpy<2"]
STAMP = os.path.join(VENV, ".installed-" + "-".join(p.replace("*", "x").replace("<", "lt") for p in PACKAGES))


def _python_candidates():
    """Interpreters Elephas supports (3.9–3.12), this one first."""
    if (3, 9) <= sys.version_info[:2] <= (3, 12):
        yield sys.executable
    for name in ("python3.11", "python3.12", "python3.10", "python3.9", "python3"):
        path = shutil.which(name)
        if path:
            yield path


def _version_ok(python: str) -> bool:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True, text=True, timeout=30,
        ).stdout.split()
        return len(out) == 2 and (3, 9) <= (int(out[0]), int(out[1])) <= (3, 12)
    except Exception:
        return False


def python_path() -> str:
    return os.path.join(VENV, "bin", "python")


def ensure(quiet: bool = True) -> Tuple[Optional[str], str]:
    """Create/complete the venv; return ``(python, "")`` or ``(None, reason)``."""
    py = python_path()
    if os.path.exists(STAMP) and os.path.exists(py):
        return py, ""
    base = next((p for p in _python_candidates() if _version_ok(p)), None)
    if base is None:
        return None, "no Python 3.9-3.12 interpreter found (Elephas 7.3.0 needs one)"
    log = os.path.join(HERE, "results", "elephas-install.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    try:
        with open(log, "w") as f:
            if not os.path.exists(py):
                subprocess.run([base, "-m", "venv", VENV], check=True, stdout=f, stderr=subprocess.STDOUT)
            subprocess.run(
                [py, "-m", "pip", "install", *(["--quiet"] if quiet else []), *PACKAGES],
                check=True, stdout=f, stderr=subprocess.STDOUT,
            )
            # Smoke test: the imports the arm needs.
            subprocess.run(
                [py, "-c", "import elephas.spark_model, pyspark, tensorflow"],
                check=True, stdout=f, stderr=subprocess.STDOUT,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
    except (subprocess.CalledProcessError, OSError) as e:
        tail = ""
        try:
            with open(log) as f:
                tail = "".join(f.readlines()[-5:]).strip()
        except OSError:
            pass
        return None, f"installing {' '.join(PACKAGES)} into {VENV} failed ({e}); see {log}: {tail}"
    open(STAMP, "w").close()
    return py, ""


if __name__ == "__main__":
    python, reason = ensure(quiet=False)
    print(python or f"SKIP: {reason}")
    sys.exit(0 if python else 1)
