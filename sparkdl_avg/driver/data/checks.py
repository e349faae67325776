"""The checks a model implies for its data: finite values, and the label ranges and shapes its losses expect.

This module owns :func:`data_checks` (``check_data``): what the staging
jobs check of every value while they write it
(:class:`~sparkdl_avg.shared.data.value_checks.DataChecks`, applied by
:mod:`sparkdl_avg.executor.stage_writer` and, for numpy arrays, on the
driver), read from the model's losses and outputs.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ...shared.data.value_checks import DataChecks, LabelShape


#: Keras' built-in losses that compare labels and outputs value by value (names lower-cased, without
#: underscores: the strings, functions and classes alike): their labels need the output's width.
ELEMENTWISE_LOSSES = frozenset((
    "mse", "meansquarederror", "mae", "meanabsoluteerror", "mape", "meanabsolutepercentageerror", "msle",
    "meansquaredlogarithmicerror", "huber", "logcosh", "hinge", "squaredhinge", "categoricalhinge", "poisson",
    "kld", "kldivergence", "cosinesimilarity",
))


def data_checks(model, enabled: bool = True) -> Optional[DataChecks]:
    """The staging checks for ``model`` (``check_data``): finite values, and label ranges and shapes its losses imply.

    Sparse categorical cross-entropy needs one class index ``0 .. classes-1``
    per row (``classes``: the output's last dimension); categorical
    cross-entropy a vector of ``classes`` values per row; binary
    cross-entropy labels in ``[0, 1]``, as many per row as the output has
    units; the value-by-value losses (:data:`ELEMENTWISE_LOSSES`: MSE, MAE,
    Huber, hinge, ...) as many values per row as the output has units
    (Keras fails on one value per row for a wider output). Ids fed to an
    ``Embedding`` must lie in its range (:func:`embedding_ranges`). Shapes are checked only for outputs of shape ``(batch, units)``,
    and nothing of the labels when the losses are a dict (which output a
    loss belongs to is then Keras' business). Other losses (a user's own function) get no check.
    """
    if not enabled:
        return None
    ids = embedding_ranges(model)
    if isinstance(model.loss, dict):
        return DataChecks(finite=True, id_ranges=ids)
    losses = model.loss if isinstance(model.loss, (list, tuple)) else [model.loss] * len(model.outputs)
    ranges, shapes = [], []
    for loss, output in zip(losses, model.outputs):
        given = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
        name = given.lower().replace("_", "")
        units = output.shape[-1] if len(output.shape) == 2 else None
        kind = None
        if name == "sparsecategoricalcrossentropy":
            kind = "sparse"
            classes = int(output.shape[-1])
            ranges.append(
                (0, classes - 1, True, f"a class index in 0..{classes - 1} (the model's output has {classes} "
                 "classes and the loss is a sparse categorical cross-entropy)")
            )
        elif name in ("binarycrossentropy", "binaryfocalcrossentropy", "bce"):
            kind = "binary"
            ranges.append((0, 1, False, "a value in [0, 1] (the loss is a binary cross-entropy)"))
        else:
            if name in ("categoricalcrossentropy", "categoricalfocalcrossentropy"):
                kind = "categorical"
            elif name in ELEMENTWISE_LOSSES:
                kind = "elementwise"
            ranges.append(None)
        shapes.append(LabelShape(given, kind, int(units)) if kind and units is not None else None)
    return DataChecks(finite=True, label_ranges=tuple(ranges), label_shapes=tuple(shapes), id_ranges=ids)


def embedding_ranges(model) -> Tuple[Optional[Tuple[int, str]], ...]:
    """Per model input, ``(input_dim, layer name)`` of the ``Embedding`` layer that takes it directly, else ``None``.

    Only an input wired straight into an ``Embedding`` is known to hold its
    ids (a layer in between may shift or hash them). A model whose graph is
    not known (a subclassed model) gets no check.
    """
    import keras

    found = []
    for tensor in getattr(model, "inputs", None) or []:
        match = None
        for layer in model.layers:
            if isinstance(layer, keras.layers.Embedding):
                for node in getattr(layer, "_inbound_nodes", ()):
                    if any(t is tensor for t in node.input_tensors):
                        match = (int(layer.input_dim), layer.name)
        found.append(match)
    return tuple(found) if any(found) else ()
