"""Spark ML layer: the trainer as an ``Estimator`` and the trained model as a ``Model``.

``KerasAveragingEstimator`` is one more stage of a ``pyspark.ml.Pipeline``
(after ``VectorAssembler``, ``StandardScaler``, ``StringIndexer``, ...); its
``fit`` trains a fresh copy of the given Keras model with
:class:`~sparkdl_avg.ParameterAveragingTrainer` — whose validator checks every
parameter, on the driver, before any Spark job — and returns a
``KerasAveragingModel`` whose ``transform`` adds predictions on the executors.

Both stages are ``MLWritable``/``MLReadable``: the params as Spark ML's JSON
metadata, the Keras model as ``model.keras`` in the stage's directory (loaded
in Keras' safe mode), on any filesystem Spark's own writers accept. A fitted
``PipelineModel`` containing them saves and loads like any other.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasAggregationDepth,
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasSeed,
)
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from . import hadoopfs
from .errors import ConfigurationError, DataError
from .modelspec import keras_from_bytes, keras_to_bytes
from .rules import rule_from_name

KERAS_FILE = "model.keras"

_SNAKE_TO_PARAM = {
    "num_workers": "numWorkers",
    "batch_size": "batchSize",
    "averaging_frequency": "averagingFrequency",
    "aggregation_depth": "aggregationDepth",
    "optimizer_state": "optimizerState",
    "update_rule": "updateRule",
    "block_momentum": "blockMomentum",
    "slow_momentum": "blockMomentum",
    "block_lr": "blockLearningRate",
    "slow_lr": "blockLearningRate",
    "staging_dir": "stagingDir",
    "epochs": "epochs",
    "verbose": "verbose",
    "seed": "seed",
    "features_col": "featuresCol(s)",
    "label_col": "labelCol(s)",
}


class _KerasParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """Params shared by the estimator and the model."""

    inferenceBatchSize = Param(
        Params._dummy(),
        "inferenceBatchSize",
        "examples per predict_on_batch call on the executors (>= 1)",
        typeConverter=TypeConverters.toInt,
    )
    featuresCols = Param(
        Params._dummy(),
        "featuresCols",
        "features columns, one per model input (models with several inputs); overrides featuresCol",
        typeConverter=TypeConverters.toListString,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inferenceBatchSize=1024)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)

    def getFeaturesCols(self):
        return self.getOrDefault(self.featuresCols)

    def _features(self):
        """``featuresCols`` when set, else ``featuresCol``."""
        return self.getFeaturesCols() if self.isSet(self.featuresCols) else self.getFeaturesCol()


class _KerasStage:
    """Holds the Keras model of a stage as ``.keras`` bytes (what persistence writes)."""

    _keras_bytes: Optional[bytes] = None

    def _set_keras(self, model: Any) -> None:
        import keras

        if model is None:
            self._keras_bytes = None
        elif isinstance(model, (bytes, bytearray)):
            self._keras_bytes = bytes(model)
        elif isinstance(model, str):
            from pyspark import SparkContext

            sc = SparkContext._active_spark_context
            if sc is None:
                raise ConfigurationError("Loading a Keras model from a path needs an active SparkSession.")
            self._keras_bytes = hadoopfs.read_bytes(sc, model)
        elif isinstance(model, keras.Model):
            from .config import validate_model

            validate_model(model)
            self._keras_bytes = keras_to_bytes(model)
        else:
            raise ConfigurationError(
                "Expected 'kerasModel' to be a compiled keras.Model or the path of a .keras file. "
                f"Received: {type(model).__name__}."
            )

    def getKerasModel(self):
        """A new ``keras.Model`` loaded from the stage's model (each call loads a fresh copy)."""
        if self._keras_bytes is None:
            raise ConfigurationError("This stage has no Keras model; call setKerasModel(model) first.")
        return keras_from_bytes(self._keras_bytes)

    def write(self) -> MLWriter:
        return _KerasStageWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _KerasStageReader(cls)


class _KerasStageWriter(MLWriter):
    def __init__(self, instance: _KerasStage) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        if self.instance._keras_bytes is None:
            raise ConfigurationError("Cannot save a stage without a Keras model; call setKerasModel(model) first.")
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sc)
        hadoopfs.write_bytes(self.sc, path.rstrip("/") + "/" + KERAS_FILE, self.instance._keras_bytes)


