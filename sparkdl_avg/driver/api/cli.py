"""Plumbing shared by the spark-submit jobs in ``jobs/``: flags, models, data, output directories.

The jobs (``jobs/train.py``, ``jobs/evaluate.py``, ``jobs/predict.py``) stay thin: they declare their flags with the
``add_*`` helpers here, read data with :func:`read_data`, get the model from :func:`load_model`, and write results
through :class:`sparkdl_avg.shared.files.fs.OutputDir`, which never leaves a half-written directory behind. :func:`run`
turns the errors a user can fix (bad flags, bad paths, bad data, executors without the package) into one line on stderr
and exit status 2.

Paths may be local or URIs: data is read by Spark (anything its readers accept: ``hdfs://``, ``s3a://``, ``abfss://``,
...), model files and the output directory go through :mod:`sparkdl_avg.shared.files.fs` (local, ``hdfs://``, ``s3://``,
``gs://``; ``s3a://`` is read as ``s3://``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import os
import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ...errors import ConfigurationError, DataError, ExecutorEnvironmentError, PathError, WorkerError
from ...shared.files import fs
from ..config import messages
from ..config import options as table
from ..config.trainer_config import check_fit_args

EXIT_USAGE = 2
EXIT_FAILED = 1  # a task failed on the cluster (WorkerError): not the flags' fault, as for an uncaught error
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report a process that SIGINT ended


class ArgumentParser(argparse.ArgumentParser):
    """The jobs' parser: a bad flag is one line on stderr (``train.py: error: ...``) and exit status 2.

    argparse's own parser prints the whole usage before its error; the line ends with where the usage is
    (``--help``), as the jobs' other errors are one line (:func:`run`).
    """

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{self._did_you_mean(message)} (see {self.prog} --help "
                              "for the flags it takes)\n")

    def _did_you_mean(self, message: str) -> str:
        """``; did you mean --batch-size?`` for an unknown flag close to one the job has, else nothing."""
        import difflib

        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [s for s in self._option_string_actions if s.startswith("--")]
        for word in message.split(":", 1)[1].split():
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.75)
            if close:
                return f"; did you mean {close[0]}?"
        return ""


class UsageError(ValueError):
    """A flag or path the user gave cannot be used."""


# ------------------------------------------------------------------ flags


def add_data_args(p: argparse.ArgumentParser, label: bool = True) -> None:
    """``--data``, ``--format``, ``--read-option``, ``--features-col`` and (optionally) ``--label-col``."""
    g = p.add_argument_group("data")
    g.add_argument("--data", required=True, metavar="PATH",
                   help="dataset to read with Spark: a local path or any URI Spark reads (hdfs://, s3a://, ...)")
    g.add_argument("--format", default="parquet",
                   help="Spark data source of --data (and --validation-data): parquet (default), orc, json, csv, delta, ...")
    g.add_argument("--read-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option of the Spark reader, e.g. header=true; repeatable")
    _add_flag(g, table.option("features_col"))
    if label:
        _add_flag(g, table.option("label_col"))
        _add_flag(g, table.option("sample_weight_col"))
    _add_flag(g, table.option("preprocess"))


def needed_columns(args: argparse.Namespace, *columns, what: str = "training") -> List[str]:
    """The columns :func:`read_data` must find: those given (lists or names) and ``--sample-weight-col``.

    With ``--preprocess`` the features and labels name the function's output, which its dry run checks (naming what is
    missing), so none is required here. ``what="validation"`` leaves ``--sample-weight-col`` out: validation data is
    weighted only when it has the column, as in the API (:func:`sparkdl_avg.driver.data.staging.validation_weight_col`).
    """
    if getattr(args, "preprocess", None) is not None:
        return []
    weight = getattr(args, "sample_weight_col", None)
    if what == "validation":
        weight = None
    return [c for value in columns for c in as_list(value)] + ([weight] if weight else [])


def add_model_args(p: argparse.ArgumentParser, builder: bool = True) -> None:
    """``--model`` (a ``.keras`` file) and, for training, ``--model-builder``."""
    g = p.add_argument_group("model")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="PATH",
                     help="a saved Keras model (.keras; local path or pyarrow.fs URI); must be compiled for training")
    if builder:
        src.add_argument("--model-builder", metavar="MODULE:FUNCTION",
                         help="a Python function returning a compiled keras.Model, e.g. mymodels:build_cnn; "
                              "it gets seed=SEED if it has a 'seed' parameter. Ship the module (and custom "
                              "layers) to executors with --py-files")


def add_trainer_args(p: argparse.ArgumentParser) -> None:
    """Every ``ParameterAveragingTrainer`` option and ``fit`` option as a flag (from :data:`~sparkdl_avg.driver.config.options.OPTIONS`)."""
    g = p.add_argument_group("training (ParameterAveragingTrainer options)")
    for row in table.OPTIONS:
        if row.cli is not None and row.cli.group == "training":
            _add_flag(g, row)


def add_tracking_args(p: argparse.ArgumentParser) -> None:
    """The MLflow tracking flags (``--mlflow-experiment``, ...; :data:`~sparkdl_avg.driver.config.options.TRACKING` rows)."""
    g = p.add_argument_group("MLflow tracking (pip install 'sparkdl_avg[mlflow]')")
    for row in table.OPTIONS:
        if row.cli is not None and row.cli.group == "tracking":
            _add_flag(g, row)


def tracker(args: argparse.Namespace):
    """The ``MlflowLogger`` the tracking flags ask for, or ``None`` (no ``--mlflow*`` flag given)."""
    from ..observe import tracking

    return tracking.from_options({row.name: flag_value(args, row) for row in table.of(table.TRACKING)})


def _add_flag(group, row: "table.Option") -> None:
    """The flag of ``row``: kebab-case, its help and default (shown in the help when it takes a value)."""
    flag = row.cli
    kwargs: Dict[str, Any] = dict(dest=flag.dest or row.name)
    text = flag.help or row.help
    if flag.action in ("store_true", "store_false"):
        kwargs.update(action=flag.action)
    else:
        default = row.flag_default()
        kwargs.update(default=default, type=flag.type, choices=flag.choices, metavar=flag.metavar)
        if flag.action:
            kwargs.update(action=flag.action)
        shown = row.unset if default is None else default
        if shown != "" and "default" not in text:
            text = f"{text} (default: {shown})"
    group.add_argument(flag.flag or "--" + row.name.replace("_", "-"), help=text.replace("%", "%%"), **kwargs)


def flag_value(args: argparse.Namespace, row: "table.Option") -> Any:
    """The value of ``row``'s option given by the parsed flags (``--no-shuffle`` → ``shuffle=False``)."""
    value = getattr(args, row.cli.dest or row.name)
    return row.cli.to_option(value) if row.cli.to_option else value


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check-executors", dest="check_executors", action="store_false",
                   help="skip the check that executors can import sparkdl_avg and TensorFlow before training")


