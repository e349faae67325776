"""Plumbing shared by the spark-submit jobs in ``jobs/``: flags, models, data, output directories.

The jobs (``jobs/train.py``, ``jobs/evaluate.py``, ``jobs/predict.py``) stay
thin: they declare their flags with the ``add_*`` helpers here, read data
with :func:`read_data`, get the model from :func:`load_model`, and write
results through :class:`OutputDir`, which never leaves a half-written
directory behind. :func:`run` turns the errors a user can fix (bad flags,
bad data, executors without the package) into one line on stderr and exit
status 2.

Paths may be local or URIs: data is read by Spark (anything its readers
accept: ``hdfs://``, ``s3a://``, ``abfss://``, ...), model files and the
output directory go through ``pyarrow.fs`` (local, ``hdfs://``, ``s3://``,
``gs://``; ``s3a://`` is read as ``s3://``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import pyarrow.fs as pafs

from .errors import ConfigurationError, DataError
from .preflight import ExecutorEnvironmentError

EXIT_USAGE = 2


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
    g.add_argument("--features-col", action="append", default=None, metavar="COL",
                   help="features column(s): array<float/double> or ml Vector; for a model with several inputs "
                        "repeat the flag or give a comma list, in the order of model.inputs (default: features)")
    if label:
        g.add_argument("--label-col", action="append", default=None, metavar="COL",
                       help="label column(s); several for a model with several outputs (default: label)")


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
    """Every ``ParameterAveragingTrainer`` option and ``fit`` option as a flag."""
    g = p.add_argument_group("training (ParameterAveragingTrainer options)")
    g.add_argument("--epochs", type=int, default=1, help="passes over the training data (default 1)")
    g.add_argument("--num-workers", type=int, default=None,
                   help="replicas per round, one Spark task each (default: Spark's defaultParallelism)")
    g.add_argument("--batch-size", type=int, default=32, help="examples per minibatch, per worker (default 32)")
    g.add_argument("--averaging-frequency", type=int, default=8,
                   help="minibatches each worker trains between averagings (default 8)")
    g.add_argument("--aggregation-depth", type=int, default=2, help="depth of the treeAggregate (default 2)")
    g.add_argument("--optimizer-state", default="average",
                   help="'average' (average optimizer variables, default) or 'reset' (fresh each round)")
    g.add_argument("--update-rule", default="average",
                   help="how the average becomes the next weights: average (default), bmuf, bmuf_nesterov, slowmo")
    g.add_argument("--block-momentum", type=float, default=None,
                   help="BMUF's eta (default 1 - 1/num-workers) or SlowMo's beta (default 0.5)")
    g.add_argument("--block-lr", type=float, default=1.0, help="BMUF's zeta or SlowMo's alpha (default 1)")
    g.add_argument("--on-nonfinite", default="raise",
                   help="a replica with NaN/Inf loss or weights: 'raise' (stop, keep the last good weights; "
                        "default) or 'skip' (leave it out of that round's average)")
    g.add_argument("--no-check-data", dest="check_data", action="store_false",
                   help="skip the NaN/Inf and label-range checks made while staging")
    g.add_argument("--state-transport", default="auto", choices=("auto", "spark", "files"),
                   help="how each round's weights reach workers and their sums the driver: 'spark' (broadcast + "
                        "treeAggregate), 'files' (files under --staging-dir), 'auto' (files when all executors "
                        "run on the driver's host, default)")
    g.add_argument("--checkpoint-dir", default=None, metavar="PATH_OR_URI",
                   help="write atomic checkpoints there (new or empty directory, or this run's checkpoints)")
    g.add_argument("--checkpoint-every", default="epoch",
                   help="'epoch' (default) or a number of rounds")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir, if there is one")
    g.add_argument("--seed", type=int, default=None,
                   help="seed of the data order (and of --model-builder, --validation-split); default: random")
    g.add_argument("--staging-dir", default=None, metavar="PATH_OR_URI",
                   help="where the data is staged once per fit; on a multi-host cluster a filesystem every executor "
                        "reads (hdfs://..., s3://...). Default: the system temp dir")
    g.add_argument("--no-shuffle", action="store_true", help="keep the data's order instead of shuffling each epoch")
    g.add_argument("--verbose", type=int, choices=(0, 1, 2), default=2,
                   help="0 silent, 1 progress bar, 2 one line per epoch (default 2)")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check-executors", dest="check_executors", action="store_false",
                   help="skip the check that executors can import sparkdl_avg and TensorFlow before training")


def trainer_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``ParameterAveragingTrainer`` options given by :func:`add_trainer_args`' flags."""
    from .rules import rule_from_name

    return dict(
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        averaging_frequency=args.averaging_frequency,
        aggregation_depth=args.aggregation_depth,
        optimizer_state=args.optimizer_state,
        update_rule=rule_from_name(args.update_rule, args.block_momentum, args.block_lr),
        seed=args.seed,
        staging_dir=args.staging_dir,
        on_nonfinite=args.on_nonfinite,
        check_data=args.check_data,
        state_transport=args.state_transport,
    )


