"""Extension points as a user reaches them: ``OuterOptimizer`` and an ``UpdateRule`` of one's own.

Imports only ``sparkdl_avg``'s public names (and keras, numpy, pyspark,
sklearn). Small float64 models on scikit-learn's digits, 2 workers on
local[2]; identities are checked in float64.
"""

import numpy as np
import pytest

import keras
from sklearn.datasets import load_digits

from sparkdl_avg import (
    ConfigurationError,
    DiLoCo,
    OuterOptimizer,
    ParameterAveragingTrainer,
    RuleParam,
    TrainerConfig,
    UpdateRule,
)


def _f32(value: float) -> float:
    return float(np.float32(value))


def _nesterov_sgd():
    return OuterOptimizer(keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True))


def _data(n=256):
    x, y = load_digits(return_X_y=True)
    return (x[:n] / 16.0).astype("float64"), y[:n].astype("int64")


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,), dtype="float64")
    hidden = keras.layers.Dense(16, activation="tanh", dtype="float64")(inputs)
    out = keras.layers.Dense(10, activation="softmax", dtype="float64")(hidden)
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _fit(rule, epochs=2, model=None, fit_options=None, **options):
    """A 2-worker fit of 256 digits: 4 rounds of k=2 per epoch, the same examples in the same order each time."""
    model = model if model is not None else _model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2,
                                        update_rule=rule, seed=0, slow_warning=False, **options)
    history = trainer.fit(_data(), epochs=epochs, verbose=0, shuffle=False, **(fit_options or {}))
    return model, trainer, history


def _close(actual, expected, rtol):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol)


# ------------------------------------------------------------- on arrays, no Spark


def _steps(rule, rounds=12, dtype=np.float64):
    """``rule``'s weights after ``rounds`` rounds whose average lands at random offsets (one frozen weight)."""
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(5, 3)).astype(dtype), rng.normal(size=3).astype(dtype), np.ones(2, dtype)]
    trainable = [True, True, False]
    state = rule.init_state(weights, trainable)
    for _ in range(rounds):
        sent = rule.to_send(weights, state, trainable)
        average = [s + rng.normal(scale=0.1, size=s.shape) for s in sent]
        weights = rule.apply(weights, sent, average, state, trainable, 0.05)
    return weights, state


def test_nesterov_sgd_as_the_outer_optimizer_is_diloco_on_arrays():
    """Keras keeps m = μ·m − lr·g and steps w + μ·m − lr·g: with m = −lr·v that is DiLoCo's (PyTorch's)
    v = μ·v + g, w − lr·(g + μ·v). Keras casts lr and μ to float64 through float32, so it is DiLoCo of the
    float32 values to float64 rounding, and DiLoCo of 0.7, 0.9 to float32 rounding."""
    outer, state = _steps(_nesterov_sgd())
    _close(outer, _steps(DiLoCo(_f32(0.7), _f32(0.9)))[0], rtol=1e-13)
    _close(outer, _steps(DiLoCo().resolve(2))[0], rtol=1e-6)
    assert [a.dtype for a in outer] == [np.float64] * 3
    assert int(state["optimizer"][0]) == 12  # Keras' iteration counter: one outer step per round
    outer32, _ = _steps(_nesterov_sgd(), dtype=np.float32)
    assert [a.dtype for a in outer32] == [np.float32] * 3
    _close(outer32, _steps(DiLoCo().resolve(2), dtype=np.float32)[0], rtol=2e-6)


