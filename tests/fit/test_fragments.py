"""``sync_fragments`` (issue 50, part 3): the split, the refusals, and fragment rounds on a classic session.

The fits' tests are tests/parity.py's ``FragmentsMixin``: the same bodies run under Spark Connect in
tests/runtime/test_connect.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_weights_close, make_model, regression_data, spark_session
from parity import FragmentsMixin, linear_model
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer
from sparkdl_avg.driver.fit.fragments import split


@pytest.fixture(scope="module")
def spark():
    """``local[2,3]``: up to 3 attempts per task, for the retried task."""
    with spark_session("local[2,3]", "sparkdl_avg-fragments", log_level="OFF") as session:
        yield session



class TestFragments(FragmentsMixin):
    """tests/parity.py: the same tests run under Spark Connect in test_connect.py."""


@pytest.mark.parametrize("sizes, F, want", [
    ([4, 1], 2, [0, 1]),
    ([32, 8, 8, 1], 2, [0, 1, 1, 1]),
    ([10, 10, 10, 10], 4, [0, 1, 2, 3]),
    ([100, 1, 1, 1], 4, [0, 1, 2, 3]),  # a big first variable: none of the fragments is left empty
    ([1, 1, 1, 100], 2, [0, 0, 0, 1]),
    ([5, 5, 5], 1, [0, 0, 0]),
    # the rounds guide's 64-64-64-10 MLP: [W1], [b1], [W2, b2, W3, b3] before, a round from 0.7% to 54% of the model
    ([4096, 64, 4096, 64, 640, 10], 3, [0, 0, 1, 1, 2, 2]),
])
def test_the_split_is_contiguous_balanced_by_elements_and_leaves_no_fragment_empty(sizes, F, want):
    assert split(sizes, F) == want


def test_the_largest_fragment_is_the_smallest_any_contiguous_split_gives():
    import itertools

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 8))
        sizes = [int(v) for v in rng.choice([1, 3, 10, 64, 640, 4096], size=n)]
        F = int(rng.integers(1, n + 1))
        got = split(sizes, F)
        assert sorted(set(got)) == list(range(F)) and got == sorted(got), (sizes, F, got)
        best = min(max(sum(sizes[a:b]) for a, b in zip((0,) + cuts, cuts + (n,)))
                   for cuts in itertools.combinations(range(1, n), F - 1))
        assert max(sum(v for v, p in zip(sizes, got) if p == q) for q in range(F)) == best, (sizes, F, got)


def test_a_thousand_variables_split_evenly():
    got = split([3] * 1000, 8)
    assert [got.count(p) for p in range(8)] == [125] * 8
    assert got == sorted(got)


def test_more_fragments_than_trainable_variables_are_refused_naming_both_numbers(in_process_engine):
    x, y = regression_data(64, seed=1)
    model = linear_model()
    with pytest.raises(ConfigurationError, match=r"trainable variables \(2\).*sync_fragments=3"):
        ParameterAveragingTrainer(model, num_workers=2, batch_size=8, sync_fragments=3).fit((x, y), verbose=0)


@pytest.mark.parametrize("synchronization", ["stale", "async"])
def test_stale_and_async_are_refused_with_the_reason(synchronization):
    with pytest.raises(ConfigurationError, match=r"'sync_fragments' parameter needs synchronization='sync'.*"
                                                 rf"synchronization='{synchronization}'"):
        ParameterAveragingTrainer(linear_model(), synchronization=synchronization, sync_fragments=2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_sync_fragments_must_be_a_positive_int(bad):
    with pytest.raises(ConfigurationError, match="sync_fragments"):
        ParameterAveragingTrainer(linear_model(), sync_fragments=bad)


def test_an_outer_keras_optimizer_is_refused_naming_the_rule(in_process_engine):
    x, y = regression_data(64, seed=1)
    with pytest.raises(ConfigurationError, match="update_rule 'outer'.*sync_fragments=1"):
        ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, sync_fragments=2,
                                  update_rule="outer:sgd:lr=0.7,momentum=0.9").fit((x, y), verbose=0)


def test_one_fragment_is_the_plain_round(in_process_engine):
    x, y = regression_data(96, seed=3)
    a, b = make_model(seed=1), make_model(seed=1)
    ParameterAveragingTrainer(a, num_workers=2, batch_size=8, averaging_frequency=2, seed=1).fit((x, y), verbose=0)
    ParameterAveragingTrainer(b, num_workers=2, batch_size=8, averaging_frequency=2, seed=1,
                              sync_fragments=1).fit((x, y), verbose=0)
    assert_weights_close(b.get_weights(), a.get_weights(), atol=0)


def test_a_rounds_bytes_per_worker_are_a_fragments_and_batchnorm_statistics_travel_every_round(spark):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))  # four 32×32 layers: fragments of whole variables can be balanced
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    for _ in range(3):
        h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    x, y = regression_data(256, d=32, seed=2)
    sent = {}
    for F in (1, 2, 4):
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
        clone.compile(keras.optimizers.Adam(0.01), "mse")
        trainer = ParameterAveragingTrainer(clone, num_workers=2, batch_size=8, averaging_frequency=4, seed=0,
                                            optimizer_state="local", sync_fragments=F)
        trainer.fit((x, y), epochs=1, verbose=0)
        sent[F] = [r.sent_bytes / r.num_workers for r in trainer.stats.records]
        assert all(np.isfinite(w).all() for w in clone.get_weights())
    moving = 2 * 32 * 4  # BatchNorm's moving mean and variance: in every round's sums
    for F in (2, 4):
        assert max(sent[F]) <= 1.1 / F * sent[1][0] + moving, (F, sent[F], sent[1][0])
        assert min(sent[F]) >= moving


def test_a_model_with_an_embedding_table_is_refused_before_a_round_and_a_small_embedding_trains(spark):
    """Tables of MIN_TABLE_ROWS (1,024) rows or more send their changed rows, not fragments: refused, before any
    round. A smaller embedding is a dense weight like any other: it trains."""
    import keras

    def ids_model(rows):
        ids = keras.Input(shape=(2,), dtype="int32")
        out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(rows, 4)(ids)))
        model = keras.Model(ids, out)
        model.compile(optimizer="sgd", loss="mse")
        return model

    rng = np.random.default_rng(0)
    y = rng.normal(size=(64, 1)).astype("float32")
    trainer = ParameterAveragingTrainer(ids_model(2048), num_workers=2, batch_size=8, sync_fragments=2)
    with pytest.raises(ConfigurationError, match=r"'sync_fragments' parameter does not apply to models with "
                                                 r"embedding tables .*Got sync_fragments=2: pass 1\."):
        trainer.fit((rng.integers(0, 2048, size=(64, 2)).astype("int32"), y), verbose=0)
    assert trainer.stats.records == []
    small = ParameterAveragingTrainer(ids_model(16), num_workers=2, batch_size=8, sync_fragments=2)
    small.fit((rng.integers(0, 16, size=(64, 2)).astype("int32"), y), verbose=0)
    assert small.stats.records and all(r.num_workers == 2 for r in small.stats.records)  # dense: it trains
