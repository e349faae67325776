"""The state sent as bases and patches (shared/wire/state_patch.py, driver/transport/downlink.py).

Under ``optimizer_state="local"`` the ``"spark"`` transport (and the in-process engine's, which is it) sends a base of
the weights and of the optimizer variables once and each round what changed since the round before: the executors
must rebuild the whole state bitwise from the base and the chain of patches, whatever the dtype's special values, and
the driver must let a base and its chain go only once no job reads them.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras

from conftest import make_model, regression_data
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.driver.transport import downlink as downlink_module
from sparkdl_avg.driver.transport.downlink import Downlink
from sparkdl_avg.shared.model.modelspec import get_state
from sparkdl_avg.shared.wire.local_broadcast import LocalBroadcast
from sparkdl_avg.shared.wire import state_patch
from sparkdl_avg.shared.wire.state_patch import apply, diff


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def test_a_patch_rebuilds_every_array_bitwise_with_negative_zeros_nans_and_counters():
    rng = np.random.default_rng(0)
    base = [rng.normal(size=(50, 40)).astype(np.float32), np.zeros(7, np.float64), np.asarray(12, np.int64),
            rng.normal(size=3).astype(np.float32)]
    new = [a.copy() for a in base]
    new[0][3, 4] = -0.0 if base[0][3, 4] != 0 else 1.0
    new[0][10, 0] = np.float32("nan")
    new[1][2] = -0.0  # +0.0 -> -0.0: equal as numbers, not as bits
    new[2] = np.asarray(20, np.int64)
    nan_payload = np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    new[3][1] = nan_payload
    patch = diff(base, new)
    kinds = [None if e is None else e[0] for e in patch.entries]
    assert kinds == ["at", "at", "all", "at"]
    # two float32 values and a position each (4 + 4), one float64 (4 + 8), the 0-d counter whole, one float32
    assert patch.nbytes == 2 * 8 + 12 + 8 + 8
    rebuilt = apply(base, patch.entries)
    for got, want in zip(rebuilt, new):
        _same_bits(got, want)
    assert np.asarray(base[1])[2].tobytes() == np.float64(0.0).tobytes()  # the base is left as it was


class _ExecutorBroadcast:
    """A Python worker's view of a Spark broadcast: the pickled value in a file, ``value`` cached once read."""

    def __init__(self, value, path):
        import pickle

        with open(path, "wb") as f:
            pickle.dump(value, f)
        self._path, self.reads_of_value = str(path), 0

    def load_from_path(self, path):
        import pickle

        with open(path, "rb") as f:
            return pickle.load(f)

    @property
    def value(self):
        self.reads_of_value += 1
        return self.load_from_path(self._path)


def test_an_executor_unpickles_its_base_afresh_each_round_and_applies_the_chain_in_place(tmp_path):
    base = [np.arange(6, dtype=np.float32), np.asarray(3, np.int64)]
    middle = [base[0].copy(), np.asarray(6, np.int64)]
    middle[0][4] = -1.0
    new = [middle[0].copy(), np.asarray(9, np.int64)]
    new[0][[1, 4]] = [7.0, -0.0]  # the second patch changes again what the first changed
    weights = _ExecutorBroadcast([base[0]], tmp_path / "w")
    optimizer = _ExecutorBroadcast([base[1]], tmp_path / "o")
    chains = [[_ExecutorBroadcast(diff([a[i]], [b[i]]).entries, tmp_path / f"p{i}{n}")
               for n, (a, b) in enumerate([(base, middle), (middle, new)])] for i in range(2)]
    state = state_patch.PatchedState((weights, tuple(chains[0])), (optimizer, tuple(chains[1])))
    for _ in range(2):  # a second task on the same Python worker reads the same
        got_weights, got_optimizer = state.load()
        for got, want in zip(got_weights + got_optimizer, new):
            _same_bits(got, want)
    # never the cached values: no copy of a base or a patch kept in the worker between tasks
    assert weights.reads_of_value == optimizer.reads_of_value == 0
    assert not [bc for chain in chains for bc in chain if bc.reads_of_value]
    first = state_patch.PatchedState((weights, tuple(chains[0][:1])), None).load()
    assert first[1] is None
    _same_bits(first[0][0], middle[0])
    own = [np.arange(3, dtype=np.float32)]
    patched = apply(own, diff(own, [np.array([0, 5, 2], np.float32)]).entries, in_place=True)
    assert patched[0] is own[0] and own[0][1] == 5


def test_an_array_changed_in_more_than_half_its_values_or_reshaped_travels_whole():
    base = [np.arange(10, dtype=np.float32), np.arange(6, dtype=np.float32), np.ones(4, np.float32)]
    new = [base[0] + np.r_[np.ones(6), np.zeros(4)].astype(np.float32), np.arange(6, dtype=np.float32).reshape(2, 3),
           base[2].copy()]
    patch = diff(base, new)
    assert [None if e is None else e[0] for e in patch.entries] == ["all", "all", None]
    assert patch.nbytes == 40 + 24
    for got, want in zip(apply(base, patch.entries), new):
        _same_bits(got, want)
    with pytest.raises(ValueError, match="as many arrays as its base: 2 against 3"):
        diff(base, new[:2])


class _Engine:
    """Broadcasts that say when they were unpersisted."""

    def __init__(self):
        self.made, self.unpersisted = [], []

    def broadcast(self, value):
        bc = LocalBroadcast(value)
        bc.unpersist = lambda blocking=False, bc=bc: self.unpersisted.append(bc)
        self.made.append(bc)
        return bc


