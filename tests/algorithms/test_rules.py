"""Block-momentum update rules and averaging schedules.

The maths is checked on plain arrays against hand-computed values; the
trainer's wiring against a sequential Keras reference that applies BMUF by
hand (one worker: the "average" is that worker's weights); and the identities
the papers state (BMUF η=0, ζ=1 and SlowMo α=1, β=0 are plain averaging;
classical BMUF(η, ζ) is SlowMo(β=η, α=ζ) at a constant learning rate)
through full fits on local[2], in float64.
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import keras

from conftest import assert_weights_close, clone_compiled, make_model, max_weight_change, regression_data
from sparkdl_avg import (AdaComm, BlockMomentum, ConfigurationError, DiLoCo, ParameterAveragingTrainer, PostLocalSGD,
                         SlowMo)
from sparkdl_avg.shared.data import example_order
from sparkdl_avg.driver.algorithms import rules
from sparkdl_avg.driver.algorithms.rules import PlainAveraging, as_update_rule, rule_from_name
from sparkdl_avg.driver.algorithms.schedules import as_schedule, next_period

# ------------------------------------------------------------- rule maths


def _arrays(*values):
    return [np.array(v, dtype=np.float64) for v in values]


def test_bmuf_by_hand_two_rounds():
    rule = BlockMomentum(block_momentum=0.5, block_lr=2.0)
    w = _arrays([1.0, 2.0])
    state = rule.init_state(w, [True])
    # round 1: G = 1.5 - 1 = 0.5 (and -1); Δ = 2·G; w = w + Δ
    w1 = rule.apply(w, rule.to_send(w, state, [True]), _arrays([1.5, 1.0]), state, [True], 0.1)
    np.testing.assert_allclose(w1[0], [2.0, 0.0])
    np.testing.assert_allclose(state["delta"][0], [1.0, -2.0])
    # round 2: G = avg - w1 = (0.25, 0.5); Δ = 0.5·(1, -2) + 2·G = (1.0, 0.0)
    w2 = rule.apply(w1, rule.to_send(w1, state, [True]), _arrays([2.25, 0.5]), state, [True], 0.1)
    np.testing.assert_allclose(state["delta"][0], [1.0, 0.0])
    np.testing.assert_allclose(w2[0], [3.0, 0.0])


def test_bmuf_nesterov_sends_the_look_ahead_and_steps_from_the_global_weights():
    rule = BlockMomentum(block_momentum=0.5, nesterov=True)
    w = _arrays([1.0])
    state = {"delta": _arrays([0.4])}
    sent = rule.to_send(w, state, [True])
    np.testing.assert_allclose(sent[0], [1.2])  # w + η·Δ
    new = rule.apply(w, sent, _arrays([1.5]), state, [True], 0.1)
    # G = 1.5 - 1.2 = 0.3; Δ = 0.2 + 0.3 = 0.5; w = 1 + 0.5
    np.testing.assert_allclose(state["delta"][0], [0.5])
    np.testing.assert_allclose(new[0], [1.5])


def test_diloco_is_pytorch_nesterov_sgd_on_the_outer_gradient_and_bmuf_nesterov_sends_the_same_points():
    """Issue 40: DiLoCo's outer step, term by term against torch.optim.SGD(nesterov=True)'s update, by hand."""
    from sparkdl_avg import DiLoCo

    rng = np.random.default_rng(0)
    averages = [rng.normal(size=3) for _ in range(4)]  # what each round's workers averaged to, as offsets
    rule = DiLoCo().resolve(2)
    assert (rule.outer_lr, rule.outer_momentum) == (0.7, 0.9) and as_update_rule("diloco").resolve(2) == rule
    w, state = np.zeros(3), rule.init_state([np.zeros(3)], [True])
    theta, buf = np.zeros(3), None  # torch's SGD: buf = g on the first step, then mu·buf + g (dampening 0)
    bmuf = BlockMomentum(0.9, 0.7, nesterov=True)
    wb, bstate = np.zeros(3), bmuf.init_state([np.zeros(3)], [True])
    for offset in averages:
        sent = rule.to_send([w], state, [True])[0]
        assert np.array_equal(sent, w)  # DiLoCo sends its weights themselves
        w = rule.apply([w], [sent], [sent + offset], state, [True], 0.01)[0]
        g = theta - (theta + offset)  # the outer gradient: what the round moved the weights, negated
        buf = g.copy() if buf is None else 0.9 * buf + g
        theta = theta - 0.7 * (g + 0.9 * buf)
        np.testing.assert_allclose(w, theta, rtol=0, atol=1e-12)
        # BMUF with Nesterov momentum (η = μ, ζ = lr) sends DiLoCo's weights as its look-ahead
        bsent = bmuf.to_send([wb], bstate, [True])[0]
        wb = bmuf.apply([wb], [bsent], [bsent + offset], bstate, [True], 0.01)[0]
        np.testing.assert_allclose(bmuf.to_send([wb], bstate, [True])[0], theta, rtol=0, atol=1e-12)
    assert rule_from_name("diloco") == DiLoCo() and rule_from_name("diloco", 0.5, 0.3) == DiLoCo(0.3, 0.5)
    assert rule_from_name("diloco", None, 1.0) == DiLoCo(outer_lr=1.0)  # no sentinel: 1.0 is 1.0
    with pytest.raises(ConfigurationError, match=r"'outer_momentum' parameter of DiLoCo must be a float in the "
                                                 r"range \[0.0, 1.0\)\. Got 1.0 instead"):
        DiLoCo(outer_momentum=1.0)


def test_diloco_s_outer_momentum_defaults_to_half_where_the_deltas_travel_sparse():
    """A sparse codec's residual already carries what the rounds did not send: 0.5 there, else the paper's 0.9; a
    momentum the user gave is kept either way."""
    from sparkdl_avg import DiLoCo, TrainerConfig

    assert DiLoCo().outer_momentum is None and DiLoCo().resolve(4, sparse_delta=True) == DiLoCo(0.7, 0.5)
    assert DiLoCo(0.3).resolve(4) == DiLoCo(0.3, 0.9)
    assert DiLoCo(0.3, 0.8).resolve(4, sparse_delta=True).outer_momentum == 0.8
    momentum = {(rule, codec): TrainerConfig(update_rule=rule, update_compression=codec).rule(2).outer_momentum
                for rule in ("diloco", "diloco:outer_momentum=0.9") for codec in (None, "int8", "topk", "threshold")}
    assert momentum == {("diloco", None): 0.9, ("diloco", "int8"): 0.9, ("diloco", "topk"): 0.5,
                        ("diloco", "threshold"): 0.5, **{("diloco:outer_momentum=0.9", c): 0.9
                                                         for c in (None, "int8", "topk", "threshold")}}
    with pytest.raises(RuntimeError, match=r"DiLoCo\.resolve\(num_workers, sparse_delta\) must be called before use"):
        DiLoCo().apply([np.zeros(2)], [np.zeros(2)], [np.ones(2)], DiLoCo().init_state([np.zeros(2)], [True]), [True],
                       0.1)


def test_non_trainable_weights_are_plainly_averaged_and_dtypes_kept():
    rule = BlockMomentum(block_momentum=0.9)
    w = [np.array([1.0], np.float32), np.array([5.0], np.float32)]
    state = rule.init_state(w, [True, False])
    assert len(state["delta"]) == 1
    new = rule.apply(w, w, _arrays([2.0], [7.0]), state, [True, False], 0.1)
    assert [a.dtype for a in new] == [np.float32, np.float32]
    np.testing.assert_allclose(new[0], [2.0])
    np.testing.assert_allclose(new[1], [7.0])


def test_default_block_momentum_is_one_minus_one_over_workers():
    assert BlockMomentum().resolve(8).block_momentum == pytest.approx(0.875)
    assert BlockMomentum(0.3).resolve(8).block_momentum == 0.3
    assert as_update_rule("bmuf").resolve(4).describe() == {
        "name": "bmuf", "block_momentum": 0.75, "block_lr": 1.0, "nesterov": False
    }


def test_slowmo_equals_classical_bmuf_at_a_constant_learning_rate():
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (2,)]
    w_b = [rng.normal(size=s) for s in shapes]
    w_s = [a.copy() for a in w_b]
    bmuf, slowmo = BlockMomentum(0.7, 0.8), SlowMo(0.7, 0.8)
    sb, ss = bmuf.init_state(w_b, [True, True]), slowmo.init_state(w_s, [True, True])
    for _ in range(5):
        avg = [a + rng.normal(scale=0.1, size=a.shape) for a in w_b]
        w_b = bmuf.apply(w_b, w_b, avg, sb, [True, True], 0.05)
        w_s = slowmo.apply(w_s, w_s, [a.copy() for a in avg], ss, [True, True], 0.05)
        assert_weights_close(w_s, w_b, atol=1e-12)
    # with a changing learning rate they differ: SlowMo's buffer is in gradient units
    avg = [a + 0.1 for a in w_b]
    w_b = bmuf.apply(w_b, w_b, avg, sb, [True, True], 0.05)
    w_s = slowmo.apply(w_s, w_s, avg, ss, [True, True], 0.01)
    assert max_weight_change(w_b, w_s) > 1e-3


def test_identity_rules_are_plain_averaging_on_arrays():
    w = _arrays([1.0, -1.0])
    avg = _arrays([0.25, 3.0])
    for rule in (BlockMomentum(0.0, 1.0), SlowMo(0.0, 1.0), PlainAveraging()):
        state = rule.init_state(w, [True])
        np.testing.assert_allclose(rule.apply(w, w, avg, state, [True], 0.1)[0], avg[0], rtol=1e-15)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: BlockMomentum(block_momentum=1.0), r"'block_momentum' parameter of BlockMomentum.*\[0.0, 1.0\).*Got 1.0"),
        (lambda: BlockMomentum(block_lr=0), r"'block_lr' parameter of BlockMomentum must be a float in the range "
                                            r"\(0.0, inf\). Got 0"),
        # issue 48: the range said "[0.0, inf)" while 0 was refused; the text comes from the check itself
        (lambda: DiLoCo(outer_lr=-0.5), r"'outer_lr' parameter of DiLoCo must be a float in the range \(0.0, inf\)\. "
                                        r"Got -0.5 instead"),
        (lambda: DiLoCo(outer_lr=0), r"'outer_lr' parameter of DiLoCo must be a float in the range \(0.0, inf\)\. "
                                     r"Got 0 instead"),
        (lambda: BlockMomentum(nesterov="yes"), r"'nesterov'.*bool. Got 'yes'"),
        (lambda: SlowMo(slow_momentum=-0.1), r"'slow_momentum' parameter of SlowMo.*Got -0.1"),
        (lambda: SlowMo(slow_lr=float("nan")), r"'slow_lr' parameter of SlowMo.*Got nan"),
        (lambda: as_update_rule("momentum"), r"'update_rule'.*'bmuf'.*Got 'momentum' instead"),
        (lambda: rule_from_name("average", 0.5), r"apply to the block-momentum rules.*update_rule='average'"),
        (lambda: rule_from_name("bmuf", 1.5), r"'block_momentum'.*Got 1.5"),
        (lambda: rule_from_name("outer:adam", 0.5), r"apply to the block-momentum rules \('bmuf', 'bmuf_nesterov', "
                                                    r"'slowmo', 'diloco'\), not to update_rule='outer:adam'"),
        (lambda: as_update_rule("bmuf:nesterov"), r"rule spec with the rule's parameters \(block_momentum, "
                                                  r"block_lr\); nesterov is none of them. Got 'bmuf:nesterov'"),
        (lambda: as_update_rule("slowmo:slow_lr=fast"), r"spec whose slow_lr is a float. Got 'slowmo:slow_lr=fast'"),
        (lambda: as_update_rule("slowmo:slow_lr=0"), r"'slow_lr' parameter of SlowMo must be a float in the range \(0.0, inf\)"),
        (lambda: as_update_rule("average:x=1"), r"rule's parameters \(no parameters\); x is none of them"),
        (lambda: rule_from_name("slowmo:slow_lr=2", None, 3.0), r"'update_rule' parameter sets slow_lr in "
                                                                r"'slowmo:slow_lr=2' and 'block_lr' sets it too"),
    ],
)
def test_rule_errors(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


# ------------------------------------------------------------- the registry


def test_every_name_resolves_in_the_registry_to_its_class_with_its_defaults():
    assert rules.RULES.names()[:6] == ("average", "bmuf", "bmuf_nesterov", "slowmo", "diloco", "outer")
    assert [as_update_rule(n) for n in ("average", "bmuf", "bmuf_nesterov", "slowmo", "diloco")] == [
        PlainAveraging(), BlockMomentum(), BlockMomentum(nesterov=True), SlowMo(), DiLoCo()]
    assert as_update_rule(None) == PlainAveraging() and as_update_rule(SlowMo(0.1)) == SlowMo(0.1)
    assert [r.name for r in (PlainAveraging(), SlowMo(), DiLoCo(), BlockMomentum(nesterov=True))] == [
        "average", "slowmo", "diloco", "bmuf_nesterov"]
    # each rule's declared parameters are its fields, with their types and defaults
    declared = {cls.__name__: [(p.name, p.type, p.default, p.flat) for p in cls.parameters()]
                for cls in (PlainAveraging, BlockMomentum, SlowMo, DiLoCo)}
    assert declared == {
        "PlainAveraging": [],
        "BlockMomentum": [("block_momentum", Optional[float], None, "block_momentum"),
                          ("block_lr", float, 1.0, "block_lr")],
        "SlowMo": [("slow_momentum", float, 0.5, "block_momentum"), ("slow_lr", float, 1.0, "block_lr")],
        "DiLoCo": [("outer_lr", float, 0.7, "block_lr"), ("outer_momentum", Optional[float], None, "block_momentum")],
    }


def test_a_spec_sets_the_declared_parameters_and_the_flat_options_theirs_without_a_sentinel():
    assert as_update_rule("slowmo:slow_momentum=0.7,slow_lr=2") == SlowMo(0.7, 2.0)
    assert as_update_rule("bmuf_nesterov:block_momentum=0.5") == BlockMomentum(0.5, nesterov=True)
    assert as_update_rule("bmuf:block_momentum=none") == BlockMomentum()
    assert as_update_rule("diloco:outer_lr=0.5") == DiLoCo(outer_lr=0.5)
    assert rule_from_name("slowmo:slow_lr=2", 0.7) == SlowMo(0.7, 2.0)
    # no stand-in defaults: unset flat options leave each rule's own
    assert [rule_from_name(n) for n in ("bmuf", "slowmo", "diloco")] == [BlockMomentum(), SlowMo(), DiLoCo()]
    assert rule_from_name("diloco", 0.8, 1.0) == DiLoCo(outer_lr=1.0, outer_momentum=0.8)


def test_the_flat_options_derive_from_the_rules_parameters():
    from sparkdl_avg.driver.config import options

    momentum, lr = options.option("block_momentum"), options.option("block_lr")
    assert momentum.help == "the rule's momentum: BMUF's eta, SlowMo's beta or DiLoCo's outer momentum"
    assert momentum.unset == ("1 - 1/workers for BMUF, 0.5 for SlowMo, 0.9 (0.5 with a sparse update_compression) "
                              "for DiLoCo")
    assert lr.help == "the rule's learning rate: BMUF's zeta, SlowMo's alpha or DiLoCo's outer lr"
    assert lr.unset == "1 for BMUF, 1 for SlowMo, 0.7 for DiLoCo"
    assert (momentum.aliases, lr.aliases) == (("slow_momentum", "outer_momentum"), ("slow_lr", "outer_lr"))
    assert (momentum.default, lr.default) == (None, None)
    assert options.option("update_rule").help.startswith(
        "how the average becomes the next weights: 'average', 'bmuf', 'bmuf_nesterov', 'slowmo', 'diloco'")


def test_a_new_rule_is_one_class_found_by_its_names():
    @dataclass(frozen=True)
    class Halfway(rules.UpdateRule):
        """``w ← w + scale·(w̄ − w)``; its scale is also the flat ``block_lr``."""

        scale: float = 0.5
        names = ("toy_halfway",)
        params = (rules.RuleParam("scale", "the toy's scale", flat="block_lr"),)

        def apply(self, weights, sent, average, state, trainable, learning_rate):
            return [(w + self.scale * (np.asarray(a, np.float64) - w)).astype(w.dtype)
                    for w, a in zip(weights, average)]

    assert as_update_rule("toy_halfway") == Halfway() and as_update_rule("toy_halfway:scale=0.25") == Halfway(0.25)
    assert rule_from_name("toy_halfway", None, 0.75) == Halfway(0.75)
    assert "the toy's scale" in rules.flat_option("block_lr", "x")["help"]
    assert rules.RULES.names()[-1] == "toy_halfway" and Halfway().name == "toy_halfway"
    with pytest.raises(ValueError, match=r"'toy_halfway' is taken by"):
        type("Other", (rules.UpdateRule,), {"names": ("toy_halfway",)})
    with pytest.raises(ConfigurationError, match=r"'block_momentum' and 'block_lr' parameters apply"):
        rule_from_name("toy_halfway", 0.5)


def test_names_given_as_a_string_are_refused_not_read_as_one_rule_per_letter():
    before = rules.RULES.names()
    with pytest.raises(TypeError, match=r"^Update rule R's names must be a tuple of strings, such as \('mine',\)\. "
                                        r"Got 'qastr' instead\.$"):
        class R(rules.UpdateRule):
            names = "qastr"
    with pytest.raises(TypeError, match=r"names must be a tuple of strings.*Got \['toy_list'\] instead"):
        type("L", (rules.UpdateRule,), {"names": ["toy_list"]})
    with pytest.raises(ValueError, match=r"needs a name of its own matching \[a-z\]\[a-z0-9_\]\*\. Got 'Toy' instead"):
        type("Upper", (rules.UpdateRule,), {"names": ("toy_upper", "Toy")})
    assert rules.RULES.names() == before  # nothing registered, not even the good name before the bad one


def test_the_cli_and_the_estimator_take_specs_and_name_their_own_option_in_errors(capsys):
    import argparse

    from sparkdl_avg import OuterOptimizer
    from sparkdl_avg.driver.api import cli
    from sparkdl_avg.ml import KerasAveragingEstimator

    parser = argparse.ArgumentParser()
    cli.add_data_args(parser)
    cli.add_trainer_args(parser)
    parse = lambda *flags: parser.parse_args(["--data", "d", *flags])  # noqa: E731
    options = cli.trainer_options(parse("--update-rule", "outer:sgd:lr=0.7,momentum=0.9,nesterov"))
    assert options["update_rule"] == OuterOptimizer(keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True))
    options = cli.trainer_options(parse("--update-rule", "slowmo", "--block-lr", "2"))
    assert options["update_rule"] == SlowMo(0.5, 2.0)

    def main(argv):
        cli.trainer_options(parse("--update-rule", "slowmo:slow_lr=2", "--block-lr", "3"))

    assert cli.run(main) == 2
    assert ("The --update-rule flag sets slow_lr in 'slowmo:slow_lr=2' and --block-lr sets it too: give it once."
            in capsys.readouterr().err)
    est = KerasAveragingEstimator(updateRule="outer:adam:lr=0.001")
    assert est._trainer_options()["update_rule"] == OuterOptimizer(keras.optimizers.Adam(0.001))
    est = KerasAveragingEstimator(kerasModel=make_model(), updateRule="slowmo:slow_lr=fast")
    with pytest.raises(ConfigurationError, match=r"^The 'updateRule' parameter must be a rule spec whose slow_lr "
                                                 r"is a float. Got 'slowmo:slow_lr=fast' instead.$"):
        est.fit(None)


def test_trainer_rejects_a_bad_update_rule_before_any_spark_job():
    with pytest.raises(ConfigurationError, match=r"'update_rule'.*Got 3 instead\.$"):
        ParameterAveragingTrainer(make_model(), update_rule=3)


def test_a_bare_keras_optimizer_as_the_rule_is_pointed_to_outer_optimizer():
    with pytest.raises(ConfigurationError, match=r"'update_rule'.*Got <keras.*SGD object at .*> instead\. A Keras "
                                                 r"optimizer as the outer one goes in OuterOptimizer: "
                                                 r"update_rule=OuterOptimizer\(keras\.optimizers\.SGD\(\.\.\.\)\)\.$"):
        ParameterAveragingTrainer(make_model(), update_rule=keras.optimizers.SGD(0.7))


def test_an_outer_learning_rate_that_is_a_function_is_refused_without_keras_unsafe_mode_advice():
    from sparkdl_avg import OuterOptimizer

    with pytest.warns(UserWarning), pytest.raises(ConfigurationError) as raised:  # Keras warns of the lambda itself
        OuterOptimizer(keras.optimizers.SGD(learning_rate=lambda: 0.7))
    assert str(raised.value) == (
        "The 'optimizer' parameter of OuterOptimizer must be a Keras optimizer that its get_config() rebuilds (a "
        "learning rate that is a number or a keras.optimizers.schedules.LearningRateSchedule, not a function): the "
        "optimizer is rebuilt from its config in checkpoints and on resume. SGD's is not rebuilt (ValueError: "
        "Requested the deserialization of a Python lambda).")


# -------------------------------------------------------------- schedules


def test_post_local_sgd_periods():
    s = PostLocalSGD(switch_epoch=2, period_after=6)
    assert [s.period(e, 0, {}) for e in range(4)] == [1, 1, 6, 6]


def test_adacomm_shortens_with_the_loss_and_never_lengthens():
    s = AdaComm(initial_period=16, min_period=2)
    assert s.period(0, 0, {}) == 16  # no loss yet
    assert s.period(0, 1, {"loss": 4.0}) == 16  # the first loss seen: L0 = 4
    assert s.period(0, 2, {"loss": 1.0}) == 16  # adapts at epoch starts only
    assert s.period(1, 0, {"loss": 1.0}) == 8  # ceil(16 * sqrt(1/4))
    assert s.period(2, 0, {"loss": 2.0}) == 8  # sqrt(1/2)·16 = 11.3 > 8: keeps 8
    assert s.period(3, 0, {"loss": 0.01}) == 2  # ceil(0.8) = 1 < min_period
    with pytest.raises(ConfigurationError, match=r"'min_period' parameter of AdaComm must be <= initial_period \(4\)"):
        AdaComm(initial_period=4, min_period=5)


def test_schedule_errors():
    with pytest.raises(ConfigurationError, match=r"'averaging_frequency'.*callable.*Got 0 instead"):
        as_schedule(0)
    with pytest.raises(ConfigurationError, match=r"'period_after' parameter of PostLocalSGD.*Got 0"):
        PostLocalSGD(1, 0)
    def every_round():
        return 8

    with pytest.raises(ConfigurationError, match=r"^The 'averaging_frequency' function "
                                                 r"test_schedule_errors\.<locals>\.every_round\(\) must take three "
                                                 r"arguments, \(epoch, round, logs\), and return the round's k: it is "
                                                 r"asked before every round\.$"):
        as_schedule(every_round)
    assert as_schedule(lambda *args: 8).period(0, 0, {}) == 8  # what binds three arguments is taken
    bad = as_schedule(lambda epoch, rnd, logs: 2.5)
    with pytest.raises(ConfigurationError, match=r"must return an int >= 1; for epoch 3, round 1 it returned 2.5"):
        next_period(bad, 3, 1, {}, 10)
    assert next_period(as_schedule(8), 0, 0, {}, 3) == 3  # cut to what the epoch has left


# ---------------------------------------------------- through the trainer

B = 8


def _fit(model, rule, k=3, n=2, epochs=2, data=None, **kw):
    x, y = data if data is not None else regression_data(10 * n * B, seed=4)
    trainer = ParameterAveragingTrainer(
        model, num_workers=n, batch_size=B, averaging_frequency=k, update_rule=rule, seed=0
    )
    history = trainer.fit((x, y), epochs=epochs, verbose=0, shuffle=False, **kw)
    return trainer, history


def _model():
    return make_model(optimizer=keras.optimizers.SGD(0.05), seed=5)


@pytest.mark.parametrize("nesterov", [False, True], ids=["classical", "nesterov"])
def test_bmuf_one_worker_equals_a_hand_applied_reference(in_process_engine, nesterov):
    """N=1: the round's average is the replica itself, so BMUF is checkable with plain Keras."""
    eta, zeta, k, epochs = 0.6, 0.9, 5, 2
    x, y = regression_data(13 * B, seed=6)  # rounds of 5, 5, 3 minibatches
    opt = lambda: keras.optimizers.SGD(0.05, momentum=0.5)  # noqa: E731
    model = make_model(optimizer=opt(), seed=6)
    ref = clone_compiled(model, opt())
    w = ref.get_weights()
    delta = [np.zeros_like(a) for a in w]
    for _ in range(epochs):
        start = 0
        for steps in example_order.round_lengths(len(x), 1, B, k):
            sent = [a + eta * d for a, d in zip(w, delta)] if nesterov else w
            ref.set_weights(sent)  # the optimizer's momentum carries over, as averaged state does
            for b in range(start, start + steps):
                ref.train_on_batch(x[b * B : (b + 1) * B], y[b * B : (b + 1) * B])
            start += steps
            delta = [eta * d + zeta * (a - s) for d, a, s in zip(delta, ref.get_weights(), sent)]
            w = [a + d for a, d in zip(w, delta)]

    trainer, _ = _fit(model, BlockMomentum(eta, zeta, nesterov=nesterov), k=k, n=1, epochs=epochs, data=(x, y))
    assert_weights_close(model.get_weights(), w, atol=1e-10)
    assert trainer.update_rule_state["rule"]["name"] == ("bmuf_nesterov" if nesterov else "bmuf")
    assert [r["update_rule"] for r in trainer.stats.records] == [trainer.update_rule_state["rule"]["name"]] * 6


