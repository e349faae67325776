"""The benchmarks' one harness: the Spark session users get, the common arguments, one results format.

Every script in ``benchmarks/`` builds its sessions, its argument parser and
its results file through this module, so that what it measures is what a
README reader runs and every results file says how it was made:

* :func:`session`: a ``SparkSession`` with the README's settings
  (``SparkSession.builder.master(...).config(map=sparkdl_avg.RECOMMENDED_CONF)``,
  README's Quickstart: executors fork TensorFlow-ready workers from
  ``sparkdl_avg.daemon``, the JVMs talk to Python over Unix domain sockets,
  no console progress bars), plus ``spark.ui.enabled=false`` and
  ``spark.log.level=WARN`` (as ``make train``). An arm that measures another
  setting says so with ``conf=``: a value replaces or adds a key, ``None``
  leaves the key unset (Spark's default), e.g. ``{"spark.python.daemon.module": None}``
  for PySpark's own daemon. ``connect=True`` starts a local Spark Connect
  server (``SparkSession.builder.remote(master)``) with the same settings.
* :func:`parser`: an ``argparse.ArgumentParser`` with the arguments every
  script takes (``--out``; ``--repeats`` and ``--rounds`` where the script
  has them), to which the script adds its own; :meth:`Parser.add_internal`
  adds a hidden argument (a parent's instructions to its child process) that
  results files leave out.
* :func:`write_results` (a JSON object, written atomically) and
  :func:`append_results` (one such object per line of a ``.jsonl`` file): the
  keys ``benchmark`` (the script's name), ``date`` (``%Y-%m-%d %H:%M``),
  ``machine`` (CPUs, the 1-minute load average when written, Python,
  pyspark, TensorFlow and sparkdl_avg versions), ``conf`` (the Spark settings
  the harness applied), ``arm_conf`` (``{arm: conf}`` of the arms that
  deviate from ``conf``; ``{}`` when none does), ``args`` (the parsed
  arguments), then the script's own keys (``rows``, ``runs``, ...).

This module imports neither Spark nor sparkdl_avg at import time: the
Elephas arm (``elephas_arm.py``) runs it in a venv without sparkdl_avg
(``session(readme=False)``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

#: What every benchmark session gets besides README's ``RECOMMENDED_CONF``: no Spark UI (no port, no
#: listener work), Spark's log at WARN (as ``make train`` runs).
HARNESS_CONF: Dict[str, str] = {"spark.ui.enabled": "false", "spark.log.level": "WARN"}

_sessions: List[Dict[str, str]] = []  # the settings of every session this process built, in order
_internal: set = set()  # argument dests that results files leave out (Parser.add_internal)


def benchmark_name() -> str:
    """The running script's name without ``.py`` (``suite`` for ``benchmarks/suite.py``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else "benchmark")
    return os.path.splitext(os.path.basename(path))[0]


# ------------------------------------------------------------------ Spark


def settings(conf: Optional[Mapping[str, Optional[str]]] = None, *, readme: bool = True) -> Dict[str, str]:
    """The Spark settings a :func:`session` with this ``conf`` applies: README's, the harness's, then ``conf``.

    ``readme=False`` leaves out README's ``RECOMMENDED_CONF`` (and the import of
    sparkdl_avg): for an arm that is not sparkdl_avg (Elephas). In ``conf`` a
    ``None`` value removes the key (Spark's default then applies).
    """
    out: Dict[str, Optional[str]] = {}
    if readme:
        from sparkdl_avg import RECOMMENDED_CONF

        out.update(RECOMMENDED_CONF)
    out.update(HARNESS_CONF)
    out.update(conf or {})
    return {key: str(value) for key, value in out.items() if value is not None}


