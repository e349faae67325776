"""Driver side of distributed inference: add a model's outputs to a DataFrame.

The columns the model's inputs come from (or the raw columns a preprocessing function reads) go through an iterator
Arrow UDF (``pyspark.sql.functions.arrow_udf``, Spark ≥ 4.1) whose body,
:func:`sparkdl_avg.executor.predict.predict_batches`, runs on executors with the replica cached per Python worker and
sees each Arrow batch's numeric columns as numpy arrays (no pandas, no per-row objects). Every other column of the
DataFrame passes through untouched (Vectors included, also from a columnar source such as Parquet: see
:func:`_udf_input`).
"""

import math
from typing import Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa

from ...errors import ConfigurationError, DataError
from ...executor.predict import PredictTask, predict_batches
from ...shared.errors import remote_errors
from ...shared.model.modelspec import ModelSpec, input_dtypes, input_shapes
from ..runtime.session import Engine
from .adapters import find_data_adapter
from .frames import column_list, dry_run, input_column, quoted

CLASSIFIER_LOSSES = ("categoricalcrossentropy", "categoricalfocalcrossentropy")
BINARY_LOSSES = ("binarycrossentropy", "binaryfocalcrossentropy")


def output_kind(model) -> str:
    """``"multiclass"``, ``"binary"`` or ``"regression"``, from the compiled loss.

    Categorical cross-entropies (sparse or not) make a multi-class classifier, binary cross-entropies with one output a
    binary classifier, anything else a regressor; so does a model with several outputs.
    """
    loss = model.loss
    if isinstance(loss, (list, tuple, dict)) or len(model.outputs) > 1:
        return "regression"
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or type(loss).__name__
    name = name.lower().replace("_", "")
    if any(k in name for k in BINARY_LOSSES) and model.outputs[0].shape[-1] == 1:
        return "binary"
    if any(k in name for k in CLASSIFIER_LOSSES):
        return "multiclass"
    return "regression"


def _holds_udt(data_type) -> bool:
    """Whether a Spark SQL type is, or contains, a user-defined type (a ``pyspark.ml`` Vector, ...)."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.UserDefinedType):
        return True
    if isinstance(data_type, T.StructType):
        return any(_holds_udt(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _holds_udt(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _holds_udt(data_type.keyType) or _holds_udt(data_type.valueType)
    return False


def _udf_input(df, arguments):
    """``(DataFrame, arguments)`` to call the prediction UDF on: ``arguments`` and the first one again.

    Spark ≥ 4.2 hands an Arrow UDF whose child is a columnar scan (Parquet, ORC) the scan's column batches and converts
    the columns it passes through with a converter that has no user-defined types, so any Vector column next to the
    features fails with ``UNSUPPORTED_DATATYPE``. When the schema holds one, array arguments are computed in a
    projection of their own (``transform`` keeps it from being trivial) and the first is referenced twice, which Spark's
    optimizer does not merge into the UDF: a row-based operator then sits between the scan and the UDF, the path that
    carries every type. Otherwise the UDF stays directly on the source (Spark deduplicates the two identical arguments;
    Python sees them once each).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not any(_holds_udt(f.dataType) for f in df.schema.fields):
        return df, (*arguments, arguments[0])
    projected, columns = df, []
    for k, expr in enumerate(arguments):
        name = f"__sparkdl_avg_in{k}"
        data_type = projected.select(expr).schema.fields[0].dataType
        if isinstance(data_type, T.ArrayType):
            expr = F.transform(expr, lambda v: v)
        projected = projected.withColumn(name, expr)
        columns.append(F.col(name))
    return projected, (*columns, columns[0])