class _KerasStageReader(MLReader):
    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._keras_bytes = hadoopfs.read_bytes(self.sc, path.rstrip("/") + "/" + KERAS_FILE)
        return instance


class KerasAveragingEstimator(
    _KerasStage, Estimator, _KerasParams, HasLabelCol, HasSeed, HasAggregationDepth, MLWritable, MLReadable
):
    """Trains a compiled Keras model by parameter averaging as a Spark ML ``Estimator``.

    Args (keyword-only, Spark style):
        kerasModel: A compiled ``keras.Model`` or the path of a ``.keras``
            file (any filesystem Spark reads). Each ``fit`` trains a fresh
            copy of it, so the estimator can be fitted again or tuned.
        featuresCol: Features column (numeric array or Vector). Default "features".
        labelCol: Label column (number, array or Vector). Default "label".
        featuresCols: One features column per model input, for models with
            several inputs (overrides featuresCol).
        labelCols: One label column per model output, for models with
            several outputs (overrides labelCol).
        predictionCol: Output column of the fitted model. Default "prediction".
        probabilityCol: Output column of class probabilities. Default "probability".
        numWorkers: Replicas per round; unset = Spark's defaultParallelism.
        batchSize: Examples per minibatch per worker. Default 32.
        averagingFrequency: Minibatches per worker between averagings. Default 8.
        aggregationDepth: treeAggregate depth. Default 2.
        optimizerState: "average" or "reset". Default "average".
        updateRule: "average" (plain averaging), "bmuf", "bmuf_nesterov" or
            "slowmo" (see :mod:`sparkdl_avg.rules`). Default "average".
        blockMomentum: The rule's momentum: BMUF's ``η`` (unset: ``1 −
            1/numWorkers``) or SlowMo's ``β`` (unset: 0.5).
        blockLearningRate: BMUF's ``ζ`` or SlowMo's ``α``. Default 1.0.
        epochs: Passes over the data. Default 1.
        seed: Seed of the data order.
        stagingDir: Where data is staged (see the trainer); unset = temp dir.
        shuffle: Shuffle the examples every epoch. Default True.
        verbose: 0, 1 or 2 as in the trainer. Default 0.
        inferenceBatchSize: Examples per predict call in transform. Default 1024.
    """

    numWorkers = Param(Params._dummy(), "numWorkers", "replicas per round (>= 1); unset: defaultParallelism", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "examples per minibatch per worker (>= 1)", typeConverter=TypeConverters.toInt)
    averagingFrequency = Param(Params._dummy(), "averagingFrequency", "minibatches per worker between averagings (>= 1)", typeConverter=TypeConverters.toInt)
    optimizerState = Param(Params._dummy(), "optimizerState", "'average' or 'reset'", typeConverter=TypeConverters.toString)
    updateRule = Param(Params._dummy(), "updateRule", "'average', 'bmuf', 'bmuf_nesterov' or 'slowmo'", typeConverter=TypeConverters.toString)
    blockMomentum = Param(Params._dummy(), "blockMomentum", "block momentum in [0, 1): BMUF's eta (unset: 1 - 1/numWorkers) or SlowMo's beta (unset: 0.5)", typeConverter=TypeConverters.toFloat)
    blockLearningRate = Param(Params._dummy(), "blockLearningRate", "block learning rate > 0: BMUF's zeta or SlowMo's alpha", typeConverter=TypeConverters.toFloat)
    epochs = Param(Params._dummy(), "epochs", "passes over the data (>= 1)", typeConverter=TypeConverters.toInt)
    stagingDir = Param(Params._dummy(), "stagingDir", "staging directory (path or pyarrow.fs URI)", typeConverter=TypeConverters.toString)
    shuffle = Param(Params._dummy(), "shuffle", "shuffle the examples every epoch", typeConverter=TypeConverters.toBoolean)
    verbose = Param(Params._dummy(), "verbose", "0 silent, 1 progress bar, 2 one line per epoch", typeConverter=TypeConverters.toInt)
    labelCols = Param(
        Params._dummy(),
        "labelCols",
        "label columns, one per model output (models with several outputs); overrides labelCol",
        typeConverter=TypeConverters.toListString,
    )

    @keyword_only
    def __init__(
        self,
        *,
        kerasModel: Any = None,
        featuresCol: str = "features",
        labelCol: str = "label",
        featuresCols: Optional[list] = None,
        labelCols: Optional[list] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        numWorkers: Optional[int] = None,
        batchSize: int = 32,
        averagingFrequency: int = 8,
        aggregationDepth: int = 2,
        optimizerState: str = "average",
        updateRule: str = "average",
        blockMomentum: Optional[float] = None,
        blockLearningRate: float = 1.0,
        epochs: int = 1,
        seed: Optional[int] = None,
        stagingDir: Optional[str] = None,
        shuffle: bool = True,
        verbose: int = 0,
        inferenceBatchSize: int = 1024,
    ) -> None:
        super().__init__()
        self._setDefault(
            batchSize=32, averagingFrequency=8, aggregationDepth=2, optimizerState="average",
            updateRule="average", blockLearningRate=1.0, epochs=1, shuffle=True, verbose=0,
        )
        kwargs = dict(self._input_kwargs)
        self._set_keras(kwargs.pop("kerasModel", None))
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def setKerasModel(self, value: Any) -> "KerasAveragingEstimator":
        self._set_keras(value)
        return self

    def setFeaturesCol(self, value: str) -> "KerasAveragingEstimator":
        return self._set(featuresCol=value)

    def setLabelCol(self, value: str) -> "KerasAveragingEstimator":
        return self._set(labelCol=value)

    def setFeaturesCols(self, value: list) -> "KerasAveragingEstimator":
        return self._set(featuresCols=value)

    def setLabelCols(self, value: list) -> "KerasAveragingEstimator":
        return self._set(labelCols=value)

    def getLabelCols(self):
        return self.getOrDefault(self.labelCols)

    def setPredictionCol(self, value: str) -> "KerasAveragingEstimator":
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> "KerasAveragingEstimator":
        return self._set(probabilityCol=value)

    def setNumWorkers(self, value: int) -> "KerasAveragingEstimator":
        return self._set(numWorkers=value)

    def setBatchSize(self, value: int) -> "KerasAveragingEstimator":
        return self._set(batchSize=value)

    def setAveragingFrequency(self, value: int) -> "KerasAveragingEstimator":
        return self._set(averagingFrequency=value)

    def setAggregationDepth(self, value: int) -> "KerasAveragingEstimator":
        return self._set(aggregationDepth=value)

    def setOptimizerState(self, value: str) -> "KerasAveragingEstimator":
        return self._set(optimizerState=value)

    def setUpdateRule(self, value: str) -> "KerasAveragingEstimator":
        return self._set(updateRule=value)

    def setBlockMomentum(self, value: float) -> "KerasAveragingEstimator":
        return self._set(blockMomentum=value)

    def setBlockLearningRate(self, value: float) -> "KerasAveragingEstimator":
        return self._set(blockLearningRate=value)

    def setEpochs(self, value: int) -> "KerasAveragingEstimator":
        return self._set(epochs=value)

    def setSeed(self, value: int) -> "KerasAveragingEstimator":
        return self._set(seed=value)

    def setStagingDir(self, value: str) -> "KerasAveragingEstimator":
        return self._set(stagingDir=value)

    def setShuffle(self, value: bool) -> "KerasAveragingEstimator":
        return self._set(shuffle=value)

    def setVerbose(self, value: int) -> "KerasAveragingEstimator":
        return self._set(verbose=value)

    def setInferenceBatchSize(self, value: int) -> "KerasAveragingEstimator":
        return self._set(inferenceBatchSize=value)

    def _trainer_options(self) -> dict:
        """The trainer's constructor options from the params."""
        options = {
            "batch_size": self.getOrDefault(self.batchSize),
            "averaging_frequency": self.getOrDefault(self.averagingFrequency),
            "aggregation_depth": self.getOrDefault(self.aggregationDepth),
            "optimizer_state": self.getOrDefault(self.optimizerState),
            "update_rule": rule_from_name(
                self.getOrDefault(self.updateRule),
                self.getOrDefault(self.blockMomentum) if self.isDefined(self.blockMomentum) else None,
                self.getOrDefault(self.blockLearningRate),
            ),
            "num_workers": self.getOrDefault(self.numWorkers) if self.isDefined(self.numWorkers) else None,
            "staging_dir": self.getOrDefault(self.stagingDir) if self.isDefined(self.stagingDir) else None,
        }
        if self.isSet(self.seed):
            options["seed"] = self.getOrDefault(self.seed)
        else:  # Spark's default seed is a (possibly negative) hash of the class name
            options["seed"] = self.getOrDefault(self.seed) & 0x7FFFFFFF
        return options

    def _fit(self, dataset):
        from .trainer import ParameterAveragingTrainer

        model = self.getKerasModel()
        try:
            trainer = ParameterAveragingTrainer(model, **self._trainer_options())
            with trainer:
                history = trainer.fit(
                    dataset,
                    epochs=self.getOrDefault(self.epochs),
                    features_col=self._features(),
                    label_col=self.getLabelCols() if self.isSet(self.labelCols) else self.getLabelCol(),
                    verbose=self.getOrDefault(self.verbose),
                    shuffle=self.getOrDefault(self.shuffle),
                )
        except (ConfigurationError, DataError) as exc:
            raise type(exc)(_camel_case_message(str(exc))) from None
        fitted = KerasAveragingModel(kerasModel=model)
        fitted.history = history.history
        fitted.stats = trainer.stats
        self._copyValues(fitted)
        return fitted


