"""What keeps a replica's step function to one trace: every variable of the model's training created before it.

A ``tf.function`` whose first trace creates variables is traced twice by
TensorFlow (once creating them, once more without): a replica's first
``train_step`` created the compiled metrics' variables (the loss tracker,
``accuracy``'s totals), so the executors traced their step function twice,
doubling a first round's tracing (docs/benchmarks/first_fit.md). Keras' own
``fit`` builds that state first, symbolically, from the first batch's
shapes; :func:`build_training_state` does the same from the staged data's
fields. It runs on executors and in the driver's tests, and holds no driver
state.

It also owns what ``warm_up(spark, model)`` ships to the executors so that
they build and trace a replica before the fit (:class:`WarmReplica`), with
the data signature a fit most likely stages (:func:`likely_signature`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

from ..data.columns import Field
from ..data.staged_dataset import StagedDataset
from .modelspec import ModelSpec, input_dtypes, input_shapes, inputs_dtype


def build_training_state(model, x_fields: Sequence, y_fields: Sequence, weighted: bool) -> bool:
    """Creates the variables ``model.train_step`` would create on its first call; returns whether it could.

    ``x_fields`` / ``y_fields``: per model input and output, an object with
    ``shape`` (one example's, no batch dimension) and ``dtype`` (a numpy
    dtype name or ``"string"``). Uses Keras' ``Trainer._symbolic_build``
    (what ``model.fit`` calls before its first step; symbolic tensors, no
    computation): where that private method is missing or fails, nothing is
    built and the step function is traced twice, as before, still correctly.
    """
    symbolic_build = getattr(model, "_symbolic_build", None)
    if symbolic_build is None:
        return False
    try:
        import keras

        def tensors(fields):
            parts = [keras.KerasTensor((None, *f.shape), f.dtype)
                     for f in fields]
            return parts[0] if len(parts) == 1 else tuple(parts)

        batch = (tensors(x_fields), tensors(y_fields))
        if weighted:
            batch += (keras.KerasTensor((None,), "float32"),)
        symbolic_build(data_batch=batch)
        return True
    except Exception:  # noqa: BLE001 - an optimisation only; the trace builds what this could not
        return False


@dataclass(frozen=True)
class TraceSignature:
    """The fields a replica's step function is traced for, without staged data (a warm-up's guess).

    Reads like the :class:`~sparkdl_avg.shared.data.staged_dataset.StagedDataset`
    a fit stages (``x_fields``, ``y_fields``, ``weighted``, ``signature``), so
    the executors' step function cache (:func:`sparkdl_avg.executor.worker._steps_function`)
    keys both alike: a fit whose data match the guess finds the function traced.
    """

    x_fields: Tuple[Field, ...]
    y_fields: Tuple[Field, ...]
    weighted: bool = False

    signature = StagedDataset.signature


def likely_signature(model) -> TraceSignature:
    """What a fit of ``model`` on unweighted numpy arrays or array columns most likely stages.

    Inputs as the fit stages them (each input's shape and dtype); for an
    output whose loss is a sparse one, integer class indices (one int32 per
    example, as staging keeps integer labels), else float labels of the
    output's shape (:func:`~sparkdl_avg.shared.model.modelspec.inputs_dtype`). A guess: data that differ (one-hot
    labels with a sparse loss, sample weights) are traced again by the fit.
    """
    losses = model.loss if isinstance(model.loss, (list, tuple)) else [model.loss] * len(model.outputs)
    if isinstance(model.loss, dict):
        losses = [model.loss.get(name) for name in model.output_names]
    label_dtype = inputs_dtype(model)
    y_fields = []
    for output, loss in zip(model.outputs, losses):
        name = loss if isinstance(loss, str) else getattr(loss, "name", None) or type(loss).__name__
        sparse = "sparse" in str(name).lower()
        # class indices are integers, which staging keeps as int32 (arrays and columns alike)
        y_fields.append(Field((), "int32") if sparse else Field(tuple(output.shape[1:]), label_dtype))
    x_fields = tuple(Field(tuple(shape), dtype) for shape, dtype in zip(input_shapes(model), input_dtypes(model)))
    return TraceSignature(x_fields, tuple(y_fields))


@dataclass(frozen=True)
class WarmReplica:
    """What a warm-up task needs to build a replica and trace its step function before a fit (``warm_up(spark, model)``).

    Attributes:
        spec: The model's :class:`~sparkdl_avg.shared.model.modelspec.ModelSpec`.
        fields: The data signature to trace for (:func:`likely_signature`).
    """

    spec: ModelSpec
    fields: TraceSignature

    @classmethod
    def of(cls, model) -> "WarmReplica":
        return cls(ModelSpec.from_model(model), likely_signature(model))