def udf_inputs(df, model, features_col, preprocess=None, what: str = "input"):
    """How ``df`` feeds ``model``: ``(expressions, StagedDataset without files)`` for :class:`PredictTask`.

    Without ``preprocess``, one expression per model input (:func:`sparkdl_avg.driver.data.frames.input_column`); with
    it, the raw columns the function reads, found by its dry run on a few rows
    (:func:`sparkdl_avg.driver.data.frames.dry_run`); its NaN/Inf inputs are refused there and on the executors.
    """
    from ...shared.data.columns import Column, Field
    from ...shared.data.kinds import RawKind
    from ...shared.data.staged_dataset import StagedDataset
    from ...shared.data.value_checks import DataChecks
    from .checks import embedding_ranges

    x_fields = tuple(Field(shape, dtype) for shape, dtype in zip(input_shapes(model), input_dtypes(model)))
    names = column_list(features_col, len(x_fields), "features_col", "input")
    if preprocess is not None:
        # NaN/Inf inputs out of the function are refused, not predicted: a NaN image's "class" is argmax's
        # first index, a silent wrong answer (fit refuses them too, naming the function, key and row).
        checks = DataChecks(finite=True, id_ranges=embedding_ranges(model),
                            advice="Clean or impute the data before predicting on it.")
        preprocess, staged, _ = dry_run(df, preprocess, names, x_fields, (), "float32", None, checks, what)
        columns = tuple(Column(c, c, RawKind.name, None, "raw") for c in staged)
        exprs = [quoted(c) for c in staged]
        return exprs, StagedDataset((), columns, tuple(names), x_fields, (), (), preprocess=preprocess,
                                    checks=checks)
    pairs = [input_column(df, c, k, len(x_fields), field, what) for k, (c, field) in enumerate(zip(names, x_fields))]
    columns = tuple(Column(f"x{k}", col.source, col.kind, col.field, "x", k) for k, (_, col) in enumerate(pairs))
    return [expr for expr, _ in pairs], StagedDataset((), columns, tuple(c.name for c in columns), x_fields, (), ())


class PredictCache:
    """What a caller's repeated ``predict`` calls can share: the model's spec and weights as shipped.

    Describing the model (:meth:`ModelSpec.from_model`: its ``.keras`` archive) and broadcasting it is a noticeable
    share of a prediction (docs/benchmarks/data_formats.md). They are kept while the model object, its compile settings
    and the Spark application stay the same; the weights while their bytes do (a fit in between changes them, and they
    are shipped again).
    """

    def __init__(self) -> None:
        self._spec = None  # (key, spec, shipped)
        self._weights = None  # (key, shipped)

    def spec(self, model, engine, ship):
        import json

        import keras

        key = (engine.key, id(model), json.dumps(model.get_compile_config(), sort_keys=True, default=str),
               keras.config.floatx())
        if self._spec is None or self._spec[0] != key:
            spec = ModelSpec.from_model(model)
            self._spec = (key, spec, ship(spec))
        return self._spec[1], self._spec[2]

    def weights(self, model, engine, ship):
        import hashlib

        weights = model.get_weights()
        digest = hashlib.sha1()
        for w in weights:
            digest.update(memoryview(np.ascontiguousarray(w)).cast("B"))
        key = (engine.key, id(model), digest.hexdigest())
        if self._weights is None or self._weights[0] != key:
            self._weights = (key, ship(weights))
        return self._weights[1]