def test_the_spec_is_the_optimizer_and_bad_specs_say_what_was_expected():
    rule = TrainerConfig(update_rule="outer:sgd:lr=0.7,momentum=0.9,nesterov").rule(2)
    assert rule == _nesterov_sgd() and rule.describe()["config"]["learning_rate"] == 0.7
    assert TrainerConfig(update_rule="outer:adam:lr=0.001").rule(2) == OuterOptimizer(keras.optimizers.Adam(0.001))
    assert TrainerConfig(update_rule="outer:sgd:lr=1,momentum=0").rule(2) == OuterOptimizer(
        keras.optimizers.SGD(1.0, momentum=0.0))
    for spec, message in [
        ("outer", r"'update_rule' parameter must be 'outer:<optimizer>:<key>=<value>,\.\.\.' with a Keras "
                  r"optimizer's name.*Got 'outer' instead"),
        ("outer:nope:lr=1", r"a Keras optimizer's name \(sgd, adam, adamw, rmsprop, \.\.\.\).*Got 'outer:nope:lr=1'"),
        ("outer:sgd:mom=0.9", r"SGD's arguments \(lr, learning_rate, momentum, nesterov.*; mom is none of them"),
        ("outer:sgd:momentum=2.0", r"arguments SGD accepts \(`momentum` must be a float between \[0, 1\]"),
        ("outer:adam:lr=0.1,lr=0.2", r"gives lr twice"),
        ("outer:adam:=0.1", r"a rule spec 'name:key=value,\.\.\.' \(a bare key means True\)"),
        (OuterOptimizer, r"'update_rule' parameter must be None, one of 'average', .*'diloco',? (or )?"
                         r"'outer:<optimizer>:<key>=<value>,\.\.\.'.*or OuterOptimizer\(\.\.\.\)"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            ParameterAveragingTrainer(_model(), update_rule=spec)
    with pytest.raises(ConfigurationError, match=r"'optimizer' parameter of OuterOptimizer must be a Keras optimizer"):
        OuterOptimizer("sgd")


@pytest.mark.parametrize("make, message", [
    (lambda: keras.optimizers.SGD(-0.7), r"^The 'learning_rate' parameter of OuterOptimizer\(SGD\) must be a float "
                                          r"in the range \(0\.0, inf\)\. Got -0\.7 instead\.$"),
    (lambda: keras.optimizers.SGD(0.0), r"'learning_rate' parameter of OuterOptimizer\(SGD\).*Got 0\.0 instead"),
    (lambda: keras.optimizers.Adam(float("nan")), r"'learning_rate' parameter of OuterOptimizer\(Adam\).*Got nan"),
    (lambda: keras.optimizers.Adam(beta_1=1.5), r"^The 'beta_1' parameter of OuterOptimizer\(Adam\) must be a float "
                                                 r"in the range \[0\.0, 1\.0\)\. Got 1\.5 instead\.$"),
    (lambda: keras.optimizers.RMSprop(rho=-0.1), r"'rho' parameter of OuterOptimizer\(RMSprop\).*Got -0\.1"),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.7)),
     r"a LossScaleOptimizer scales a loss, which the outer step does not have\. Pass its inner_optimizer instead"),
    (lambda: keras.optimizers.SGD(lambda: 0.1),
     r"must be a Keras optimizer that its get_config\(\) rebuilds \(a learning rate that is a number or a "
     r"keras\.optimizers\.schedules\.LearningRateSchedule, not a function\): the optimizer is rebuilt from its "
     r"config in checkpoints and on resume\. SGD's is not rebuilt \(ValueError: Requested the deserialization of a "
     r"Python lambda\)\.$"),
])
def test_an_outer_optimizer_that_cannot_train_is_refused_where_it_is_made(make, message):
    with pytest.raises(ConfigurationError, match=message):
        OuterOptimizer(make())


@pytest.mark.parametrize("spec, message", [
    ("outer:adam:lr=-0.001", r"'learning_rate' parameter of OuterOptimizer\(Adam\).*Got -0\.001 instead"),
    ("outer:sgd:lr=0.7,learning_rate=0.5", r"^The 'update_rule' parameter gives the learning rate twice \(lr stands "
                                           r"for learning_rate\): give it once\. Got 'outer:sgd:lr=0\.7,learning_rate"),
    ("outer:sgd:lr=0.7,nesterov=maybe", r"^The 'update_rule' parameter must be a rule spec whose nesterov is true or "
                                        r"false\. Got 'outer:sgd:lr=0\.7,nesterov=maybe' instead\.$"),
    ("outer:sgd:lr=0.7,nesterov=yes", r"whose nesterov is true or false\. Got 'outer:sgd:lr=0\.7,nesterov=yes'"),
    ("outer:sgd:lr=fast", r"whose lr is a float\. Got 'outer:sgd:lr=fast' instead"),
])
def test_an_outer_spec_is_refused_rather_than_read_another_way(spec, message):
    with pytest.raises(ConfigurationError, match=message):
        ParameterAveragingTrainer(_model(), update_rule=spec)