def test_identity_rules_equal_plain_averaging_through_fit(in_process_engine):
    plain = _model()
    _fit(plain, None)
    assert max_weight_change(_model().get_weights(), plain.get_weights()) > 1e-3
    for rule in (BlockMomentum(0.0, 1.0), SlowMo(0.0, 1.0)):
        model = _model()
        _fit(model, rule)
        assert_weights_close(model.get_weights(), plain.get_weights(), atol=1e-12)


def test_classical_bmuf_equals_slowmo_through_fit_and_momentum_matters(in_process_engine):
    bmuf, slowmo, plain = _model(), _model(), _model()
    _fit(bmuf, BlockMomentum(0.6, 0.8))
    _fit(slowmo, SlowMo(slow_momentum=0.6, slow_lr=0.8))
    _fit(plain, None)
    assert_weights_close(slowmo.get_weights(), bmuf.get_weights(), atol=1e-12)
    assert max_weight_change(bmuf.get_weights(), plain.get_weights()) > 1e-3


def test_block_momentum_state_survives_a_second_fit(in_process_engine):
    once, twice = _model(), _model()
    _fit(once, "bmuf", epochs=2)
    trainer, _ = _fit(twice, "bmuf", epochs=1)
    delta_after_one = [d.copy() for d in trainer.update_rule_state["state"]["delta"]]
    assert max(np.abs(d).max() for d in delta_after_one) > 0
    trainer.fit(regression_data(10 * 2 * B, seed=4), epochs=1, verbose=0, shuffle=False)
    # shuffle=False visits the same order every epoch, so two fits of one epoch are one fit of two
    assert_weights_close(twice.get_weights(), once.get_weights(), atol=1e-12)


