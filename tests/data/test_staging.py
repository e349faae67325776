"""What staging leaves behind, and path checks of remote locations that never answer.

Issue: a driver killed with ``kill -9`` left its staging root (the whole
staged training data) in the temp dir, and nothing removed it; a
``checkpoint_dir="gs://..."`` of a bucket that does not exist, without
credentials, hung the fit for about ten minutes in silence. Data that
staging refuses leaves no partial files and fails no task, and the staging
root is readable by its owner only.
"""

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import file_mode as _mode
from conftest import make_model, umask
from sparkdl_avg import DataError, ParameterAveragingTrainer
from sparkdl_avg.shared.files import fs
from sparkdl_avg.driver.data import staging_roots
from sparkdl_avg.errors import ConfigurationError, PathError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A driver that makes its staging root, stages 256 examples into it and is killed before close() or exit.
KILLED_DRIVER = """
import os, signal, sys
import numpy as np
from sparkdl_avg.driver.data import staging, staging_roots
root = staging_roots.StagingRoot.new(sys.argv[1], os.getpid())
root.make(private=True)
x = np.random.default_rng(0).normal(size=(256, 4))
staging.stage((x, x.sum(axis=1)), root=root.uri, x_shapes=[(4,)], x_dtype="float64")
print(root.uri, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_driver_root(base) -> str:
    proc = subprocess.run([sys.executable, "-c", KILLED_DRIVER, str(base)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return proc.stdout.strip()


def _root_with_marker(base, name: str, **record) -> str:
    """A staging root named ``name`` holding a file and a marker: this process's, with ``record``'s keys replaced."""
    path = os.path.join(str(base), name)
    os.makedirs(os.path.join(path, "training-0"))
    with open(os.path.join(path, "training-0", "part-00000.arrow"), "wb") as f:
        f.write(b"x" * 100)
    with open(os.path.join(path, staging_roots.MARKER), "w") as f:
        json.dump({**staging_roots.owner_record(), **record}, f)
    return path


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- staging roots of killed drivers


def test_the_next_fit_removes_a_killed_drivers_staged_data_and_nothing_else(spark, tmp_path, caplog):
    base = tmp_path / "staging"
    base.mkdir()
    dead = _killed_driver_root(base)
    staged = glob.glob(os.path.join(dead, "training-*", "part-*.arrow"))
    assert staged and os.stat(dead).st_mode & 0o777 == 0o700  # what the issue found left behind
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(dead) for n in names)  # marker too
    live = _root_with_marker(base, "sparkdl_avg-20250101-000000-1")  # this process's: alive
    elsewhere = _root_with_marker(base, "sparkdl_avg-20250101-000000-2", host="another-host", pid=_exited_pid())
    unmarked = os.path.join(base, "sparkdl_avg-20250101-000000-3")
    os.makedirs(os.path.join(unmarked, "training-0"))
    unrelated = os.path.join(base, "sparkdl_avg-notes")
    os.makedirs(unrelated)
    with open(os.path.join(unrelated, staging_roots.MARKER), "w") as f:  # a marker, but not the library's naming pattern
        json.dump({**staging_roots.owner_record(), "pid": _exited_pid()}, f)

    x = np.random.default_rng(0).normal(size=(32, 4))
    trainer = ParameterAveragingTrainer(make_model(), batch_size=4, staging_dir=str(base))
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit((x, x.sum(axis=1)), epochs=1, verbose=0)

    assert not os.path.exists(dead)
    assert sorted(os.listdir(base)) == sorted(
        os.path.basename(p) for p in (live, elsewhere, unmarked, unrelated, trainer._staging_root)
    )
    assert os.path.exists(os.path.join(live, "training-0", "part-00000.arrow"))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Removed ")]
    assert line.startswith(f"Removed {dead}, the staging root left by a driver no longer running (pid ")
    assert f": {size:,} bytes in " in line
    trainer.close()
    assert not os.path.exists(trainer._staging_root)


def test_only_a_marked_root_of_this_user_whose_owner_on_this_host_is_gone_is_an_orphan(tmp_path):
    here = staging_roots.owner_record()
    cases = {
        "sparkdl_avg-20250101-000000-a": ({"pid": _exited_pid()}, True),
        "sparkdl_avg-20250101-000000-b": ({"started": here["started"] + 1}, True),  # this pid, reused: not the owner
        "sparkdl_avg-20250101-000000-c": ({}, False),  # this process: alive
        "sparkdl_avg-20250101-000000-d": ({"pid": _exited_pid(), "host": "another-host"}, False),
        "sparkdl_avg-20250101-000000-e": ({"pid": _exited_pid(), "boot_id": "before-a-reboot"}, False),
        "sparkdl_avg-20250101-000000-f": ({"pid": _exited_pid(), "pid_namespace": "pid:[1]"}, False),  # a container's
        "sparkdl_avg-20250101-000000-g": ({"pid": _exited_pid(), "library": "other"}, False),
        "sparkdl_avg-20250101-000000-h": ({"pid": "1"}, False),
        "sparkdl_avg-output-0": ({"pid": _exited_pid()}, False),  # not the staging roots' naming pattern
    }
    for name, (record, orphan) in cases.items():
        path = _root_with_marker(tmp_path, name, **record)
        assert (staging_roots.dead_owner(path) is not None) == orphan, name
    damaged = _root_with_marker(tmp_path, "sparkdl_avg-20250101-000000-i", pid=_exited_pid())
    with open(os.path.join(damaged, staging_roots.MARKER), "w") as f:
        f.write('{"library": "spark')  # a marker cut short
    assert staging_roots.dead_owner(damaged) is None
    assert staging_roots.dead_owner(str(tmp_path / "sparkdl_avg-20250101-000000-j")) is None  # no such directory

    orphans = {name for name, (_, orphan) in cases.items() if orphan}
    sizes = {name: 100 + os.path.getsize(tmp_path / name / staging_roots.MARKER) for name in orphans}  # the data, the marker
    removed = staging_roots.remove_orphans(str(tmp_path))
    assert {os.path.basename(path): size for path, size in removed} == sizes
    assert sorted(os.listdir(tmp_path)) == sorted({*cases, os.path.basename(damaged)} - orphans)


def test_a_killed_child_not_yet_reaped_owns_nothing(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = _root_with_marker(tmp_path, "sparkdl_avg-20250101-000000-a", pid=child.pid,
                                 started=staging_roots.owner_record(child.pid)["started"])
        assert staging_roots.dead_owner(path) is None  # running
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while staging_roots.dead_owner(path) is None and time.monotonic() < deadline:  # a zombie until waited for
            time.sleep(0.05)
        assert staging_roots.dead_owner(path) is not None
    finally:
        child.kill()
        child.wait()


def test_a_remote_staging_root_is_neither_marked_nor_swept_beside(monkeypatch):
    swept = []
    monkeypatch.setattr(staging_roots, "remove_orphans", swept.append)
    root = staging_roots.StagingRoot("mock:///base/sparkdl_avg-20250101-000000-1", "mock:///base")
    root.make(private=True)
    assert root.made and swept == []


# ---------------------------------------------------------------- refused data, private roots
# Issue 16, a user's first hour, item 2: files left behind or unreadable.


def test_refused_staging_leaves_no_partial_files(spark, tmp_path):
    from pyspark.sql import functions as F

    n = 64
    df = spark.range(n).select(
        F.array(*[F.col("id").cast("double")] * 4).alias("features"),
        F.when(F.col("id") == n - 1, F.lit(float("nan"))).otherwise(F.lit(1.0)).alias("label"),
    ).repartition(4)
    trainer = ParameterAveragingTrainer(make_model(), batch_size=4, staging_dir=str(tmp_path))
    with pytest.raises(DataError, match="NaN"):
        trainer.fit(df, epochs=1, verbose=0)
    staged = [p for p in glob.glob(str(tmp_path / "**"), recursive=True) if os.path.isfile(p)]
    assert staged == []
    assert glob.glob(str(tmp_path / "sparkdl_avg-*" / "training-*")) == []
    trainer.close()


def test_local_staging_root_is_private(spark, tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4))
    y = x.sum(axis=1)
    base = tmp_path / "staging"
    with umask(0o022):
        base.mkdir()
        trainer = ParameterAveragingTrainer(make_model(), batch_size=4, staging_dir=str(base),
                                            state_transport="files")
        trainer.fit((x, y), epochs=1, verbose=0)
    (root,) = glob.glob(str(base / "sparkdl_avg-*"))
    assert _mode(root) == 0o700  # the staged data and the exchanged weights under it: owner only
    assert _mode(base) == 0o755  # the user's staging_dir itself is left alone
    trainer.close()
    assert not os.path.exists(root)


def test_refused_staging_data_is_reported_in_the_tasks_row_not_by_failing_it():
    """A failed task makes Spark log an executor ERROR block (naming internal columns) and drops the Python worker."""
    import pyarrow as pa

    from sparkdl_avg.shared.data.columns import Column, Field
    from sparkdl_avg.shared.data.value_checks import DataChecks
    from sparkdl_avg.executor.stage_writer import export_arrow_batches

    consumed = []

    def batches():
        for i in range(3):
            consumed.append(i)
            x = [[float("nan"), 1.0]] if i == 0 else [[0.0, 1.0]]
            yield pa.record_batch([pa.array(x, pa.list_(pa.float64())), pa.array([1.0])], names=["x0", "y0"])

    columns = [Column("x0", "x0", "tensor", Field((2,), "float64"), "x", 0),
               Column("y0", "y0", "tensor", Field((), "float64"), "y", 0)]
    (row,) = export_arrow_batches(batches(), directory="/nonexistent", columns=columns, checks=DataChecks(finite=True))
    assert consumed == [0, 1, 2]  # the whole input, so PySpark reuses the worker
    error = row.column("error")[0].as_py()
    assert row.column("rows")[0].as_py() == 0 and "Column 'x0'" in error and "NaN" in error, error


# ---------------------------------------------------------------- remote path checks within a time limit

GS_URI = "gs://a-bucket-that-does-not-exist-xyz/ckpt"


def test_a_gs_checkpoint_dir_that_cannot_be_reached_fails_within_30_s_naming_it(monkeypatch):
    """At the default limit: no network here, so GCS finds no credentials (it used to retry for ~10 minutes)."""
    monkeypatch.delenv(fs.PATH_CHECK_TIME_LIMIT_ENV, raising=False)
    x = np.zeros((16, 4))
    trainer = ParameterAveragingTrainer(make_model(), batch_size=4)
    started = time.monotonic()
    with pytest.raises(PathError) as err:
        trainer.fit((x, x.sum(axis=1)), verbose=0, checkpoint_dir=GS_URI)
    elapsed = time.monotonic() - started
    assert elapsed <= fs.PATH_CHECK_TIME_LIMIT_S + 1.0, elapsed  # + the waiting thread's wake-up
    message = str(err.value)
    assert message.startswith(
        f"The 'checkpoint_dir' parameter must be a directory this process can write. Got '{GS_URI}' instead: "
        "GcsFileSystem.get_file_info('a-bucket-that-does-not-exist-xyz/ckpt') "
    ), message
    assert "checking that a file can be written there" in message and "30 s" in message


@pytest.mark.parametrize("limit", ["1.5"])
def test_the_time_limit_of_a_path_check_is_configurable(monkeypatch, limit):
    monkeypatch.setenv(fs.PATH_CHECK_TIME_LIMIT_ENV, limit)
    started = time.monotonic()
    with pytest.raises(PathError, match=rf"^The 'checkpoint_dir' parameter .* Got '{GS_URI}' instead: GcsFileSystem"):
        fs.check_writable(GS_URI, "The 'checkpoint_dir' parameter")
    assert time.monotonic() - started <= float(limit) + 1.0


class HangingFileSystem:
    """A remote filesystem that never answers (until the test ends)."""

    type_name = "hanging"

    def __init__(self, released: threading.Event) -> None:
        self.released = released

    def get_file_info(self, path, **kwargs):
        self.released.wait(30)
        raise OSError("released")

    create_dir = get_file_info


@pytest.mark.parametrize(
    "check, subject, operation, what",
    [
        (lambda uri: fs.check_writable(uri, "The 'checkpoint_dir' parameter"), "The 'checkpoint_dir' parameter",
         "get_file_info('bucket/dir')", "checking that a file can be written there"),
        (lambda uri: fs.make_writable_dir(uri + "/sparkdl_avg-1", "The 'staging_dir' parameter", uri),
         "The 'staging_dir' parameter", "create_dir('bucket/dir/sparkdl_avg-1')", "creating a directory there"),
        (lambda uri: fs.OutputDir(uri).check(), "The --output-dir flag", "get_file_info('bucket/dir')",
         "checking that the output can be written there"),
    ],
    ids=["check_writable", "make_writable_dir", "OutputDir.check"],
)
def test_a_remote_check_without_an_answer_is_given_up_at_the_limit_saying_what_it_tried(
    monkeypatch, check, subject, operation, what
):
    released = threading.Event()
    monkeypatch.setattr(fs, "resolve", lambda uri, retry_limit_s=None: (HangingFileSystem(released),
                                                                         uri.split("://", 1)[1]))
    monkeypatch.setenv(fs.PATH_CHECK_TIME_LIMIT_ENV, "0.5")
    started = time.monotonic()
    try:
        with pytest.raises(PathError) as err:
            check("hang://bucket/dir")
    finally:
        released.set()
    assert time.monotonic() - started < 3
    assert str(err.value) == (
        f"{subject} must be a directory this process can write. Got 'hang://bucket/dir' instead: "
        f"HangingFileSystem.{operation} gave no answer within 0.5 s, the time limit of a path check ({what}; "
        f"{fs.PATH_CHECK_TIME_LIMIT_ENV} sets it). Check the URI, the network and the filesystem's credentials."
    )


@pytest.mark.parametrize("given", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_time_limit_is_refused_naming_the_variable(monkeypatch, given):
    monkeypatch.setenv(fs.PATH_CHECK_TIME_LIMIT_ENV, given)
    with pytest.raises(ConfigurationError, match=rf"^The {fs.PATH_CHECK_TIME_LIMIT_ENV} environment variable must be "
                                                 rf"a number of seconds above 0\. Got '{given}' instead\.$"):
        fs.check_writable(GS_URI, "The 'checkpoint_dir' parameter")