def test_an_outer_schedule_and_flags_spelled_as_keras_takes_them_are_accepted():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.7, 10, 0.9)
    assert OuterOptimizer(keras.optimizers.SGD(schedule)).optimizer.get_config()["learning_rate"]["config"][
        "initial_learning_rate"] == 0.7
    assert TrainerConfig(update_rule="outer:sgd:lr=0.7,nesterov=true").rule(2) == TrainerConfig(
        update_rule="outer:sgd:lr=0.7,nesterov").rule(2)


# ------------------------------------------------------------- through fit


def test_nesterov_sgd_as_the_outer_optimizer_trains_as_diloco(in_process_engine):
    outer, trainer, _ = _fit(_nesterov_sgd())
    diloco, _, _ = _fit("diloco")
    _close(outer.get_weights(), diloco.get_weights(), rtol=1e-6)
    assert {r["update_rule"] for r in trainer.stats.records} == {"outer"}
    assert int(trainer.update_rule_state["state"]["optimizer"][0]) == 8  # two epochs of 4 rounds


def test_adam_as_the_outer_optimizer_trains(in_process_engine):
    _, trainer, history = _fit(OuterOptimizer(keras.optimizers.Adam(0.01)), epochs=3)
    assert history.history["loss"][-1] < 0.9 * history.history["loss"][0]
    assert trainer.update_rule_state["rule"]["optimizer"].endswith("Adam")