def test_each_round_sends_its_patch_against_the_round_before_and_a_base_goes_once_replaced_and_unread():
    engine = _Engine()
    link = Downlink(engine)
    weights = [np.zeros(100, np.float32)]
    optimizer = [np.asarray(0, np.int64), np.zeros(100, np.float32)]
    state1, release1, n1 = link.publish(weights, optimizer)
    assert n1 == 400 + 8 + 400  # both bases, whole
    assert state1.weights[1] == state1.optimizer[1] == ()
    weights2 = [weights[0].copy()]
    weights2[0][5] = 1.0
    optimizer2 = [np.asarray(8, np.int64), optimizer[1]]
    state2, release2, n2 = link.publish(weights2, optimizer2)
    assert n2 == 8 + 8  # one weight and its position; the counter whole
    for got, want in zip(sum(state2.load(), []), weights2 + optimizer2):
        _same_bits(got, want)
    weights3 = [weights2[0].copy()]
    weights3[0][[5, 6]] = [2.0, 3.0]
    state3, release3, n3 = link.publish(weights3, optimizer2)
    assert n3 == 2 * 8  # against round 2, not the base: two weights; the counter as in round 2, so nothing
    assert len(state3.weights[1]) == 2 and state3.weights[1][0] is state2.weights[1][0]  # the chain grows
    assert state3.optimizer[1] == state2.optimizer[1]
    for got, want in zip(sum(state3.load(), []), weights3 + optimizer2):
        _same_bits(got, want)
    release1()
    weights4 = [np.arange(100, dtype=np.float32)]  # all changed: a new base of the weights
    state4, release4, n4 = link.publish(weights4, optimizer2)
    assert n4 == 400  # the weights' new base; the optimizer's unchanged
    old_weights = [state1.weights[0], *state3.weights[1]]  # the old base and its chain
    assert not [bc for bc in old_weights if bc in engine.unpersisted]  # rounds 2 and 3's jobs still read them
    release2()
    assert not [bc for bc in old_weights if bc in engine.unpersisted]
    release3()
    assert all(bc in engine.unpersisted for bc in old_weights)
    assert state1.optimizer[0] not in engine.unpersisted  # still the optimizer's base
    _same_bits(state4.load()[0][0], weights4[0])
    release4()
    release4()  # twice: nothing more
    link.close()
    assert state4.weights[0] in engine.unpersisted and state4.optimizer[0] in engine.unpersisted
    assert all(bc in engine.unpersisted for bc in state4.optimizer[1])


def test_a_chain_that_outgrows_its_share_of_the_base_becomes_a_new_base():
    link = Downlink(_Engine(), chain_share=0.3)
    weights = np.zeros(100, np.float32)
    sent = []
    for r in range(6):
        weights = weights.copy()
        weights[r * 5:(r + 1) * 5] = r + 1  # 5 new values a round: 40 bytes against a 400-byte base
        state, release, n = link.publish([weights], None)
        sent.append((n, len(state.weights[1])))
        _same_bits(state.load()[0][0], weights)
        release()
    # the chain reaches 120 bytes (0.3 x 400) after three patches; the fourth would pass it: a new base
    assert sent == [(400, 0), (40, 1), (40, 2), (40, 3), (400, 0), (40, 1)]


def _local_fit(**options):
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=3)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=5,
                                        slow_warning=False, optimizer_state="local", **options)
    x, y = regression_data(200, seed=7)
    trainer.fit((x, y), epochs=2, verbose=0)
    weights, optimizer = get_state(model)
    return weights + optimizer, [r.state_bytes for r in trainer.stats]


@pytest.mark.parametrize("options", [dict(), dict(update_compression="topk")], ids=["float32", "topk"])
def test_a_local_state_fit_sends_patches_after_its_first_round_and_ends_bitwise_as_with_whole_states(
        in_process_engine, monkeypatch, options):
    patched, sent = _local_fit(**options)
    monkeypatch.setattr(state_patch, "REBASE_SHARE", 0.0)  # every round's state whole: what was sent before
    whole, sent_whole = _local_fit(**options)
    for got, want in zip(patched, whole):
        _same_bits(got, want)
    state = sent_whole[0]
    assert sent_whole == [state] * len(sent_whole)
    assert sent[0] == state
    # Adam's two moments and the counter stay the driver's: only the weights (and the counter) travel after the first
    weights = sum(np.asarray(w).nbytes for w in patched[:4])
    assert all(s <= weights + 16 for s in sent[1:]), (sent, weights)
    assert state > 2.9 * weights


def test_on_spark_a_local_state_fit_sends_patches_and_ends_bitwise_as_the_files_transport(spark):
    """Real Python workers: each reads its bases from the executor's broadcast files, round after round."""
    def fit(transport):
        model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=3)
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=5,
                                            slow_warning=False, optimizer_state="local", state_transport=transport)
        x, y = regression_data(200, seed=7)
        trainer.fit((x, y), epochs=2, verbose=0)
        weights, optimizer = get_state(model)
        return weights + optimizer, [(r.transport, r.state_bytes) for r in trainer.stats]

    patched, sent = fit("spark")
    whole, sent_whole = fit("files")
    for got, want in zip(patched, whole):
        _same_bits(got, want)
    state = sum(np.asarray(a).nbytes for a in whole)
    weights = sum(np.asarray(w).nbytes for w in whole[:4])
    assert sent_whole == [("files", state)] * len(sent_whole)
    assert sent[0] == ("spark", state)
    assert all(t == "spark" and s <= weights + 16 for t, s in sent[1:]), (sent, weights)
