#!/usr/bin/env python
"""Builds what executors without sparkdl_avg need (``make dist`` / ``make dist-env``).

Following Spark's Python packaging guide
(https://spark.apache.org/docs/latest/api/python/tutorial/python_packaging.html):

``zip``   ``dist/sparkdl_avg-<version>.zip``: the package's Python files, for
          ``spark-submit --py-files`` (the executors need TensorFlow, Keras,
          numpy, pyarrow and pandas already).
``wheel`` ``dist/sparkdl_avg-<version>-py3-none-any.whl``: for ``pip install``
          on nodes or into an environment.
``env``   ``dist/sparkdl_avg-env.tar.gz``: a virtual environment with the wheel
          and all its dependencies (TensorFlow included: large), packed with
          venv-pack, for ``--archives dist/sparkdl_avg-env.tar.gz#environment``
          with ``PYSPARK_PYTHON=./environment/bin/python``. As with every
          venv-pack archive, its ``bin/python`` links to the interpreter that
          created it, which must exist at the same path on the nodes (or pass
          ``--python-prefix``, e.g. ``/usr``, to relink it).

Usage::

    python scripts/build_dist.py zip wheel          # make dist
    python scripts/build_dist.py env                # make dist-env (minutes, ~1.3 GB)

The functions are also used by the cluster tests, which build a small
environment (``build_env(..., deps=False)``) without the heavy dependencies.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "sparkdl_avg"


def version() -> str:
    with open(os.path.join(ROOT, PACKAGE, "version.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not match:
        raise RuntimeError("no __version__ in sparkdl_avg/version.py")
    return match.group(1)


def build_zip(out_dir: str) -> str:
    """``sparkdl_avg-<version>.zip`` holding ``sparkdl_avg/**.py`` (importable from the zip)."""
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, f"{PACKAGE}-{version()}.zip")
    tmp = target + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        src = os.path.join(ROOT, PACKAGE)
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    zf.write(path, os.path.relpath(path, ROOT))
    os.replace(tmp, target)
    return target


def build_wheel(out_dir: str, python: str = sys.executable) -> str:
    """A pure-Python wheel of the package (no dependencies bundled)."""
    os.makedirs(out_dir, exist_ok=True)
    build = tempfile.mkdtemp(prefix="sparkdl_avg-wheel-")
    try:
        subprocess.run(
            [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", build, ROOT],
            check=True,
        )
        (wheel,) = glob.glob(os.path.join(build, f"{PACKAGE}-*.whl"))
        target = os.path.join(out_dir, os.path.basename(wheel))
        shutil.move(wheel, target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
        # setuptools leaves build/ and *.egg-info next to setup.py
        shutil.rmtree(os.path.join(ROOT, "build", "lib"), ignore_errors=True)
    return target


def build_env(
    output: str,
    wheel: str | None = None,
    deps: bool = True,
    python: str = sys.executable,
    extra: tuple = (),
    python_prefix: str | None = None,
) -> str:
    """A venv with ``wheel`` (and, with ``deps``, its dependencies) packed by venv-pack into ``output``.

    Args:
        output: The ``.tar.gz`` to write.
        wheel: The package wheel to install; ``None`` installs nothing of ours
            (an environment for the dependencies only; ship the package with
            ``--py-files``).
        deps: Install the wheel's dependencies (TensorFlow, ...). ``False``
            gives a small archive whose executors must find them elsewhere
            (e.g. ``spark.executorEnv.PYTHONPATH``), which the tests use.
        python: Interpreter that creates the venv (its base interpreter is
            what the archive's ``bin/python`` links to).
        extra: More requirements to install.
        python_prefix: venv-pack's ``--python-prefix`` (the interpreter's
            prefix on the nodes).
    """
    import venv_pack

    base = _base_python(python)
    work = tempfile.mkdtemp(prefix="sparkdl_avg-env-")
    env = os.path.join(work, "env")
    try:
        pip_needed = bool(extra) or (wheel is not None and deps)
        cmd = [base, "-m", "venv", env] + ([] if pip_needed else ["--without-pip"])
        subprocess.run(cmd, check=True)
        env_python = os.path.join(env, "bin", "python")
        if wheel is not None:
            if pip_needed:
                subprocess.run([env_python, "-m", "pip", "install", "--quiet", wheel, *extra], check=True)
            else:  # no pip in the venv: the outer pip installs the wheel alone into it
                subprocess.run(
                    [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                     "--target", _site_packages(env), wheel],
                    check=True,
                )
        elif extra:
            subprocess.run([env_python, "-m", "pip", "install", "--quiet", *extra], check=True)
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        tmp = output + ".tmp.tar.gz"
        venv_pack.pack(prefix=env, output=tmp, force=True, python_prefix=python_prefix, compress_level=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # venv-pack creates it private
        os.replace(tmp, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output


def _site_packages(env: str) -> str:
    (path,) = glob.glob(os.path.join(env, "lib", "python*", "site-packages"))
    return path


def _base_python(python: str) -> str:
    """The interpreter a venv of ``python`` is based on (``python`` itself outside a venv)."""
    out = subprocess.run(
        [python, "-c", "import sys, os; print(os.path.join(sys.base_prefix, 'bin', 'python%d.%d' % sys.version_info[:2]))"],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="+", choices=("zip", "wheel", "env"))
    p.add_argument("--out-dir", default=os.path.join(ROOT, "dist"))
    p.add_argument("--python-prefix", default=None, help="venv-pack --python-prefix for the env archive")
    args = p.parse_args(argv)
    for what in args.what:
        if what == "zip":
            print(build_zip(args.out_dir))
        elif what == "wheel":
            print(build_wheel(args.out_dir))
        else:
            wheel = build_wheel(args.out_dir)
            print(build_env(os.path.join(args.out_dir, f"{PACKAGE}-env.tar.gz"), wheel, deps=True,
                            python_prefix=args.python_prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
