"""The jobs' shared plumbing (sparkdl_avg.cli), their error handling and the files they leave, without Spark.

Output directories appear whole, with the umask's modes, and a job that
fails leaves no temporary directory behind.
"""

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import file_mode as _mode
from conftest import umask
from sparkdl_avg import ConfigurationError, DataError, cli
from sparkdl_avg.shared.files import fs
from sparkdl_avg.errors import PathError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_columns_accept_repeated_flags_and_comma_lists():
    assert cli.columns(None, "features") == "features"
    assert cli.columns(["image"], "features") == "image"
    assert cli.columns(["image", "meta"], "features") == ["image", "meta"]
    assert cli.columns(["image, meta"], "features") == ["image", "meta"]
    with pytest.raises(cli.UsageError):
        cli.columns([" , "], "features")


def test_read_options():
    assert cli.read_options(["header=true", "sep=;"]) == {"header": "true", "sep": ";"}
    with pytest.raises(cli.UsageError, match="KEY=VALUE"):
        cli.read_options(["header"])


def test_output_dir_appears_whole_and_is_replaced_only_with_overwrite(tmp_path):
    target = tmp_path / "out"
    out = fs.OutputDir(str(target))
    out.check()
    with open(out.file("a.txt"), "w") as f:
        f.write("one")
    out.write_json("m.json", {"x": 1})
    assert not target.exists()  # nothing until commit
    out.commit()
    assert (target / "a.txt").read_text() == "one"
    assert json.loads((target / "m.json").read_text()) == {"x": 1}
    assert not os.path.exists(out.local)

    again = fs.OutputDir(str(target))
    with pytest.raises(PathError, match="already exists; pass --overwrite"):
        again.check()
    again.cleanup()

    replace = fs.OutputDir(str(target), overwrite=True)
    with open(replace.file("b.txt"), "w") as f:
        f.write("two")
    replace.commit()
    assert sorted(os.listdir(target)) == ["b.txt"]
    assert [p for p in os.listdir(tmp_path) if p != "out"] == []  # no temporary or old directories left


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_output_dir_is_refused_not_taken_for_the_working_directory(tmp_path, monkeypatch, blank):
    """A bad-input trial (issue 38): --output-dir '' --overwrite replaced the working directory's files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep")
    out = fs.OutputDir(blank, overwrite=True)
    with pytest.raises(PathError) as err:
        out.check()
    assert str(err.value) == f"The --output-dir flag must name a directory (a path or URI). Got {blank!r} instead."
    with open(out.file("model.keras"), "w") as f:
        f.write("x")
    with pytest.raises(PathError):
        out.commit()
    out.cleanup()
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"]


def test_output_dir_accepts_file_uris_and_an_empty_existing_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    out = fs.OutputDir("file://" + str(tmp_path / "empty"))
    open(out.file("x"), "w").close()
    out.commit()
    assert os.listdir(tmp_path / "empty") == ["x"]


# Issue 16, a user's first hour, item 2: files left behind or unreadable.


def test_output_dir_makes_no_temporary_directory_until_written(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.keras").write_text("old")
    out = fs.OutputDir(str(tmp_path / "out"))
    with pytest.raises(fs.PathError, match="already exists"):
        out.check()  # a job stops here, before writing anything and without cleanup()
    assert glob.glob(str(tmp_path / "sparkdl_avg-output-*")) == []


def test_committed_output_gets_the_umask_modes(tmp_path):
    with umask(0o022):
        out = fs.OutputDir(str(tmp_path / "out"))
        with open(out.file("model.keras"), "w") as f:
            f.write("m")
        os.makedirs(out.file("assets"))
        out.write_json("metrics.json", {})
        out.commit()
    assert _mode(tmp_path / "out") == 0o755
    assert _mode(tmp_path / "out" / "assets") == 0o755
    assert _mode(tmp_path / "out" / "model.keras") == _mode(tmp_path / "out" / "metrics.json") == 0o644


def test_write_atomically(tmp_path):
    path = str(tmp_path / "sub" / "m.json")
    fs.write_atomically(path, b"{}", overwrite=False)
    assert open(path).read() == "{}"
    with pytest.raises(PathError, match="already exists"):
        fs.write_atomically(path, b"[]", overwrite=False)
    fs.write_atomically(path, b"[]")
    assert open(path).read() == "[]"
    assert os.listdir(tmp_path / "sub") == ["m.json"]  # no temporary file left
    assert (os.stat(path).st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_paths_and_uris_resolve_to_one_filesystem(tmp_path):
    import pyarrow.fs as pafs

    local, path = fs.resolve("file://" + str(tmp_path / "a"))
    assert isinstance(local, pafs.LocalFileSystem) and path == str(tmp_path / "a")
    assert fs.resolve("relative/b")[1] == os.path.abspath("relative/b")
    with pytest.raises(PathError, match="Cannot open 'nosuch://x/y' with pyarrow.fs"):
        fs.resolve("nosuch://x/y")
    assert fs.join("s3://bucket/dir/", "f") == "s3://bucket/dir/f"
    (tmp_path / "d").mkdir()
    assert fs.exists(str(tmp_path / "d")) and not fs.exists(str(tmp_path / "d"), empty_dir=False)
    fs.write_atomically(str(tmp_path / "d" / "x"), b"1")
    assert fs.read_bytes(str(tmp_path / "d" / "x")) == b"1"
    fs.remove_tree(str(tmp_path / "d"))
    fs.remove_tree(str(tmp_path / "d"))  # missing is fine
    assert not fs.exists(str(tmp_path / "d"))


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = str(tmp_path / "f")
    fs.write_atomically(path, b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with fs.open_atomically(path) as out:
            out.write(b"new, half")
            raise RuntimeError("boom")
    assert open(path, "rb").read() == b"old" and os.listdir(tmp_path) == ["f"]


def test_run_turns_user_errors_into_one_line_and_exit_2(capsys):
    def failing(error):
        def main(argv):
            raise error
        return main

    assert cli.run(failing(ConfigurationError("The 'batch_size' parameter must be an int.\nGot 0."))) == 2
    assert capsys.readouterr().err == "error: The --batch-size flag must be an int. Got 0.\n"  # named by its flag
    assert cli.run(failing(DataError("Column 'x' not found"))) == 2
    assert cli.run(failing(PathError("No such file: 'm.keras'"))) == 2
    assert cli.run(lambda argv: 0) == 0
    with pytest.raises(RuntimeError):
        cli.run(failing(RuntimeError("a bug stays a traceback")))


def test_run_ends_a_failed_cluster_task_and_a_ctrl_c_with_one_line_too(capsys):
    """Issue 38 item 5: a WorkerError's traceback carried the Spark exception's Java stack, Ctrl-C a 40-line traceback."""
    from sparkdl_avg import WorkerError

    def failing(error):
        def main(argv):
            raise error
        return main

    capsys.readouterr()
    assert cli.run(failing(WorkerError("Round 3 of epoch 0 failed on the cluster: Python worker exited"))) == 1
    assert capsys.readouterr().err == "error: Round 3 of epoch 0 failed on the cluster: Python worker exited\n"
    assert cli.run(failing(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"


class _FailingReader:
    """``spark.read.format(...).options(...).load(...)`` that raises ``error``; a session without a JVM (Connect)."""

    def __init__(self, error):
        self.error = error
        self.read = self

    def format(self, fmt):
        return self

    def options(self, **options):
        return self

    def load(self, path):
        raise self.error


def test_read_errors_name_the_root_cause_under_spark_connect():
    """Spark Connect's errors carry the server's cause chain as text (issue #29 item 9); classic: test_jobs.py."""
    from pyspark.errors.exceptions.connect import AnalysisException, SparkException

    footer = SparkException(
        "[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Encountered error while reading file file:/d/x.txt.\n"
        "If not, please convert it to a valid format.",
        server_stacktrace="org.apache.spark.SparkException\n\tat a.B.c(B.scala:1)\n"
                          "Caused by: java.lang.RuntimeException: file:/d/x.txt is not a Parquet file. Expected magic\n"
                          "\tat d.E.f(E.java:2)",
    )
    with pytest.raises(cli.UsageError) as err:
        cli.read_data(_FailingReader(footer), "/d/x.txt", "parquet", {}, [], "--validation-data")
    assert str(err.value) == ("Cannot read --validation-data '/d/x.txt' as parquet: java.lang.RuntimeException: "
                              "file:/d/x.txt is not a Parquet file. Expected magic")
    missing = AnalysisException("[PATH_NOT_FOUND] Path does not exist: file:/nope. SQLSTATE: 42K03\nmore")
    with pytest.raises(cli.UsageError, match=r"^Cannot read --data '/nope' as parquet: \[PATH_NOT_FOUND\] Path does "
                                             r"not exist: file:/nope. SQLSTATE: 42K03$"):
        cli.read_data(_FailingReader(missing), "/nope", "parquet", {}, [])
    s3a = SparkException("(java.lang.ClassNotFoundException) Class org.apache.hadoop.fs.s3a.S3AFileSystem not found")
    with pytest.raises(cli.UsageError) as err:
        cli.read_data(_FailingReader(s3a), "s3a://b/x", "parquet", {}, [])
    assert "S3AFileSystem not found. Spark reads S3 data as s3a:// through the hadoop-aws package" in str(err.value)
    assert "--packages org.apache.hadoop:hadoop-aws:<the cluster's Hadoop version>" in str(err.value)


def test_stderr_through_the_jvm_falls_back_when_the_gateway_is_gone(capsys):
    class Gone:
        def print(self, text):
            raise ConnectionError("py4j gateway closed")

        def flush(self):
            raise ConnectionError("py4j gateway closed")

    stream = cli._JvmStderr(Gone(), sys.stderr)
    print("error: still seen", file=stream, flush=True)
    assert capsys.readouterr().err == "error: still seen\n"


def test_load_model_errors():
    with pytest.raises(cli.UsageError, match="MODULE:FUNCTION"):
        cli.load_model(builder="nocolon")
    with pytest.raises(cli.UsageError, match="Cannot import module 'no_such_module_xyz'"):
        cli.load_model(builder="no_such_module_xyz:build")
    with pytest.raises(cli.UsageError, match="has no function 'nope'"):
        cli.load_model(builder="json:nope")
    with pytest.raises(PathError, match="No such file"):
        cli.load_model(path="/nonexistent/model.keras")


def _job(*args, env=None):
    env = env or dict(os.environ, PYTHONPATH=os.path.join(ROOT, "jobs"))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _jobs(*commands, env=None):
    """:func:`_job` of each command, all started at once (each is mostly one core importing TensorFlow)."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: _job(*args, env=env), commands))


def _error_line(proc) -> str:
    """The job's one error line (TensorFlow may log to stderr before it); there must be exactly one."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and proc.stderr.rstrip("\n").endswith(lines[0]), proc.stderr[-2000:]
    return lines[0]


def test_seed_repeats_a_model_builder_without_a_seed_parameter(tmp_path, monkeypatch):
    """--seed seeds the builder even when it takes no seed: the same flags build the same initial weights."""
    (tmp_path / "unseeded_builder.py").write_text(
        "import keras\n"
        "def build():\n"
        "    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    return model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first, again = (cli.load_model(builder="unseeded_builder:build", seed=7).get_weights() for _ in range(2))
    other = cli.load_model(builder="unseeded_builder:build", seed=8).get_weights()
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


@pytest.mark.integration  # runs jobs/train.py in another Python
def test_train_job_help_documents_every_trainer_option():
    proc = _job("jobs/train.py", "--help")
    assert proc.returncode == 0
    import inspect

    from sparkdl_avg import ParameterAveragingTrainer

    # every constructor option and the fit options a job needs, derived from the code
    options = [n for n in inspect.signature(ParameterAveragingTrainer).parameters if n != "model"]
    options += ["epochs", "checkpoint_dir", "checkpoint_every", "resume"]
    from sparkdl_avg.driver.config.messages import flag_names

    flags = flag_names()  # the table's spelling: --no-check-data, --no-staleness-aware, ...
    for name in options:
        flag = flags[name]
        assert flag in proc.stdout, flag
    for flag in ("--data", "--format", "--model", "--model-builder", "--features-col", "--label-col",
                 "--validation-data", "--block-momentum", "--block-lr", "--output-dir", "--overwrite"):
        assert flag in proc.stdout, flag


def test_the_cluster_guide_lists_every_flag_of_the_option_table():
    from sparkdl_avg.driver.config.messages import flag_names

    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guides", "cluster.md"),
                 encoding="utf-8").read()
    assert sorted(f for f in set(flag_names().values()) if f"`{f}" not in guide) == []


@pytest.mark.integration  # runs jobs/train.py in another Python
def test_train_job_rejects_bad_flags_with_one_line_before_starting_spark(tmp_path):
    common = ["jobs/train.py", "--data", str(tmp_path / "none.parquet")]
    out = ["--output-dir", str(tmp_path / "out")]
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "model.keras").write_text("old")
    bad_option, bad_builder, existing, usage = _jobs(
        # a trainer option: the trainer's own validator, before any Spark work
        [*common, *out, "--model-builder", "digits_model:build", "--batch-size", "0"],
        [*common, *out, "--model-builder", "no_such_module_xyz:build"],
        [*common, "--output-dir", str(tmp_path / "existing"), "--model-builder", "digits_model:build"],
        ["jobs/train.py", "--data", "x"],
    )
    assert bad_option.returncode == 2, bad_option.stderr[-2000:]
    assert _error_line(bad_option).startswith("error: The --batch-size flag must be an int")
    assert bad_builder.returncode == 2 and _error_line(bad_builder).startswith("error: Cannot import module")
    assert existing.returncode == 2 and "already exists; pass --overwrite" in _error_line(existing)
    assert (tmp_path / "existing" / "model.keras").read_text() == "old"
    # argparse's own errors also exit 2
    assert usage.returncode == 2