def add_predictions(
    df,
    model,
    features_col: str = "features",
    prediction_col: str = "prediction",
    probability_col: Optional[str] = "probability",
    batch_size: int = 1024,
    spec: Optional[ModelSpec] = None,
    preprocess=None,
    cache: Optional[PredictCache] = None,
):
    """Returns ``df`` with the model's outputs added (lazily, like any transformation).

    Args:
        df: Spark DataFrame with a features column (or a container a registered
            :class:`~sparkdl_avg.driver.data.adapters.DataAdapter` converts to one).
        model: A compiled (or loaded) ``keras.Model``; its current weights are used.
        features_col: Column of ``array<float|double>``, numbers, ``pyspark.ml`` Vectors, bytes or strings (string
            inputs) or Spark images; a list of columns, one per input, for a model with several inputs; with
            ``preprocess``, the names of its outputs.
        prediction_col: Output column: the class index (double) for classifiers; the value (double) or values
            (``array<double>``) for regression. A model with several outputs counts as regression; its outputs are
            flattened and concatenated in output order.
        probability_col: Output column of class probabilities (a ``pyspark.ml`` ``DenseVector``) for classifiers;
            ``None`` or ``""`` leaves it out. Ignored for regression.
        batch_size: Examples per ``predict_on_batch`` call on the executors.
        spec: The model's :class:`ModelSpec` if already made.
        preprocess: The preprocessing function training applied
            (:class:`~sparkdl_avg.shared.data.preprocess.Preprocess` or a function), or ``None``; it runs on the
            executors with ``training=False``.
        cache: A :class:`PredictCache` the caller keeps between calls, or ``None``.

    Raises:
        ConfigurationError: an output column name that is empty, or the same for both.
        DataError: a missing or mistyped features column, or an output column that already exists; with
            ``preprocess``, its failure or misfit on the first rows (one small Spark job); from the action that
            computes the predictions (``collect()``, ...), a row of the wrong width or a null one (see
            :func:`sparkdl_avg.shared.errors.remote_errors.decode_user_actions`).
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf

    from ...shared.data.preprocess import Preprocess

    adapter = find_data_adapter(df, "prediction")  # a user's container converts (once) to the DataFrame it stands for
    frame = None if adapter is None else adapter.dataframe()
    if frame is None:
        raise DataError(f"The data to predict on must be a Spark DataFrame. Got {type(df).__name__} instead.")
    df = frame
    kind = output_kind(model)
    for param, name in (("prediction_col", prediction_col), ("probability_col", probability_col)):
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigurationError(f"The '{param}' parameter must be a column name"
                                     f"{' or None (no probabilities)' if param == 'probability_col' else ''}. "
                                     f"Got {name!r} instead.")
    if probability_col == prediction_col:
        raise ConfigurationError(f"The 'prediction_col' and 'probability_col' parameters must name different columns. "
                                 f"Got {prediction_col!r} for both instead; pass probability_col=None to omit it.")
    outputs = [prediction_col] + ([probability_col] if probability_col and kind != "regression" else [])
    for name in outputs:
        if name in df.columns:
            raise DataError(f"Output column {name!r} is already in the DataFrame; choose another name.")
    exprs, inputs = udf_inputs(df, model, features_col, Preprocess.of(preprocess))

    engine = Engine(df.sparkSession)
    remote_errors.decode_user_actions()  # a ragged row fails the user's action as a DataError, not a PythonException
    # Connect has no broadcasts: the model and weights travel in the UDF itself (once per query plan).
    ship = (lambda value: value) if engine.connect else engine.broadcast
    cache = cache or PredictCache()
    if spec is not None:
        shipped = ship(spec)
    else:
        spec, shipped = cache.spec(model, engine, ship)
    task = PredictTask(
        spec=shipped,
        fingerprint=spec.fingerprint,
        weights=cache.weights(model, engine, ship),
        inputs=inputs,
        batch_size=batch_size,
        kind=kind,
    )
    if kind == "regression":
        width = sum(math.prod(o.shape[1:]) for o in model.outputs)
        return_type = "prediction double" if width == 1 else "prediction array<double>"
    else:
        return_type = "prediction double, probability array<double>"

    @arrow_udf(return_type)
    def predict(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        return predict_batches(task, batches)

    source, arguments = _udf_input(df, exprs)
    tmp = "__sparkdl_avg_outputs"
    out = source.withColumn(tmp, predict(*arguments))
    columns = [F.col(f"`{c}`") for c in df.columns] + [F.col(f"{tmp}.prediction").alias(prediction_col)]
    if len(outputs) > 1:
        columns.append(array_to_vector(F.col(f"{tmp}.probability")).alias(probability_col))
    return out.select(*columns)