def test_post_local_sgd_and_callable_schedules_set_each_rounds_k(in_process_engine):
    trainer, history = _fit(_model(), None, k=PostLocalSGD(switch_epoch=1, period_after=4))
    ks = [(r["epoch"], r["averaging_frequency"]) for r in trainer.stats.records]
    assert ks == [(0, 1)] * 10 + [(1, 4), (1, 4), (1, 2)]  # 10 minibatches per worker per epoch

    seen = []

    def schedule(epoch, rnd, logs):
        seen.append((epoch, rnd, dict(logs)))
        return 2 + epoch

    trainer, history = _fit(_model(), None, k=schedule)
    assert [r["averaging_frequency"] for r in trainer.stats.records] == [2] * 5 + [3, 3, 3, 1]
    assert [(e, r) for e, r, _ in seen] == [(0, r) for r in range(5)] + [(1, r) for r in range(4)]
    assert seen[0][2] == {}
    assert set(seen[1][2]) == {"loss", "mae"}  # the running means of the epoch so far
    # round 0 of epoch 1 sees the previous epoch's logs, as History records them
    assert seen[5][2]["loss"] == pytest.approx(history.history["loss"][0], rel=1e-12)


def test_adacomm_through_fit_records_non_increasing_periods(in_process_engine):
    x, y = regression_data(40 * 2 * B, seed=7)
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=7)
    trainer, history = _fit(model, None, k=AdaComm(initial_period=16), epochs=4, data=(x, y))
    periods = [r["averaging_frequency"] for r in trainer.stats.records if r["round"] == 0]
    assert periods[0] == 16
    assert periods == sorted(periods, reverse=True)
    assert periods[-1] < 16  # the loss fell, so the period shortened
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_estimator_update_rule_params_are_validated(spark):
    from sparkdl_avg.ml import KerasAveragingEstimator

    df = spark.createDataFrame([([0.0, 1.0, 2.0, 3.0], 1.0)] * 4, "features array<double>, label double")
    with pytest.raises(ConfigurationError, match=r"'updateRule'.*Got 'nope' instead"):
        KerasAveragingEstimator(kerasModel=make_model(), updateRule="nope").fit(df)
    with pytest.raises(ConfigurationError, match=r"^The 'updateRule' parameter must be an update rule given as a "
                                                 r"string \(its name or spec, as the CLI takes it; 'update_rule' in "
                                                 r"the option reference\): an estimator's parameters are saved with "
                                                 r"the pipeline\. Got DiLoCo\(.*\) instead\.$"):
        KerasAveragingEstimator(kerasModel=make_model(), updateRule=DiLoCo())
    with pytest.raises(ConfigurationError, match=r"'blockMomentum'.*Got 1.0"):
        KerasAveragingEstimator(kerasModel=make_model(), updateRule="bmuf", blockMomentum=1.0).fit(df)
    est = KerasAveragingEstimator(kerasModel=make_model(), updateRule="slowmo", blockMomentum=0.7)
    assert est._trainer_options()["update_rule"] == SlowMo(0.7, 1.0)


