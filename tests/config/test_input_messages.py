"""Issue 48, part 2: what a fresh user's bad inputs get, without Spark.

``class_weight``'s bound (defect 8), a preprocessing function's signature (defects 12 and 13: no
parameter, a required extra one, a misspelt ``seeds``/``training``), the messages of defect 13
(``--class-weight``'s format, ``elastic_timeout_s=inf``, one-line argparse errors, the elastic timeout's
advice without checkpoints) and ``fit``'s ``callbacks``. The trial of 218 such inputs is
``benchmarks/bad_inputs.py`` (docs/benchmarks/bad_inputs.md).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys

import pytest

import keras

from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, TrainerConfig
from sparkdl_avg.driver.api import cli
from sparkdl_avg.driver.config import constraints
from sparkdl_avg.driver.config.trainer_config import check_fit_args
from sparkdl_avg.driver.elastic.membership import Membership, Slots

JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "jobs")


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


# ------------------------------------------------------------ defect 8: class_weight


@pytest.mark.parametrize("weights, words", [
    ({0: 1.0, 1: math.inf}, "gives class 1 the weight inf; expected a finite number in [0, 1e+06]"),
    ({0: 1e30}, "gives class 0 the weight 1e+30; expected a finite number in [0, 1e+06]"),
    ({0: -1.0}, "gives class 0 the weight -1.0"),
    ({0: math.nan}, "gives class 0 the weight nan"),
    ({"0": 1.0}, "has the key '0'; expected class indices (ints >= 0)"),
    ({0: 0.0, 1: 0}, "gives every class the weight 0, so the fit would train nothing"),
])
def test_class_weight_refuses_what_would_not_stay_finite_naming_the_class_and_the_value(weights, words):
    with pytest.raises(ConfigurationError) as info:
        check_fit_args(class_weight=weights)
    assert str(info.value).startswith("The 'class_weight' parameter ")
    assert words in str(info.value)
    check_fit_args(class_weight={0: 0.0, 1: constraints.MAX_CLASS_WEIGHT})  # the bound itself is fine


def test_the_class_weight_bound_keeps_adams_squared_gradients_finite_in_float32():
    """Why 1e6: the weight scales the gradient, and Adam squares it; float32 ends at 3.4e38."""
    import numpy as np

    worst = np.float32(constraints.MAX_CLASS_WEIGHT) * np.float32(1e6)  # a steep unweighted gradient
    assert np.isfinite(worst * worst)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(1e30) * np.float32(1e30))


def test_the_flag_says_the_class_weight_format():
    with pytest.raises(Exception) as info:
        constraints.parse_class_weight("0:1,1:5")
    assert type(info.value).__name__ == "ArgumentTypeError"  # argparse prints its message, not "invalid ... value"
    assert "expected CLASS=WEIGHT,... such as 0=1,1=5" in str(info.value) and "'0:1,1:5'" in str(info.value)
    assert constraints.parse_class_weight("0=1,1=5") == {0: 1.0, 1: 5.0}


# ------------------------------------------------ defects 12 and 13: preprocess signatures


def _refusal(fn) -> str:
    with pytest.raises(ConfigurationError) as info:
        TrainerConfig(preprocess=fn)
    return str(info.value)


def test_a_function_of_no_parameter_is_refused_at_the_signature_check():
    message = _refusal(lambda: None)
    assert "must take the batch as its first argument" in message and "which takes no parameter" in message


def test_a_required_parameter_besides_the_batch_is_refused():
    def shift(batch, pixels):
        return batch

    message = _refusal(shift)
    assert "requires the argument 'pixels', which is never given" in message and "functools.partial" in message


@pytest.mark.parametrize("name, meant", [("sed", "seeds"), ("seed", "seeds"), ("random_seed", "seeds"),
                                         ("seeds_", "seeds"), ("train", "training"), ("is_training", "training")])
def test_a_misspelt_seeds_or_training_parameter_is_refused_with_the_expected_name(name, meant):
    fn = eval(f"lambda batch, {name}=None: batch")  # noqa: S307 - a parameter named by the test
    message = _refusal(fn)
    assert f"has a parameter {name!r}, which is never given" in message
    assert f"Rename {name!r} to {meant!r}" in message


def test_functions_we_call_rightly_are_accepted():
    for fn in (lambda batch: batch, lambda batch, seeds=None, training=False: batch, lambda batch, scale=2: batch,
               lambda *args: args[0], lambda batch, **kw: batch):
        TrainerConfig(preprocess=fn)


# ------------------------------------------------------------------ defect 13: messages


def test_elastic_timeout_inf_says_finite():
    with pytest.raises(ConfigurationError, match=r"'elastic_timeout_s' parameter must be a finite number of seconds "
                                                 r"above 0 \(not inf: .*86400\)\. Got inf instead"):
        TrainerConfig(min_workers=1, elastic_timeout_s=float("inf"))


class _NoSlots:
    def __call__(self, suspect=False, epoch=0, round=0):  # noqa: A002 - the source's keyword
        return Slots(0, ())


@pytest.mark.parametrize("checkpointed, advice", [
    (True, "and the last checkpoint is unchanged): add executors, or lower min_workers, and resume."),
    (False, "this fit wrote no checkpoints (no checkpoint_dir), so it cannot be resumed"),
])
def test_the_elastic_timeout_advises_resume_only_to_a_fit_with_checkpoints(checkpointed, advice):
    from sparkdl_avg.errors import WorkerError

    membership = Membership(_NoSlots(), 2, 2, 0.0, checkpointed=checkpointed)
    membership.slots = _NoSlots()
    with pytest.raises(WorkerError) as info:
        membership._wait(0, 0)
    assert advice in str(info.value)
    assert str(info.value).endswith("and resume.") is checkpointed


def _train_job():
    sys.path.insert(0, JOBS)
    try:
        import train
    finally:
        sys.path.remove(JOBS)
    return train


@pytest.mark.parametrize("argv, error", [
    (["--batch-size", "abc"], "argument --batch-size: invalid int value: 'abc'"),
    (["--class-weight", "0:1,1:5"], "argument --class-weight: expected CLASS=WEIGHT,... such as 0=1,1=5"),
    (["--unknown-flag"], "unrecognized arguments: --unknown-flag (see"),
    (["--batchsize", "8"], "unrecognized arguments: --batchsize 8; did you mean --batch-size?"),
    (["--validation-split", "1.5"], "--validation-split must be in (0, 1); got 1.5"),
])
def test_a_jobs_flag_error_is_one_line(argv, error):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        _train_job().parse_args(["--data", "d", "--model", "m.keras", "--output-dir", "o", *argv])
    assert info.value.code == cli.EXIT_USAGE
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines  # argparse's own parser printed the 29-line usage first
    assert lines[0].startswith("train.py: error: ") and error in lines[0] and lines[0].endswith("(see train.py --help for the flags it takes)")


# ------------------------------------------------------------------ fit's callbacks


@pytest.mark.parametrize("callbacks, words", [
    ("early_stopping", "entry 0 is 'early_stopping'"),
    (keras.callbacks.EarlyStopping, "(the class: call it, EarlyStopping(...))"),
    ([keras.callbacks.History(), 3], "entry 1 is 3"),
])
def test_callbacks_that_are_not_keras_callbacks_are_refused_before_any_spark_job(callbacks, words):
    trainer = ParameterAveragingTrainer(_model(), num_workers=2)
    with pytest.raises(ConfigurationError) as info:
        trainer.fit(None, callbacks=callbacks)  # refused before the data is looked at
    assert "The 'callbacks' parameter must be a list of keras.callbacks.Callback instances" in str(info.value)
    assert words in str(info.value)
