"""The rows of ``fit``'s options (:data:`FIT_OPTIONS`) and of MLflow tracking (:data:`TRACKING_OPTIONS`).

Part of the one table, :data:`sparkdl_avg.driver.config.options.OPTIONS`, which lists them
after the trainer's rows; they are declared as those are (:mod:`.rows`). ``fit`` checks its
options with :func:`sparkdl_avg.driver.config.trainer_config.check_fit_args`; the tracking
rows make :class:`sparkdl_avg.driver.observe.tracking.MlflowLogger`'s signature and Args.
"""

from __future__ import annotations

import operator
from typing import Tuple

from .constraints import (Bool, BoolOrPath, ClassWeights, Ints, OneOf, PathText, RoundsOrEpoch, Text, class_weight_option,
                          class_weight_text, parse_class_weight, rounds_or_epoch)
from .rows import FIT, TRACKING, Flag, Option, SparkParam

#: ``fit``'s options that the CLI and the estimator expose (scope :data:`~.rows.FIT`).
FIT_OPTIONS: Tuple[Option, ...] = (
    Option(
        "epochs", 1, "int", scope=FIT,
        help="passes over the training data (with initial_epoch: the index of the epoch to stop before)",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("epochs", "toInt"),
    ),
    Option(
        "initial_epoch", 0, "int", scope=FIT,
        help="epoch at which to start, to continue an earlier fit (as in keras.Model.fit); must be below epochs",
        check=Ints(0),
        cli=Flag(type=int),
    ),
    Option(
        "features_col", "features", "Any", scope=FIT,
        help="features column(s): array<float/double> or ml Vector",
        cli=Flag(action="append", default=None, metavar="COL", group="data",
                 help="features column(s): array<float/double> or ml Vector; for a model with several inputs "
                      "repeat the flag or give a comma list, in the order of model.inputs (default: features)"),
        param=SparkParam("featuresCol", "toString", shared=True),
    ),
    Option(
        "label_col", "label", "Any", scope=FIT,
        help="label column(s)",
        cli=Flag(action="append", default=None, metavar="COL", group="data",
                 help="label column(s); several for a model with several outputs (default: label)"),
        param=SparkParam("labelCol", "toString", shared=True),
    ),
    Option(
        "shuffle", True, "bool", scope=FIT,
        help="shuffle the examples every epoch",
        check=Bool(),
        cli=Flag("--no-shuffle", action="store_true", dest="no_shuffle", to_option=operator.not_,
                 help="keep the data's order instead of shuffling each epoch"),
        param=SparkParam("shuffle", "toBoolean"),
    ),
    Option(
        "verbose", "auto", "Any", scope=FIT,
        help="0 silent, 1 progress bar, 2 one line per epoch",
        check=OneOf(("auto", 0, 1, 2)),
        cli=Flag(type=int, choices=(0, 1, 2), default=2),
        param=SparkParam("verbose", "toInt", default=0),
    ),
    Option(
        "checkpoint_dir", None, "Optional[str]", scope=FIT,
        help="write atomic checkpoints there (new or empty directory, or this run's checkpoints)",
        check=PathText(),
        cli=Flag(metavar="PATH_OR_URI"),
        param=SparkParam("checkpointDir", "toString"),
    ),
    Option(
        "checkpoint_every", "epoch", "Any", scope=FIT,
        help="'epoch' or a number of rounds",
        check=RoundsOrEpoch(),
        cli=Flag(to_option=rounds_or_epoch),
        param=SparkParam("checkpointEvery", "identity"),
    ),
    Option(
        "resume", False, "Any", scope=FIT,
        help="continue from the latest checkpoint in --checkpoint-dir, if there is one",
        check=BoolOrPath(),
        cli=Flag(action="store_true"),
        param=SparkParam("resume", "identity"),
    ),
    Option(
        "sample_weight_col", None, "Optional[str]", scope=FIT,
        help="column of each example's weight in the loss (Keras' sample_weight)",
        unset="every example weighs 1",
        check=Text("a column name"),
        cli=Flag(metavar="COL", group="data"),
        param=SparkParam("weightCol", "toString", shared=True),
    ),
    Option(
        "class_weight", None, "Optional[dict]", scope=FIT,
        help="weight of each class in the loss, as Keras' class_weight ({class index: weight}; a flag: 0=1,1=5)",
        unset="every class weighs 1",
        check=ClassWeights(),
        cli=Flag(metavar="CLASS=WEIGHT,...", type=parse_class_weight),
        # text in the stage (JSON metadata keeps no int keys): a dict or "0=1,1=5" given, "0=1.0,1=5.0" kept
        param=SparkParam("classWeight", class_weight_text, to_option=class_weight_option),
    ),
)