def test_an_estimator_saved_with_the_old_block_lr_default_loads_with_each_rules_own(spark, tmp_path):
    """Before the registry, blockLearningRate defaulted to 1.0 (standing for DiLoCo's 0.7); saved stages carry it."""
    from sparkdl_avg.ml import KerasAveragingEstimator

    old = KerasAveragingEstimator(kerasModel=make_model(), updateRule="diloco")
    old._setDefault(blockLearningRate=1.0)
    old.save(str(tmp_path / "stage"))
    loaded = KerasAveragingEstimator.load(str(tmp_path / "stage"))
    assert not loaded.isDefined(loaded.blockLearningRate)
    assert loaded._trainer_options()["update_rule"] == DiLoCo()


# ------------------------------------------- one update arithmetic for rounds and stale chunks


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("delta_sums", [False, True], ids=["sums", "delta-sums"])
def test_rounds_and_stale_chunks_read_the_sums_with_one_function_bitwise_as_before(dtype, delta_sums):
    """fit/update.py replaced two copies of this arithmetic (RoundRunner.update, StaleUpdater.apply): the
    formulas each had, written out here, give bitwise what the shared function does."""
    from sparkdl_avg.driver.fit.update import replica_means, round_state
    from sparkdl_avg.shared.wire.aggregation import PartialResult

    rng = np.random.default_rng(1)
    sent = [rng.normal(size=(3, 2)).astype(dtype), rng.normal(size=2).astype(dtype)]
    opt = [np.asarray(7, np.int64), rng.normal(size=(3, 2)).astype(dtype), rng.normal(size=2).astype(dtype)]
    sums = [rng.normal(size=a.shape).astype(dtype) * 5 for a in sent]
    opt_sums = [np.asarray(35.0)] + [rng.normal(size=a.shape).astype(dtype) * 5 for a in opt[1:]]
    result = PartialResult(examples=5, weight_sums=sums, optimizer_sums=opt_sums, delta_sums=delta_sums)
    # RoundRunner.update before
    if delta_sums:
        average = [np.asarray(s, np.float64) + x / 5 for s, x in zip(sent, sums)]
        old_opt = [(np.asarray(v, np.float64) + x / 5).astype(np.asarray(v).dtype) for v, x in zip(opt, opt_sums)]
    else:
        average = [x / 5 for x in sums]
        old_opt = result.average(opt_sums, opt)
    old_opt[0] = np.asarray(7 + 3, np.int64)
    rule = BlockMomentum(0.5, 0.8)
    old_state, new_state = rule.init_state(sent, [True, True]), rule.init_state(sent, [True, True])
    old_weights = rule.apply(sent, sent, average, old_state, [True, True], 0.1)
    new_weights, new_opt = round_state(result, sent, sent, opt, rule, new_state, [True, True], 0.1, True, 0, 3)
    for a, b in zip(new_weights + new_opt + new_state["delta"], old_weights + old_opt + old_state["delta"]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    # StaleUpdater.apply before: the move of each array from what the chunk read, float64
    for got, total, base in zip(replica_means(sums, 5, sent, delta_sums, move=True), sums, sent):
        mean = np.asarray(total, np.float64) / 5
        assert np.array_equal(got, mean if delta_sums else mean - base)
