"""A class-data-sharing (CDS) archive of the classes a Spark JVM loads: Spark JVMs that start on half the CPU.

Used by the test suite for every JVM it starts (tests/conftest.py), and by anyone for their own:

    python scripts/spark_cds.py            # builds it if needed, prints its path
    python scripts/spark_cds.py --measure  # a local[2] session's JVM start, without and with it
    export SPARK_SUBMIT_OPTS="-XX:SharedArchiveFile=$(python scripts/spark_cds.py)"

A Spark JVM spends most of its start-up loading, parsing and verifying some 14,500 classes. Java's application
class-data sharing (``-XX:SharedArchiveFile``) maps them from an archive made once instead. Measured on this 2-core
machine (``SPARK_SUBMIT_OPTS``, a ``local[2]`` session running one SQL and one RDD job, then stopped): 11 s of the
JVM's CPU and 11.4 s wall without the archive, 5 s and 6.0 s with it. The suite is CPU-bound on 2 cores, and it
starts many such JVMs: its sessions, spark-submits, notebooks' and jobs' drivers, Connect servers.

The archive belongs to one virtualenv's pyspark jars and one ``java``: it lives in ``<venv>/spark-cds/`` under a
name made from both, and it is built on first use (about 40 s of one core: a probe session that lists the classes
it loads, then ``java -Xshare:dump``). A JVM whose class path does not start with the archive's (another Spark's
jars) ignores it silently, as does one given an archive that is missing; results never depend on it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

# A probe that loads what the suite's sessions load: a session, a SQL job with a shuffle, an RDD job, Arrow.
_PROBE = """
from pyspark.sql import SparkSession
s = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
s.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").sum("id").collect()
s.sparkContext.parallelize(range(100), 2).map(lambda x: x * 2).sum()
s.range(10).mapInArrow(lambda batches: batches, "id long").collect()
print("CLASSPATH=" + s._jvm.java.lang.System.getProperty("java.class.path"))
s.stop()
"""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_path(python: str = sys.executable) -> str | None:
    """Where the archive for ``python``'s virtualenv and this ``java`` is (or will be); None without java."""
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    key = hashlib.sha1(repr((java, os.stat(java).st_mtime, jars, sorted(os.listdir(jars)))).encode()).hexdigest()[:12]
    return os.path.join(sys.prefix, "spark-cds", f"spark-{pyspark.__version__}-{key}.jsa")


def ensure_archive(python: str = sys.executable, timeout: float = 300) -> str | None:
    """The archive's path, built first if it is not there; None (and a line on stderr) where it cannot be built."""
    path = archive_path(python)
    if path is None or os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    work = tempfile.mkdtemp(prefix="spark-cds-")
    try:
        classes = os.path.join(work, "classes.lst")
        env = dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
                   SPARK_SUBMIT_OPTS=f"-XX:DumpLoadedClassList={classes}")
        probe = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in probe.stdout.splitlines() if ln.startswith("CLASSPATH=")]
        if probe.returncode != 0 or not lines or not os.path.exists(classes):
            raise RuntimeError(f"the probe session failed ({probe.returncode}): {probe.stderr[-2000:]}")
        partial = f"{path}.{os.getpid()}.partial"  # beside it: os.replace within one file system
        dump = subprocess.run([_java(), "-Xshare:dump", f"-XX:SharedClassListFile={classes}",
                               f"-XX:SharedArchiveFile={partial}", "-cp", lines[-1][len("CLASSPATH="):]],
                              capture_output=True, text=True, timeout=timeout)
        if dump.returncode != 0 or not os.path.exists(partial):
            raise RuntimeError(f"java -Xshare:dump failed ({dump.returncode}): {(dump.stdout + dump.stderr)[-2000:]}")
        os.replace(partial, path)  # whole or not at all: another process may be building the same archive
        return path
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"scripts/spark_cds.py: no class-data-sharing archive, Spark JVMs start without one: {exc}",
              file=sys.stderr)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if path is not None and os.path.exists(f"{path}.{os.getpid()}.partial"):
            os.remove(f"{path}.{os.getpid()}.partial")


# One session's start, one SQL and one RDD job, and its stop; prints the JVM's CPU seconds and the wall time.
_MEASURE = """
import subprocess, time
from pyspark.sql import SparkSession
t = time.time()
s = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
s.range(1000).selectExpr("sum(id)").collect()
s.sparkContext.parallelize(range(100), 2).map(lambda x: x * 2).sum()
pid = s._jvm.java.lang.ProcessHandle.current().pid()
cpu = subprocess.run(["ps", "-o", "times=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
print(f"MEASURED {cpu} {time.time() - t:.1f}")
s.stop()
"""


def measure(python: str = sys.executable, repeats: int = 2) -> list:
    """``repeats`` interleaved pairs of sessions without and with the archive: (arm, JVM CPU s, wall s) each."""
    archive, rows = ensure_archive(python), []
    for _ in range(repeats):
        for arm, opts in (("without", "-XX:TieredStopAtLevel=1"),
                          ("with", f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive}")):
            env = dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, SPARK_SUBMIT_OPTS=opts)
            out = subprocess.run([python, "-c", _MEASURE], env=env, capture_output=True, text=True, timeout=300)
            line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MEASURED "))
            cpu, wall = line.split()[1:]
            rows.append((arm, int(cpu), float(wall)))
            print(f"{arm:8s} archive: the JVM's CPU {cpu} s, wall {wall} s", flush=True)
    return rows


if __name__ == "__main__":
    if "--measure" in sys.argv[1:]:
        measure()
    else:
        print(ensure_archive() or "")