#: MLflow tracking of a fit (:class:`sparkdl_avg.driver.observe.tracking.MlflowLogger`; scope :data:`~.rows.TRACKING`).
TRACKING_OPTIONS: Tuple[Option, ...] = (
    Option(
        "mlflow", False, "bool", scope=TRACKING,
        help="log the fit to MLflow (also on when an experiment, tracking URI or run name is given)",
        doc="Log the fit to MLflow: into the active run, else into a new run of ``experiment``. The "
            "jobs and the estimator only; an ``MlflowLogger`` in ``callbacks`` is this switch for the trainer.",
        check=Bool(),
        cli=Flag(action="store_true", group="tracking"),
        param=SparkParam("mlflowTracking", "toBoolean"),
    ),
    Option(
        "experiment", None, "Optional[str]", scope=TRACKING,
        help="MLflow experiment of the run (created if missing)",
        unset="the active run's, else MLflow's (MLFLOW_EXPERIMENT_NAME / _ID, or 'Default')",
        doc="Name of the MLflow experiment a new run goes into, created if it does not exist. Default "
            "``None``: the active run's, else MLflow's current experiment (``mlflow.set_experiment``, "
            "``MLFLOW_EXPERIMENT_NAME``/``_ID``, else ``\"Default\"``).",
        check=Text(),
        cli=Flag("--mlflow-experiment", metavar="NAME", group="tracking"),
        param=SparkParam("mlflowExperiment", "toString"),
    ),
    Option(
        "tracking_uri", None, "Optional[str]", scope=TRACKING,
        help="MLflow tracking URI (http://host:5000, sqlite:///mlflow.db, databricks)",
        unset="MLflow's (mlflow.set_tracking_uri, MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
        doc="Where the run is tracked: a tracking server (``http://host:5000``), a database "
            "(``sqlite:///mlflow.db``) or ``databricks``. Default ``None``: MLflow's current tracking URI "
            "(``mlflow.set_tracking_uri``, ``MLFLOW_TRACKING_URI``). Only this logger uses it; MLflow's "
            "global setting is not changed.",
        check=Text(),
        cli=Flag("--mlflow-tracking-uri", metavar="URI", group="tracking"),
        param=SparkParam("mlflowTrackingUri", "toString"),
    ),
    Option(
        "run_name", None, "Optional[str]", scope=TRACKING,
        help="name of a new MLflow run",
        unset="MLflow's generated name",
        doc="Name of the new run (not used when logging into the active run or resuming one). Default "
            "``None``: MLflow generates one.",
        check=Text(),
        cli=Flag("--mlflow-run-name", metavar="NAME", group="tracking"),
        param=SparkParam("mlflowRunName", "toString"),
    ),
    Option(
        "log_model", True, "bool", scope=TRACKING,
        help="log the trained model (Keras flavour, with its signature), stats.json and report.html at the end",
        doc="At the end of a fit, log the trained model in MLflow's Keras flavour (artifact ``model``, "
            "with an input/output tensor signature; ``mlflow.keras.load_model(\"runs:/<id>/model\")``) "
            "and the ``stats.json`` and ``report.html`` artifacts. Default True.",
        check=Bool(),
        cli=Flag("--mlflow-no-log-model", action="store_false", dest="log_model", group="tracking",
                 help="do not log the trained model, stats.json and report.html to MLflow"),
        param=SparkParam("mlflowLogModel", "toBoolean"),
    ),
)
