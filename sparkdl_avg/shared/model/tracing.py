"""What keeps a replica's step function to one trace: every variable of the model's training created before it.

A ``tf.function`` whose first trace creates variables is traced twice by
TensorFlow (once creating them, once more without): a replica's first
``train_step`` created the compiled metrics' variables (the loss tracker,
``accuracy``'s totals), so the executors traced their step function twice,
about 2 s of a small CNN's first round on 2 loaded cores instead of 1
(docs/benchmarks/first_fit.md). Keras' own ``fit`` builds that state first,
symbolically, from the first batch's shapes; :func:`build_training_state`
does the same from the staged data's fields. It runs on executors and in
the driver's tests, and holds no driver state.
"""

from __future__ import annotations

from typing import Sequence


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