# Issue 16, a user's first hour, item 2: files left behind or unreadable.
@pytest.mark.integration  # runs jobs/train.py in another Python
def test_a_failing_train_job_leaves_no_temporary_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "jobs"), TMPDIR=str(scratch))
    common = ["jobs/train.py", "--data", str(tmp_path / "none.parquet"), "--output-dir", str(tmp_path / "out"),
              "--model-builder", "digits_model:build"]
    for proc in _jobs([*common, "--batch-size", "0"], [*common, "--model-builder", "no_such_module_xyz:build"], env=env):
        assert proc.returncode == 2, proc.stderr[-2000:]
    assert glob.glob(str(scratch / "sparkdl_avg-*")) == []


@pytest.mark.integration  # runs jobs/train.py in another Python
def test_train_job_refuses_unwritable_output_and_checkpoint_dirs_before_starting_spark(tmp_path):
    common = ["jobs/train.py", "--data", str(tmp_path / "none.parquet"), "--model-builder", "digits_model:build"]
    output, proc = _jobs([*common, "--output-dir", "/proc/x/out"],
                         [*common, "--output-dir", str(tmp_path / "out"), "--checkpoint-dir", "/sys/x"])
    assert output.returncode == 2, output.stderr[-2000:]
    assert _error_line(output).startswith(
        "error: The --output-dir flag must be a directory this process can write. Got '/proc/x/out' instead: "
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert _error_line(proc).startswith(
        "error: The --checkpoint-dir flag must be a directory this process can write. Got '/sys/x' instead: "
    )
    assert "SparkContext" not in proc.stderr and os.listdir(tmp_path) == []  # no Spark, nothing left behind


def test_output_dir_that_cannot_be_written_is_refused_by_check(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(PathError, match=r"The --output-dir flag must be a directory this process can write\. "
                                        r"Got '.*/file/out' instead: '.*/file' is a file, not a directory\."):
        fs.OutputDir(str(tmp_path / "file" / "out")).check()


def test_a_failed_commit_keeps_the_outputs_and_says_where(tmp_path, monkeypatch):
    import shutil

    out = fs.OutputDir(str(tmp_path / "out"))
    out.check()
    with open(out.file("model.keras"), "w") as f:
        f.write("trained")
    out.write_json("metrics.json", {"loss": 0.1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copytree", disk_full)
    with pytest.raises(PathError) as err:
        out.commit(keep_on_error=True)
    kept = str(err.value).split(" were saved to ")[1].split(" instead")[0]
    assert str(err.value).startswith(f"Cannot write the --output-dir '{tmp_path / 'out'}': the disk is full (no space "
                                     "left on device).")
    assert "(metrics.json, model.keras)" in str(err.value)
    out.cleanup()  # what the job's finally does: the kept files stay
    assert open(os.path.join(kept, "model.keras")).read() == "trained"
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    shutil.rmtree(kept)
