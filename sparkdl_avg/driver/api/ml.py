"""Spark ML layer: the trainer as an ``Estimator`` and the trained model as a ``Model``.

``KerasAveragingEstimator`` is one more stage of a ``pyspark.ml.Pipeline`` (after ``VectorAssembler``,
``StandardScaler``, ``StringIndexer``, ...); its ``fit`` trains a fresh copy of the given Keras model with
:class:`~sparkdl_avg.ParameterAveragingTrainer` — whose validator checks every parameter, on the driver, before any
Spark job — and returns a ``KerasAveragingModel`` whose ``transform`` adds predictions on the executors.

Both stages are ``MLWritable``/``MLReadable``: the params as Spark ML's JSON metadata, the Keras model as
``model.keras`` in the stage's directory (loaded in Keras' safe mode), on any filesystem Spark's own writers accept. A
fitted ``PipelineModel`` containing them saves and loads like any other.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasSeed,
    HasWeightCol,
)
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from ...errors import ConfigurationError, DataError, SessionError
from ...shared.files import fs
from ...shared.model.modelspec import keras_from_bytes, keras_to_bytes
from ..config import codegen, messages, options
from ..runtime.session import Engine, is_connect

KERAS_FILE = "model.keras"
PREPROCESS_FILE = "preprocess.pkl"
"""The stage's preprocessing function, pickled with cloudpickle (only when it has one): loading a stage that has
one unpickles code, as loading any pickle does; load stages only from paths you trust."""

#: The estimator's Params of the table's options (the rest are the stages' own: kerasModel, featuresCols, ...).
_OPTION_PARAMS = tuple(o for o in options.OPTIONS if o.param is not None)

#: The table's rows by their Param's name (``"batchSize"``).
_BY_PARAM = {o.param.name: o for o in _OPTION_PARAMS}

#: snake_case names in the trainer's messages → the estimator's Params (``'batch_size'`` → ``'batchSize'``).
_SNAKE_TO_PARAM = messages.param_names()


class _KerasParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """Params shared by the estimator and the model, with their setters (which return the stage, as in Spark ML)."""

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

    def setFeaturesCol(self, value: str):
        return self._set(featuresCol=value)

    def setFeaturesCols(self, value: list):
        return self._set(featuresCols=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str):
        return self._set(probabilityCol=value)

    def setInferenceBatchSize(self, value: int):
        return self._set(inferenceBatchSize=value)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)

    def getFeaturesCols(self):
        return self.getOrDefault(self.featuresCols)

    def _features(self):
        """``featuresCols`` when set, else ``featuresCol``."""
        return self.getFeaturesCols() if self.isSet(self.featuresCols) else self.getFeaturesCol()


class _KerasStage:
    """Holds the Keras model of a stage as ``.keras`` bytes and its preprocessing function (what persistence writes)."""

    _keras_bytes: Optional[bytes] = None
    _preprocess = None  # a sparkdl_avg.shared.data.preprocess.Preprocess, or None

    def setPreprocess(self, value: Any):
        """Sets the preprocessing function (see the trainer's ``preprocess``); ``None`` removes it. Returns the stage."""
        from ...shared.data.preprocess import Preprocess

        self._preprocess = Preprocess.of(value)
        return self

    def getPreprocess(self):
        """The preprocessing function, or ``None``."""
        return None if self._preprocess is None else self._preprocess.function()

    def _set_keras(self, model: Any) -> None:
        import keras

        if model is None:
            self._keras_bytes = None
        elif isinstance(model, (bytes, bytearray)):
            self._keras_bytes = bytes(model)
        elif isinstance(model, str):
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            if spark is None:
                raise SessionError(
                    f"Loading 'kerasModel' from a path needs an active SparkSession; got kerasModel={model!r} without one."
                )
            self._keras_bytes = _read_keras_file(spark, model)
        elif isinstance(model, keras.Model):
            from ..config.trainer_config import validate_model

            validate_model(model, name="kerasModel")
            self._keras_bytes = keras_to_bytes(model)
        else:
            raise ConfigurationError(
                "The 'kerasModel' parameter must be a compiled keras.Model or the path of a .keras file. "
                f"Got {type(model).__name__} instead."
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


def _read_keras_file(spark, path: str) -> bytes:
    """The bytes of the ``.keras`` file at ``path``; a ``ConfigurationError`` naming ``kerasModel`` if unreadable."""
    def error(why: str) -> ConfigurationError:
        return ConfigurationError(
            "The 'kerasModel' parameter must be a compiled keras.Model or the path of a .keras file. "
            f"Got {path!r} instead, {why}."
        )

    if is_connect(spark):
        try:
            rows = spark.read.format("binaryFile").load(path).select("content").collect()
        except Exception as exc:  # AnalysisException [PATH_NOT_FOUND], no filesystem for the scheme, ...
            first = next((line for line in str(exc).strip().splitlines() if line.strip()), type(exc).__name__)
            raise error("which cannot be read: " + first) from None
        if len(rows) != 1:
            raise error("where there is no file" if not rows else "which is a directory of several files")
        return bytes(rows[0][0])
    from py4j.protocol import Py4JJavaError

    sc = spark.sparkContext
    try:
        if not fs.hadoop_exists(sc, path):
            raise error("where there is no file")
        return fs.hadoop_read_bytes(sc, path)
    except Py4JJavaError as exc:  # no filesystem for the scheme, a directory, no permission, ...
        first = str(exc.java_exception).strip().splitlines()[0] if exc.java_exception is not None else str(exc)
        raise error(f"which cannot be read: {first}") from None


def _read_optional_file(spark, path: str) -> Optional[bytes]:
    """The bytes of the file at ``path``, or ``None`` when there is none (a stage saved without a preprocessing function)."""
    if is_connect(spark):
        try:
            rows = spark.read.format("binaryFile").load(path).select("content").collect()
        except Exception:  # noqa: BLE001 - [PATH_NOT_FOUND]: the stage has no such file
            return None
        return bytes(rows[0][0]) if rows else None
    sc = spark.sparkContext
    return fs.hadoop_read_bytes(sc, path) if fs.hadoop_exists(sc, path) else None


def _write_file_task(path: str, data: bytes, batches):
    """``mapInArrow`` body of the one task that writes a stage's ``.keras`` file under Spark Connect."""
    import pyarrow as pa

    for _ in batches:  # consume the input so PySpark reuses this worker
        pass
    fs.write_atomically(path, data)
    yield pa.RecordBatch.from_pydict({"written": [len(data)]})


def _write_keras_file(spark, path: str, data: bytes) -> None:
    """Writes a stage's ``.keras`` file: through Hadoop's FileSystem (classic) or from an executor (Connect).

    Under Spark Connect the client may not see the cluster's filesystem, so, like the metadata Spark writes there, the
    file is written on the cluster (one task, :mod:`sparkdl_avg.shared.files.fs`: local paths and ``pyarrow.fs`` URIs).
    """
    if not is_connect(spark):
        fs.hadoop_write_bytes(spark.sparkContext, path, data)
        return
    from functools import partial

    from ...shared.errors.remote_errors import run_job

    engine = Engine(spark)
    run_job(lambda: engine.run_tasks(1, partial(_write_file_task, path, data), "written long").collect(),
            f"Writing {path}")


class _KerasStageWriter(MLWriter):
    def __init__(self, instance: _KerasStage) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        if self.instance._keras_bytes is None:
            raise ConfigurationError("Cannot save a stage without a Keras model; call setKerasModel(model) first.")
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        _write_keras_file(self.sparkSession, path.rstrip("/") + "/" + KERAS_FILE, self.instance._keras_bytes)
        if self.instance._preprocess is not None:
            _write_keras_file(self.sparkSession, path.rstrip("/") + "/" + PREPROCESS_FILE,
                              self.instance._preprocess.payload)

    def _handleOverwrite(self, path: str) -> None:
        if not is_connect(self.sparkSession):
            super()._handleOverwrite(path)
            return
        # Connect has no JVM to ask; the stage is a directory of two files (a local server's or a URI's).
        fs.remove_tree(path)


class _KerasStageReader(MLReader):
    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        # a default saved by an older version where the Param has none now (blockLearningRate's 1.0)
        for o in _OPTION_PARAMS:
            if o.param_default() is None and not o.param.shared and instance.hasParam(o.param.name):
                instance._defaultParamMap.pop(instance.getParam(o.param.name), None)
        instance._keras_bytes = _read_keras_file(self.sparkSession, path.rstrip("/") + "/" + KERAS_FILE)
        payload = _read_optional_file(self.sparkSession, path.rstrip("/") + "/" + PREPROCESS_FILE)
        if payload is not None:
            import pickle

            instance.setPreprocess(pickle.loads(payload))
        return instance


def _capitalized(name: str) -> str:
    return name[0].upper() + name[1:]


def _from_table(cls):
    """Adds the table's options to the estimator: Params, setters, getters, ``__init__`` keywords, docs.

    Params declared by a ``pyspark.ml.param.shared`` mixin the estimator inherits (``seed``, ``featuresCol``,
    ``labelCol``) keep that declaration and its getter; the rest become class attributes here, before any instance
    copies them (``Params._copy_params``).
    """

    def setter(name):
        def set_param(self, value):
            return self._set(**{name: value})

        set_param.__name__ = set_param.__qualname__ = "set" + _capitalized(name)
        set_param.__doc__ = f"Sets ``{name}``; returns the stage."
        return set_param

    def getter(name):
        def get_param(self):
            return self.getOrDefault(getattr(self, name))

        get_param.__name__ = get_param.__qualname__ = "get" + _capitalized(name)
        get_param.__doc__ = f"The value of ``{name}`` or its default."
        return get_param

    for o in _OPTION_PARAMS:
        name = o.param.name
        if not o.param.shared:
            converter = (o.param.converter if callable(o.param.converter)
                         else getattr(TypeConverters, o.param.converter))
            setattr(cls, name, Param(Params._dummy(), name, o.param_doc(), typeConverter=converter))
            setattr(cls, "get" + _capitalized(name), getter(name))
        setattr(cls, "set" + _capitalized(name), setter(name))
    init = cls.__init__
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    init.__signature__ = codegen.signature(_OPTION_PARAMS, leading=own, kind=inspect.Parameter.KEYWORD_ONLY,
                                           camel=True)
    cls._init_names = tuple(p for p in init.__signature__.parameters if p != "self")
    cls.__doc__ = codegen.document(cls.__doc__, [(o.param.name, _param_entry(o)) for o in _OPTION_PARAMS])
    return cls


def _param_entry(o) -> str:
    """The docstring entry of an option's Param: its doc, the trainer's name, the default."""
    default = o.param_default()
    text = o.param_doc()
    shown = f". Default {codegen.literal(default)}" if default is not None else ""
    owner = {options.TRAINER: "the trainer's", options.RULE: "the update rule's", options.FIT: "``fit``'s",
             options.TRACKING: "MLflow tracking's"}[o.scope]
    return f"{text[0].upper()}{text[1:]} ({owner} ``{o.name}``){shown}."


@_from_table
class KerasAveragingEstimator(_KerasStage, Estimator, _KerasParams, HasLabelCol, HasSeed, HasWeightCol, MLWritable,
                              MLReadable):
    """Trains a compiled Keras model by parameter averaging as a Spark ML ``Estimator``.

    The Params of the trainer's options come from :data:`sparkdl_avg.driver.config.options.OPTIONS`
    (listed after the stage's own below), each with a ``set*``/``get*`` pair.

    Args (keyword-only, Spark style):
        kerasModel: A compiled ``keras.Model`` or the path of a ``.keras`` file (any filesystem Spark reads). Each
            ``fit`` trains a fresh copy of it, so the estimator can be fitted again or tuned.
        featuresCols: One features column per model input, for models with several inputs (overrides featuresCol).
        labelCols: One label column per model output, for models with several outputs (overrides labelCol).
        preprocess: A function run on the executors that maps a minibatch of raw columns to the model's inputs and
            labels (the trainer's ``preprocess``); the fitted model applies it in ``transform`` and both stages save it
            (``preprocess.pkl``). Default ``None``.
        predictionCol: Output column of the fitted model. Default "prediction".
        probabilityCol: Output column of class probabilities. Default "probability".
        inferenceBatchSize: Examples per predict call in transform. Default 1024.
    """

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
        featuresCols: Optional[list] = None,
        labelCols: Optional[list] = None,
        preprocess: Any = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        inferenceBatchSize: int = 1024,
        **params: Any,
    ) -> None:
        super().__init__()
        self._setDefault(**{
            o.param.name: o.param_default()
            for o in _OPTION_PARAMS
            if not o.param.shared and o.param_default() is not None
        })
        kwargs = dict(self._input_kwargs)
        codegen.check_names(type(self).__name__, kwargs, self._init_names)
        self._set_keras(kwargs.pop("kerasModel", None))
        self.setPreprocess(kwargs.pop("preprocess", None))
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _set(self, **kwargs: Any) -> "KerasAveragingEstimator":
        """Spark's ``_set``, with a value its type converter refuses named as the library's errors name one."""
        for name, value in kwargs.items():
            try:
                super()._set(**{name: value})
            except TypeError as exc:
                row = _BY_PARAM.get(name)
                if row is not None and row.check is not None and row.param.converter == "toString":
                    # an object where a name or spec is wanted: the estimator's parameters are saved with the pipeline
                    message = (f"The '{name}' parameter must be {row.check} given as a string (its name or spec, "
                               f"as the CLI takes it; {row.name!r} in the option reference): an estimator's "
                               f"parameters are saved with the pipeline. Got {value!r} instead.")
                elif row is not None and row.check is not None:
                    message = f"The '{name}' parameter must be {row.check}. Got {value!r} instead."
                else:
                    message = f"The '{name}' parameter ({self.getParam(name).doc}) cannot take {value!r}: {exc}"
                raise ConfigurationError(message) from None
        return self

    def setKerasModel(self, value: Any) -> "KerasAveragingEstimator":
        self._set_keras(value)
        return self

    def setLabelCols(self, value: list) -> "KerasAveragingEstimator":
        return self._set(labelCols=value)

    def getLabelCols(self):
        return self.getOrDefault(self.labelCols)

    def _option(self, o) -> Any:
        param = self.getParam(o.param.name)
        value = self.getOrDefault(param) if self.isDefined(param) else None
        return o.param.to_option(value) if o.param.to_option is not None else value

    def _trainer_options(self) -> dict:
        """The trainer's constructor options from the params."""
        flat = {o.name: self._option(o) for o in _OPTION_PARAMS if o.scope in (options.TRAINER, options.RULE)}
        if not self.isSet(self.seed):  # Spark's default seed is a (possibly negative) hash of the class name
            flat["seed"] = self.getOrDefault(self.seed) & 0x7FFFFFFF
        flat["preprocess"] = self._preprocess
        return options.from_flat(flat)

    def _fit_options(self) -> dict:
        """``fit``'s options from the params (feature and label columns: the lists when set)."""
        fit = {o.name: self._option(o) for o in _OPTION_PARAMS if o.scope == options.FIT}
        fit["features_col"] = self._features()
        if self.isSet(self.labelCols):
            fit["label_col"] = self.getLabelCols()
        return fit

    def _tracker(self):
        """The ``MlflowLogger`` the MLflow Params ask for (``mlflowTracking``, ``mlflowExperiment``, ...), or ``None``."""
        from ..observe import tracking

        return tracking.from_options({o.name: self._option(o) for o in _OPTION_PARAMS if o.scope == options.TRACKING})

    def _fit(self, dataset):
        from ..config.trainer_config import validate_model
        from .trainer import ParameterAveragingTrainer

        model = self.getKerasModel()
        validate_model(model, name="kerasModel")  # a path's model is first seen here
        try:
            trainer = ParameterAveragingTrainer(model, **self._trainer_options())
            tracker = self._tracker()
            with trainer:
                history = trainer.fit(dataset, **self._fit_options(), callbacks=[tracker] if tracker else None)
        except (ConfigurationError, DataError) as exc:
            raise type(exc)(_camel_case_message(str(exc))) from None
        fitted = KerasAveragingModel(kerasModel=model, preprocess=self._preprocess)
        fitted.history = history
        fitted.stats = trainer.stats
        self._copyValues(fitted)
        return fitted


def _camel_case_message(message: str) -> str:
    """Names the Spark param (``'batchSize'``) where the trainer's message names its option."""
    return messages.rename(message, _SNAKE_TO_PARAM)


class KerasAveragingModel(_KerasStage, Model, _KerasParams, MLWritable, MLReadable):
    """A trained Keras model as a Spark ML ``Model``: ``transform`` adds its predictions.

    ``transform`` keeps every input column and adds ``predictionCol`` (class index as a double for models compiled
    with a cross-entropy loss, else the value or values) and, for classifiers, ``probabilityCol`` (a ``DenseVector``),
    computed on the executors in Arrow batches.

    Attributes:
        history: The ``keras.callbacks.History`` of the fit that produced the model, as ``trainer.fit`` returns it:
            ``history.history["loss"]`` has one value per epoch (not persisted).
        stats: The trainer's round records of that fit, a :class:`~sparkdl_avg.shared.wire.stats.TrainingStats` (not
            persisted).
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
        preprocess: Any = None,
    ) -> None:
        super().__init__()
        kwargs = {k: v for k, v in self._input_kwargs.items() if v is not None}
        self._set_keras(kwargs.pop("kerasModel", None))
        self.setPreprocess(kwargs.pop("preprocess", None))
        self._set(**kwargs)
        self.history = None
        self.stats = None
        self._loaded = None

    @property
    def kerasModel(self):
        """The trained ``keras.Model`` (loaded once and kept)."""
        if getattr(self, "_loaded", None) is None:
            self._loaded = self.getKerasModel()
        return self._loaded

    def _transform(self, dataset):
        from ..data.inference import add_predictions

        batch = self.getInferenceBatchSize()
        options.require("inferenceBatchSize", batch, options.Ints(1))
        return add_predictions(
            dataset,
            self.kerasModel,
            features_col=self._features(),
            prediction_col=self.getPredictionCol(),
            probability_col=self.getProbabilityCol(),
            batch_size=batch,
            preprocess=self._preprocess,
            cache=self._predict_cache(),
        )

    def _predict_cache(self):
        """The :class:`~sparkdl_avg.driver.data.inference.PredictCache` of this stage's ``transform`` calls."""
        from ..data.inference import PredictCache

        if getattr(self, "_cache", None) is None:
            self._cache = PredictCache()
        return self._cache


# Saved pipelines record each stage by its class's module path, and those written so far name
# sparkdl_avg.driver.ml (a shim of this module now): new saves keep naming it, so files read the same.
for _stage in (KerasAveragingEstimator, KerasAveragingModel):
    _stage.__module__ = "sparkdl_avg.driver.ml"