def test_the_outer_optimizers_state_resumes_bitwise_from_a_checkpoint(in_process_engine, tmp_path):
    """Two epochs equal one epoch, then a new trainer resuming its checkpoint to two: weights and Adam's moments."""
    rule = OuterOptimizer(keras.optimizers.Adam(0.01))
    whole, whole_trainer, _ = _fit(rule, epochs=2, fit_options={"checkpoint_dir": str(tmp_path / "whole")})
    _fit(rule, epochs=1, fit_options={"checkpoint_dir": str(tmp_path / "part")})
    resumed, resumed_trainer, _ = _fit(
        OuterOptimizer(keras.optimizers.Adam(0.01)), epochs=2,
        fit_options={"checkpoint_dir": str(tmp_path / "part"), "resume": True},
    )
    for a, b in zip(resumed.get_weights(), whole.get_weights()):
        assert np.array_equal(a, b)
    state, expected = resumed_trainer.update_rule_state["state"], whole_trainer.update_rule_state["state"]
    assert len(state["optimizer"]) == len(expected["optimizer"]) == 10  # counter, lr, (m, v) of 4 trainable weights
    for a, b in zip(state["optimizer"], expected["optimizer"]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_the_outer_optimizer_steps_stale_blocks_as_diloco(in_process_engine):
    """Stale-synchronous chunks call the rule once per block of N chunks, as every rule."""
    stale = dict(synchronization="stale", staleness=1, reproducible=True)
    outer, trainer, _ = _fit(_nesterov_sgd(), epochs=1, **stale)
    diloco, _, _ = _fit("diloco", epochs=1, **stale)
    _close(outer.get_weights(), diloco.get_weights(), rtol=1e-6)
    assert int(trainer.update_rule_state["state"]["optimizer"][0]) == 4  # blocks: one per round's worth of chunks


# ------------------------------------------------------------- a rule of one's own


class Extrapolate(UpdateRule):
    """``w ← sent + α·(w̄ − sent)`` on trainable weights; counts its calls in its state."""

    names = ("extrapolate",)
    params = (RuleParam("alpha", "the step's scale"),)

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = float(alpha)

    def __eq__(self, other):
        return type(other) is Extrapolate and other.alpha == self.alpha

    def init_state(self, weights, trainable):
        return {"calls": [np.zeros((), np.int64)]}

    def apply(self, weights, sent, average, state, trainable, learning_rate):
        state["calls"][0] += 1
        return [(s + self.alpha * (np.asarray(a, np.float64) - s)).astype(w.dtype) if t
                else np.asarray(a).astype(w.dtype) for w, s, a, t in zip(weights, sent, average, trainable)]

    def describe(self):
        return {"name": self.name, "alpha": self.alpha}


class _Broken(UpdateRule):
    """A user's rule that breaks one promise of the contract, chosen by ``how``."""

    def __init__(self, how):
        self.how = how

    def init_state(self, weights, trainable):
        return {"note": [np.array(["text"], object)]} if self.how == "object state" else {}

    def to_send(self, weights, state, trainable):
        return list(weights)[:-1] if self.how == "to_send short" else list(weights)

    def apply(self, weights, sent, average, state, trainable, learning_rate):
        if self.how == "apply short":
            return list(average)[:1]
        if self.how == "apply None":
            return None
        if self.how == "apply shape":
            return [np.zeros(3)] + [np.asarray(a) for a in average[1:]]
        return [np.asarray(a) * np.nan for a in average] if self.how == "apply nan" else list(average)


@pytest.mark.parametrize("how, message", [
    ("apply short", r"^The update rule 'average' \(_Broken\)'s apply\(\) must return one array per weight of the "
                    r"model: 4\. Got 1\.$"),
    ("apply None", r"_Broken\)'s apply\(\) must return a list of arrays, one per weight of the model \(4\)\. "
                   r"Got NoneType instead\."),
    ("apply shape", r"apply\(\) must return arrays shaped as the weights: weight 0 is \(64, 16\)\. Got \(3,\)"),
    ("apply nan", r"apply\(\) returned NaN or Inf for weight 0, from finite inputs: check its arithmetic and its "
                  r"numbers \(a learning rate of NaN or Inf\)\. The model keeps its weights from before this round"),
    ("to_send short", r"_Broken\)'s to_send\(\) must return one array per weight of the model: 4\. Got 3\."),
    ("object state", r"init_state\(\) must keep the rule's state as numeric arrays \(checkpoints store them\)\. "
                     r"Got an array of dtype object in 'note'\."),
])
def test_a_users_rule_that_breaks_the_contract_is_named_with_the_promise(how, message):
    model, rule = _model(), _Broken(how)
    weights, mask = model.get_weights(), [True] * 4
    with pytest.raises(ConfigurationError, match=message):
        state = rule.init_state(weights, mask)
        sent = rule.to_send(weights, state, mask)
        rule.apply(weights, sent, [w + 0.5 for w in weights], state, mask, 0.1)


def test_a_users_rule_returning_nan_in_a_fit_is_blamed_not_the_workers(in_process_engine):
    model = _model()
    before = model.get_weights()
    with pytest.raises(ConfigurationError, match=r"_Broken\)'s apply\(\) returned NaN or Inf for weight 0"):
        _fit(_Broken("apply nan"), epochs=1, model=model)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_a_rule_of_ones_own_through_fit_sync_and_stale(in_process_engine):
    plain, _, _ = _fit(None, epochs=1)
    mine, trainer, _ = _fit(Extrapolate(1.0), epochs=1)
    _close(mine.get_weights(), plain.get_weights(), rtol=1e-12)  # α = 1: the average (up to s + (a − s) rounding)
    assert int(trainer.update_rule_state["state"]["calls"][0]) == 4
    assert trainer.update_rule_state["rule"]["alpha"] == 1.0
    # by its registered name and a spec, as the jobs and the estimator pass it
    bold, trainer, _ = _fit("extrapolate:alpha=1.5", epochs=1, synchronization="stale", staleness=1,
                            reproducible=True)
    assert {r["update_rule"] for r in trainer.stats.records} == {"extrapolate"}
    assert int(trainer.update_rule_state["state"]["calls"][0]) == 4  # once per block of 2 chunks
    assert max(np.abs(a - b).max() for a, b in zip(bold.get_weights(), plain.get_weights())) > 1e-4