def trainer_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``ParameterAveragingTrainer`` options given by :func:`add_trainer_args`' flags."""
    return table.from_flat({row.name: flag_value(args, row) for row in table.of(table.TRAINER, table.RULE)})


def check_fit_flags(args: argparse.Namespace) -> Dict[str, Any]:
    """Runs the checks of the ``fit`` options given by flags, before Spark starts; returns those options.

    Errors name the option as the trainer does (``'epochs'``); :func:`run` names the flag (``--epochs``) when it prints
    them.
    """
    values = {row.name: flag_value(args, row) for row in table.of(table.FIT) if row.cli is not None}
    check_fit_args(getattr(args, "synchronization", "sync"), **values)
    return values


def flag_message(message: str) -> str:
    """Names the flag (``--batch-size``) where the trainer's message names its option (``'batch_size'``).

    Applies to every option with a flag (:func:`sparkdl_avg.driver.config.messages.flag_names`);
    ``The '<option>' parameter`` reads ``The <flag> flag``, and the API's ``fit(resume=True)``/``Pass resume=True`` read
    ``--resume``.
    """
    names = messages.flag_names()
    message = re.sub(r"\bfit\(resume=True\)|\bresume=True\b", "--resume", message)
    message = re.sub(
        r"\bThe '([a-z]+(?:_[a-z]+)*)' parameter\b",
        lambda m: f"The {names[m.group(1)]} flag" if m.group(1) in names else m.group(0),
        message,
    )
    return messages.rename(message, names, quote=False)