def checkpoint_every(value: str) -> Union[str, int]:
    """``--checkpoint-every``: ``"epoch"`` or an int (validated by the trainer)."""
    if value == "epoch":
        return value
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--checkpoint-every must be 'epoch' or a number of rounds. Got {value!r} instead.") from None


def columns(values: Optional[Sequence[str]], default: str) -> Union[str, List[str]]:
    """``--features-col a --features-col b`` or ``--features-col a,b`` → ``["a", "b"]``; one → ``"a"``."""
    names = [n.strip() for v in (values or [default]) for n in v.split(",") if n.strip()]
    if not names:
        raise UsageError(f"Expected at least one column name. Received: {values!r}")
    return names[0] if len(names) == 1 else names


def read_options(pairs: Sequence[str]) -> Dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"Expected --read-option KEY=VALUE. Received: {pair!r}")
        out[key.strip()] = value
    return out


# ---------------------------------------------------------------- running


def run(main: Callable[[Optional[Sequence[str]]], int], argv: Optional[Sequence[str]] = None) -> int:
    """Runs a job's ``main``; errors the user can fix become one line on stderr and exit status 2."""
    try:
        return main(argv)
    except (UsageError, ConfigurationError, DataError, ExecutorEnvironmentError) as exc:
        message = " ".join(str(exc).split())
        print(f"error: {message}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def spark_session(app_name: str):
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app_name).getOrCreate()
    return spark


def check_executors(spark, enabled: bool = True) -> List[dict]:
    """The executors' Python descriptions (see :mod:`sparkdl_avg.preflight`), or ``[]`` when disabled."""
    if not enabled:
        return []
    from .preflight import check_executors as check

    return check(spark.sparkContext)


# ------------------------------------------------------------------- data


def read_data(spark, path: str, fmt: str, options: Dict[str, str], needed: Sequence[str]):
    """Reads a DataFrame with Spark and checks that the ``needed`` columns exist."""
    try:
        df = spark.read.format(fmt).options(**options).load(path)
    except Exception as exc:
        first = next((line for line in str(exc).strip().splitlines() if line.strip()), type(exc).__name__)
        raise UsageError(f"Cannot read --data {path!r} as {fmt}: {first}") from None
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise DataError(f"Column(s) {missing} not found in {path!r}. Received columns: {df.columns}")
    return df


def as_list(cols: Union[str, List[str]]) -> List[str]:
    return [cols] if isinstance(cols, str) else list(cols)


# ------------------------------------------------------------------ files


def resolve(uri: str):
    """``(filesystem, path)`` for a local path or a ``pyarrow.fs`` URI (``s3a://`` read as ``s3://``)."""
    if uri.startswith(("s3a://", "s3n://")):
        uri = "s3://" + uri.split("://", 1)[1]
    if "://" in uri and not uri.startswith("file://"):
        try:
            return pafs.FileSystem.from_uri(uri)
        except Exception as exc:
            raise UsageError(f"Cannot open {uri!r} with pyarrow.fs: {exc}") from None
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def _exists(fs, path: str) -> bool:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return False
    if info.type == pafs.FileType.Directory:
        return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
    return True