def _camel_case_message(message: str) -> str:
    """Names the Spark param (``'batchSize'``) where the trainer's message names its option."""
    return re.sub(
        r"'([a-z]+(?:_[a-z]+)+)'",
        lambda m: f"'{_SNAKE_TO_PARAM.get(m.group(1), m.group(1))}'",
        message,
    )


class KerasAveragingModel(_KerasStage, Model, _KerasParams, MLWritable, MLReadable):
    """A trained Keras model as a Spark ML ``Model``: ``transform`` adds its predictions.

    ``transform`` keeps every input column and adds ``predictionCol`` (class
    index as a double for models compiled with a cross-entropy loss, else the
    value or values) and, for classifiers, ``probabilityCol`` (a
    ``DenseVector``), computed on the executors in Arrow batches.

    Attributes:
        history: Per-epoch logs of the fit that produced the model (not persisted).
        stats: The trainer's round records of that fit (not persisted).
    """

    @keyword_only
    def __init__(
        self,
        *,
        kerasModel: Any = None,
        featuresCol: str = "features",
        featuresCols: Optional[list] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        inferenceBatchSize: int = 1024,
    ) -> None:
        super().__init__()
        kwargs = {k: v for k, v in self._input_kwargs.items() if v is not None}
        self._set_keras(kwargs.pop("kerasModel", None))
        self._set(**kwargs)
        self.history = None
        self.stats = None
        self._loaded = None

    def setFeaturesCol(self, value: str) -> "KerasAveragingModel":
        return self._set(featuresCol=value)

    def setFeaturesCols(self, value: list) -> "KerasAveragingModel":
        return self._set(featuresCols=value)

    def setPredictionCol(self, value: str) -> "KerasAveragingModel":
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> "KerasAveragingModel":
        return self._set(probabilityCol=value)

    def setInferenceBatchSize(self, value: int) -> "KerasAveragingModel":
        return self._set(inferenceBatchSize=value)

    @property
    def kerasModel(self):
        """The trained ``keras.Model`` (loaded once and kept)."""
        if getattr(self, "_loaded", None) is None:
            self._loaded = self.getKerasModel()
        return self._loaded

    def _transform(self, dataset):
        from .config import check_int
        from .inference import add_predictions

        batch = self.getInferenceBatchSize()
        try:
            check_int("inference_batch_size", batch, 1)
        except ConfigurationError:
            raise ConfigurationError(
                f"The 'inferenceBatchSize' parameter must be an int in the range [1, inf). Got {batch!r} instead."
            ) from None
        return add_predictions(
            dataset,
            self.kerasModel,
            features_col=self._features(),
            prediction_col=self.getPredictionCol(),
            probability_col=self.getProbabilityCol(),
            batch_size=batch,
        )