def overrides(base: Mapping[str, str], other: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """The ``conf`` that turns settings ``base`` into ``other`` (``None``: a key of ``base`` that ``other`` lacks)."""
    out: Dict[str, Optional[str]] = {key: None for key in base if key not in other}
    out.update({key: value for key, value in other.items() if base.get(key) != value})
    return out


def session(master: str = "local[2]", *, connect: bool = False, conf: Optional[Mapping[str, Optional[str]]] = None,
            app_name: Optional[str] = None, readme: bool = True):
    """A ``SparkSession`` on ``master`` with :func:`settings` ``(conf, readme=readme)``.

    ``connect=True``: ``SparkSession.builder.remote(master)``, a local Spark
    Connect server (``master`` like ``"local[2]"``) started with the same
    settings, or a server's ``sc://`` address. The settings are recorded for
    :func:`write_results`. One JVM runs one SparkContext: stop the previous
    session before building another.
    """
    from pyspark.sql import SparkSession

    applied = settings(conf, readme=readme)
    if connect:
        # A local Connect server starts with these static settings; the client then sets them again as session
        # settings and the server refuses, warning although they took effect (as sparkdl_avg does for its own).
        for key in applied:
            warnings.filterwarnings(
                "ignore", category=UserWarning,
                message=rf"Failed to set {re.escape(key)} to Some\(.*\) due to \[CANNOT_MODIFY_CONFIG\]")
    builder = SparkSession.builder.remote(master) if connect else SparkSession.builder.master(master)
    builder = builder.appName(app_name or f"sparkdl_avg-bench-{benchmark_name()}").config(map=applied)
    spark = builder.getOrCreate()
    _sessions.append(applied)
    return spark


# -------------------------------------------------------------- arguments


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose hidden arguments stay out of results files."""

    def add_internal(self, *flags: str, **kwargs: Any) -> argparse.Action:
        """A hidden argument (``help=argparse.SUPPRESS``) that :func:`write_results` leaves out of ``args``."""
        action = self.add_argument(*flags, help=argparse.SUPPRESS, **kwargs)
        _internal.add(action.dest)
        return action


def default_out(name: str) -> str:
    """``benchmarks/results/<name>`` (a bare file name) or ``name`` itself (a path)."""
    return name if os.path.dirname(name) else os.path.join(RESULTS, name)


def parser(description: Optional[str], *, out: str, repeats: Optional[int] = None,
           repeats_help: str = "repetitions of every arm, interleaved", rounds: Optional[int] = None,
           rounds_help: str = "rounds per fit (the first is dropped)") -> Parser:
    """The script's parser with the common arguments; the script adds its own.

    ``description``: the script's docstring (its first paragraph is shown).
    ``out``: the default of ``--out``, the results file: a name in
    ``benchmarks/results/`` or a path. ``repeats`` / ``rounds``: the defaults
    of ``--repeats`` and ``--rounds``, for the scripts that have them (with
    what they mean there).
    """
    p = Parser(description=(description or "").strip().split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=default_out(out), help="results file (default: %(default)s)")
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help=f"{repeats_help} (default: %(default)s)")
    if rounds is not None:
        p.add_argument("--rounds", type=int, default=rounds, help=f"{rounds_help} (default: %(default)s)")
    return p


# ---------------------------------------------------------------- results


def _version(module: str, dist: str) -> Optional[str]:
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    try:
        from importlib import metadata

        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - not installed here (the Elephas venv has no sparkdl_avg)
        return None


def machine() -> Dict[str, Any]:
    """CPUs, the 1-minute load average now, and the versions that matter."""
    return {
        "cpus": os.cpu_count(),
        "load_avg_1min": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "pyspark": _version("pyspark", "pyspark"),
        "tensorflow": _version("tensorflow", "tensorflow"),
        "sparkdl_avg": _version("sparkdl_avg", "sparkdl_avg"),
    }


def record(args, *, conf: Optional[Mapping[str, str]] = None, arm_conf: Optional[Mapping[str, Any]] = None,
           **payload: Any) -> Dict[str, Any]:
    """The results object: the harness's keys, then ``payload``'s.

    ``conf``: the settings of the sessions measured; by default those of the
    last :func:`session` this process built, ``{}`` if none (a script without
    Spark). A script whose sessions run in child processes passes
    ``conf=settings(...)``. ``arm_conf``: ``{arm: conf}`` for the arms that
    deviate from ``conf`` (what they passed to :func:`session`).
    ``args``: an ``argparse.Namespace`` or a dict; hidden arguments are left out.
    """
    reserved = {"benchmark", "date", "machine", "conf", "arm_conf", "args"} & set(payload)
    if reserved:
        raise ValueError(f"the harness writes {sorted(reserved)} itself")
    arguments = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    if conf is None:
        conf = _sessions[-1] if _sessions else {}
    return {
        "benchmark": benchmark_name(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "conf": dict(conf),
        "arm_conf": {arm: dict(c or {}) for arm, c in (arm_conf or {}).items()},
        "args": {k: v for k, v in arguments.items() if k not in _internal},
        **payload,
    }


def _default(o):
    """numpy scalars and arrays as Python values; anything else JSON cannot hold as ``null``."""
    if hasattr(o, "tolist"):
        return o.tolist()
    return None


def write_json(path: str, data: Any, indent: Optional[int] = 1) -> None:
    """``data`` as JSON at ``path``, atomically (a temporary file in the same folder, then ``os.replace``)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")  # the umask's mode, unlike mkstemp
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=indent, default=_default)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_results(path: str, args, *, conf: Optional[Mapping[str, str]] = None,
                  arm_conf: Optional[Mapping[str, Any]] = None, **payload: Any) -> Dict[str, Any]:
    """Writes the results object (:func:`record`) to ``path`` atomically; returns it."""
    data = record(args, conf=conf, arm_conf=arm_conf, **payload)
    write_json(path, data)
    return data


def append_results(path: str, args, *, conf: Optional[Mapping[str, str]] = None,
                   arm_conf: Optional[Mapping[str, Any]] = None, **payload: Any) -> Dict[str, Any]:
    """Appends the results object (:func:`record`) to the JSON-lines file ``path`` as one line; returns it."""
    data = record(args, conf=conf, arm_conf=arm_conf, **payload)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(data, default=_default) + "\n")
    return data