@contextlib.contextmanager
def local_copy(uri: str):
    """Yields a local path holding the file at ``uri`` (the path itself when local)."""
    fs, path = resolve(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        if not os.path.isfile(path):
            raise UsageError(f"No such file: {uri!r}")
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="sparkdl_avg-model-")
    try:
        local = os.path.join(tmp, os.path.basename(path) or "model.keras")
        try:
            with fs.open_input_stream(path) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        except FileNotFoundError:
            raise UsageError(f"No such file: {uri!r}") from None
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(path: Optional[str] = None, builder: Optional[str] = None, seed: Optional[int] = None, compiled: bool = True):
    """The model from a ``.keras`` file or a ``module:function`` builder.

    Raises:
        UsageError: the file or function cannot be loaded, or (``compiled``)
            the model is not compiled.
    """
    import keras

    if builder:
        module_name, sep, func_name = builder.partition(":")
        if not sep or not module_name or not func_name:
            raise UsageError(f"Expected --model-builder MODULE:FUNCTION. Received: {builder!r}")
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
        if seed is not None and "seed" in inspect.signature(fn).parameters:
            kwargs["seed"] = seed
        model = fn(**kwargs)
        if not isinstance(model, keras.Model):
            raise UsageError(f"--model-builder {builder} returned {type(model).__name__}; expected a keras.Model")
    else:
        with local_copy(path) as local:
            from .custom_objects import import_custom_modules

            import_custom_modules(local)  # modules of custom layers (on the driver's path: --py-files)
            try:
                model = keras.saving.load_model(local)
            except Exception as exc:
                raise UsageError(f"Cannot load the Keras model {path!r}: {type(exc).__name__}: {exc}") from None
    if compiled and not getattr(model, "compiled", False):
        raise UsageError("The model is not compiled; compile it (optimizer, loss, metrics) before saving or returning it")
    return model


class OutputDir:
    """An output directory written all at once: files go to a temporary directory, then into place.

    :meth:`check` fails early (before any training) when the directory exists
    and ``overwrite`` is off. :meth:`commit` uploads the files to a hidden
    sibling ``.<name>.tmp-<id>`` and renames it into place; with
    ``overwrite`` an existing directory is renamed away first and deleted
    after. On filesystems without directory renames (object stores) the
    files are copied one by one (each appears whole) and ``_SUCCESS`` last.

    Args:
        uri: Local path or ``pyarrow.fs`` URI.
        overwrite: Replace an existing non-empty directory.
    """

    def __init__(self, uri: str, overwrite: bool = False) -> None:
        self.uri = uri
        self.overwrite = overwrite
        self.fs, self.path = resolve(uri)
        self.local = tempfile.mkdtemp(prefix="sparkdl_avg-output-")

    def check(self) -> None:
        if not self.overwrite and _exists(self.fs, self.path):
            raise UsageError(f"Output directory {self.uri!r} already exists; pass --overwrite to replace it")

    def file(self, name: str) -> str:
        """The local path to write ``name`` to before :meth:`commit`."""
        return os.path.join(self.local, name)

    def write_json(self, name: str, data: Any) -> None:
        with open(self.file(name), "w") as f:
            json.dump(data, f, indent=1, default=str)

    def commit(self) -> str:
        self.check()
        fs, path = self.fs, self.path
        parent, base = os.path.split(path.rstrip("/"))
        tmp = f"{parent}/.{base}.tmp-{uuid.uuid4().hex[:12]}"
        renames = isinstance(fs, pafs.LocalFileSystem) or type(fs).__name__ == "HadoopFileSystem"
        if not renames:
            fs.create_dir(path, recursive=True)
            names = sorted(os.listdir(self.local))
            for name in names:
                pafs.copy_files(os.path.join(self.local, name), f"{path}/{name}", destination_filesystem=fs)
            with fs.open_output_stream(f"{path}/_SUCCESS"):
                pass
            self.cleanup()
            return self.uri
        fs.create_dir(parent, recursive=True)
        if isinstance(fs, pafs.LocalFileSystem):
            shutil.copytree(self.local, tmp)
        else:
            pafs.copy_files(self.local, tmp, destination_filesystem=fs)
        old = None
        try:
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                old = f"{parent}/.{base}.old-{uuid.uuid4().hex[:12]}"
                fs.move(path, old)
            fs.move(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.delete_dir(tmp)
            if old is not None and fs.get_file_info(path).type == pafs.FileType.NotFound:
                fs.move(old, path)
            raise
        if old is not None:
            with contextlib.suppress(Exception):
                fs.delete_dir(old)
        self.cleanup()
        return self.uri

    def cleanup(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)


def write_file_atomically(uri: str, data: bytes, overwrite: bool = False) -> None:
    """Writes one file (local or URI) whole: temporary name, then rename."""
    fs, path = resolve(uri)
    if not overwrite and fs.get_file_info(path).type != pafs.FileType.NotFound:
        raise UsageError(f"{uri!r} already exists; pass --overwrite to replace it")
    parent = os.path.dirname(path)
    if parent:
        fs.create_dir(parent, recursive=True)
    tmp = f"{parent}/.{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, path)


def flags_dict(args: argparse.Namespace) -> Dict[str, Any]:
    """The parsed flags as JSON-friendly data, for metrics files."""
    return {k: v for k, v in vars(args).items()}