def columns(values: Optional[Sequence[str]], default: str) -> Union[str, List[str]]:
    """``--features-col a --features-col b`` or ``--features-col a,b`` → ``["a", "b"]``; one → ``"a"``."""
    names = [n.strip() for v in (values or [default]) for n in v.split(",") if n.strip()]
    if not names:
        raise UsageError(f"A column flag must name at least one column. Got {values!r} instead.")
    return names[0] if len(names) == 1 else names


def read_options(pairs: Sequence[str]) -> Dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--read-option must be KEY=VALUE. Got {pair!r} instead.")
        out[key.strip()] = value
    return out


# ---------------------------------------------------------------- running


def run(main: Callable[[Optional[Sequence[str]]], int], argv: Optional[Sequence[str]] = None) -> int:
    """Runs a job's ``main``; errors the user can fix become one line on stderr and exit status 2.

    A ``WorkerError`` (a task that failed on the cluster for a reason outside the data: a lost executor, a crashed
    Python worker) becomes one such line too, with exit status 1; Spark's own traces of it are kept off the console
    (:func:`spark_session`). A Ctrl-C (``KeyboardInterrupt``) ends the job with ``error: interrupted (Ctrl-C)`` and exit
    status 130, without the traceback of where the driver was.

    Options in the messages are named by their flags (:func:`flag_message`). Under spark-submit, ``sys.stderr`` is
    pointed at spark-submit's own stderr before anything else (:func:`stderr_past_spark_submit`). Then TensorFlow is
    imported, with its start-up notices filtered (:mod:`sparkdl_avg.shared.model.quiet`), so a job's output starts with
    its own lines.
    """
    from ...shared.model.quiet import import_tensorflow

    stderr_past_spark_submit()
    import_tensorflow(devices=True)
    try:
        return main(argv)
    except (UsageError, PathError, ConfigurationError, DataError, ExecutorEnvironmentError) as exc:
        _print_error(exc)
        return EXIT_USAGE
    except WorkerError as exc:  # its message names the job and the task's cause; no trace of Spark's below it
        _print_error(exc)
        return EXIT_FAILED
    except KeyboardInterrupt:  # the user's own Ctrl-C: where the driver was is no news to them
        print("error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _print_error(exc: Exception) -> None:
    """``exc``'s message as the job's one ``error:`` line on stderr, naming flags (:func:`flag_message`)."""
    print(f"error: {flag_message(' '.join(str(exc).split()))}", file=sys.stderr, flush=True)


class _JvmStderr(io.TextIOBase):
    """A text stream written to a Java ``PrintStream`` (the JVM's ``System.err``) through py4j.

    Writes that cannot go there (the gateway is gone, or a write from inside a py4j call: its own logging) go to
    ``fallback``, the previous stderr.
    """

    encoding = "utf-8"

    def __init__(self, stream, fallback) -> None:
        self._stream = stream
        self._fallback = fallback
        self._inside = threading.local()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self._send(lambda stream: stream.print(text), lambda: self._fallback.write(text))
        return len(text)

    def flush(self) -> None:
        self._send(lambda stream: stream.flush(), self._fallback.flush)

    def _send(self, call, fallback) -> None:
        if getattr(self._inside, "call", False):  # py4j writing to stderr while we wait on it
            fallback()
            return
        self._inside.call = True
        try:
            call(self._stream)
        except Exception:
            fallback()
        finally:
            self._inside.call = False


def stderr_past_spark_submit() -> None:
    """Under spark-submit, makes ``sys.stderr`` reach spark-submit's stderr rather than its stdout.

    spark-submit starts a Python application with the process's stderr merged into its stdout (Spark's ``PythonRunner``
    sets ``redirectErrorStream``), so a job's ``error: ...`` line, argparse's usage errors and tracebacks would land on
    stdout. The JVM that started this process still has its own stderr, ``System.err``, reached through the py4j gateway
    it opened for us (``PYSPARK_GATEWAY_PORT``); Python's writes to ``sys.stderr`` go there from now on, between Spark's
    own log lines. Native writes to file descriptor 2 (TensorFlow's C++ logging) still reach stdout. Does nothing
    elsewhere (``python job.py``, where stderr is its own) or when the gateway cannot be reached.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ or isinstance(sys.stderr, _JvmStderr):
        return
    try:
        if not os.path.samestat(os.fstat(1), os.fstat(2)):
            return
        from pyspark import SparkContext

        SparkContext._ensure_initialized()  # connects to spark-submit's JVM, as the session will
        err = SparkContext._jvm.java.lang.System.err
    except Exception:
        return
    sys.stderr = _JvmStderr(err, sys.stderr)


def spark_session(app_name: str):
    """The job's session, with the recommended settings (:func:`recommended_settings`), warming up in the background.

    A failed task's stack traces stay off the console at the default log level
    (:func:`sparkdl_avg.driver.runtime.session.quiet_task_failures`): the job's ``error:`` line says what failed.
    """
    from pyspark.sql import SparkSession

    from ..runtime.session import quiet_task_failures, warm_up

    spark = SparkSession.builder.appName(app_name).config(map=recommended_settings()).getOrCreate()
    quiet_task_failures(spark)
    warm_up(spark)
    return spark


def recommended_settings() -> Dict[str, str]:
    """Which of :data:`~sparkdl_avg.driver.runtime.session.RECOMMENDED_CONF` a job should set: those it has not set itself.

    The daemon is also left out when the job ships sparkdl_avg with ``--py-files`` (see :func:`daemon_applies`).
    """
    from pyspark import SparkConf, SparkContext

    from ..runtime.session import RECOMMENDED_CONF

    # Connects to spark-submit's JVM (or starts one), without which SparkConf cannot see its settings.
    SparkContext._ensure_initialized()
    conf = SparkConf()
    settings = {key: value for key, value in RECOMMENDED_CONF.items() if conf.get(key, None) is None}
    if not daemon_applies(conf.get("spark.python.daemon.module", None), conf.get("spark.submit.pyFiles", "")):
        settings.pop("spark.python.daemon.module", None)
    return settings


def daemon_applies(configured: Optional[str], py_files: str) -> bool:
    """Whether a job may set ``spark.python.daemon.module``: not set already, and sparkdl_avg is installed, not shipped."""
    shipped = any(os.path.basename(f.strip()).startswith("sparkdl_avg") for f in py_files.split(",") if f.strip())
    return configured is None and not shipped


def check_executors(spark, enabled: bool = True, preprocess=None) -> List[dict]:
    """The executors' Python descriptions (see :mod:`sparkdl_avg.driver.runtime.preflight`), or ``[]`` when disabled.

    With ``preprocess`` (``--preprocess``'s function) the executors also load it, so that a module they lack is named
    before any data is staged.
    """
    if not enabled:
        return []
    from ..runtime.preflight import check_executors as check

    return check(spark, preprocess=preprocess)


# ------------------------------------------------------------------- data


def read_data(spark, path: str, fmt: str, options: Dict[str, str], needed: Sequence[str], flag: str = "--data"):
    """Reads a DataFrame with Spark and checks that the ``needed`` columns exist.

    Args:
        path: What ``flag`` gave: a local path or any URI Spark reads.
        fmt: The Spark data source (``--format``).
        options: The reader's options (``--read-option``).
        needed: Columns the job uses.
        flag: The flag that gave ``path``, for the messages. Default ``"--data"``.

    Raises:
        UsageError: Spark cannot read ``path``; names the cause (the innermost Java exception, not the call that failed)
            and, for a filesystem Spark lacks, the package that brings it.
        DataError: a ``needed`` column is missing.
    """
    from ...shared.errors.remote_errors import root_cause

    try:
        df = spark.read.format(fmt).options(**options).load(path)
    except Exception as exc:
        cause = root_cause(exc)
        raise UsageError(f"Cannot read {flag} {path!r} as {fmt}: {cause}{_missing_filesystem_hint(spark, cause)}") from None
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise DataError(f"Column(s) {missing} not found in {path!r}; its columns are {df.columns}.")
    return df


def _missing_filesystem_hint(spark, cause: str) -> str:
    """What to add when ``cause`` says Spark has no Hadoop filesystem for S3 (else ``""``).

    Spark reads S3 as ``s3a://`` through hadoop-aws, which pyspark does not ship, and open-source Hadoop has no
    ``s3://`` at all. hadoop-aws's version must be the Hadoop version Spark runs on (asked of the driver's JVM; unknown
    under Spark Connect, whose client has none).
    """
    if "S3AFileSystem" not in cause and 'scheme "s3"' not in cause:
        return ""
    try:
        version = spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion()
    except Exception:  # Spark Connect: no JVM here
        version = "<the cluster's Hadoop version>"
    return (
        f". Spark reads S3 data as s3a:// through the hadoop-aws package, which this Spark does not have: pass "
        f"--packages org.apache.hadoop:hadoop-aws:{version} to spark-submit (or put its jar on the classpath) "
        "and give credentials in spark.hadoop.fs.s3a.* settings or the AWS_* variables (--model, --staging-dir, "
        "--checkpoint-dir and --output-dir need none of this: sparkdl_avg opens s3:// and s3a:// there with pyarrow)"
    )


def as_list(cols: Union[str, List[str]]) -> List[str]:
    return [cols] if isinstance(cols, str) else list(cols)


# ------------------------------------------------------------------ model


def load_model(path: Optional[str] = None, builder: Optional[str] = None, seed: Optional[int] = None, compiled: bool = True):
    """The model from a ``.keras`` file or a ``module:function`` builder.

    Raises:
        UsageError: the file or function cannot be loaded, or (``compiled``) the model is not compiled.
        PathError: no file at ``path``, or no filesystem opens it.
    """
    import keras

    if builder:
        module_name, sep, func_name = builder.partition(":")
        if not sep or not module_name or not func_name:
            raise UsageError(f"--model-builder must be MODULE:FUNCTION. Got {builder!r} instead.")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(
                f"Cannot import module {module_name!r} of --model-builder ({exc}); put it on the driver's path "
                "and ship it to executors with --py-files"
            ) from None
        fn = getattr(module, func_name, None)
        if not callable(fn):
            raise UsageError(f"Module {module_name!r} has no function {func_name!r} (--model-builder {builder})")
        kwargs = {}
        if seed is not None:  # initializers without a seed of their own draw from Keras' global generators
            keras.utils.set_random_seed(seed)
            if "seed" in inspect.signature(fn).parameters:
                kwargs["seed"] = seed
        model = fn(**kwargs)
        if not isinstance(model, keras.Model):
            raise UsageError(f"--model-builder {builder} returned {type(model).__name__}; expected a keras.Model")
    else:
        with fs.local_copy(path) as local:
            from ...shared.model.custom_objects import import_custom_modules

            import_custom_modules(local)  # modules of custom layers (on the driver's path: --py-files)
            try:
                model = keras.saving.load_model(local)
            except Exception as exc:
                raise UsageError(f"Cannot load the Keras model {path!r}: {type(exc).__name__}: {exc}") from None
    if compiled and not getattr(model, "compiled", False):
        raise UsageError("The model is not compiled; compile it (optimizer, loss, metrics) before saving or returning it")
    return model


def flags_dict(args: argparse.Namespace) -> Dict[str, Any]:
    """The parsed flags as JSON-friendly data, for metrics files (a function as ``module:name``, as given)."""
    def plain(value):
        if callable(value):
            return f"{getattr(value, '__module__', '')}:{getattr(value, '__qualname__', repr(value))}"
        return value

    return {k: plain(v) for k, v in vars(args).items()}
