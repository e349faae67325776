"""Fits of an embedding model whose rounds carry only the changed rows: every transport alike, close to dense rounds."""

from __future__ import annotations

import numpy as np
import pytest

from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.driver.transport import base

ROWS, DIM = 4096, 8
RNG = np.random.default_rng(3)
IDS = RNG.integers(0, ROWS, size=(192, 1)).astype(np.int64)
LABELS = (IDS[:, 0] % 7 / 7.0).astype(np.float32)[:, None]


def _model(optimizer):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,), dtype="int64"), keras.layers.Embedding(ROWS, DIM),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer(), loss="mse")
    return model


def _fit(optimizer="sgd", dense=False, monkeypatch=None, **options):
    import keras

    make = {"sgd": lambda: keras.optimizers.SGD(0.1), "adam": lambda: keras.optimizers.Adam(0.01)}[optimizer]
    model = _model(make)
    if dense:
        monkeypatch.setattr(base, "table_groups", lambda model, optimizer_sums: ())
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=3, seed=4, **options)
    trainer.fit((IDS, LABELS), epochs=1, verbose=0)
    if dense:
        monkeypatch.undo()
    return model.get_weights(), trainer


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sparse_rounds_equal_dense_rounds_and_send_the_changed_rows(spark, monkeypatch, optimizer):
    dense, dense_trainer = _fit(optimizer, dense=True, monkeypatch=monkeypatch)
    sparse, trainer = _fit(optimizer)
    # Dense rounds sum n·w in float32 and divide; sparse rounds sum n·Δ in float32 and add the mean to what was sent
    # in float64: the two differ by the float32 rounding of those sums, a few ulp of the weights.
    for got, want in zip(sparse, dense):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    never = np.setdiff1d(np.arange(ROWS), IDS[:, 0])
    initial = _model(lambda: "sgd").get_weights()[0]
    np.testing.assert_array_equal(sparse[0][never], initial[never])  # rows no one touched stay bitwise as they were
    width = 1 if optimizer == "sgd" else 3  # the table, and Adam's two moments of it
    per_round = [r.sent_bytes / r.num_workers for r in trainer.stats.records]
    dense_round = [r.sent_bytes / r.num_workers for r in dense_trainer.stats.records]
    # a round touches at most 2 workers × 3 steps × 16 ids: what each worker sends is its rows and the dense head
    rows_bytes = 3 * 16 * (4 + 4 * DIM * width)
    head = 4 * (DIM + 1) * (1 if optimizer == "sgd" else 3) + 8 * 8 * 3
    if optimizer == "sgd":
        assert max(per_round) <= 1.2 * rows_bytes + head, per_round
    assert max(per_round) < 0.1 * min(dense_round), (per_round, dense_round)
    assert trainer.stats.records[-1].received_bytes == trainer.stats.records[-1].sent_bytes


def test_every_transport_gives_bitwise_the_same_sparse_fit(spark):
    reference, _ = _fit("adam", state_transport="spark")
    for options in ({"state_transport": "files"}, {"state_transport": "sql", "aggregation": "driver"},
                    {"state_transport": "sql", "aggregation": "shuffle", "aggregation_shards": 3},
                    {"update_compression": "int8", "state_transport": "sql", "aggregation": "storage",
                     "aggregation_shards": 2}, {"optimizer_state": "local", "state_transport": "spark"},
                    {"synchronization": "stale", "staleness": 1, "state_transport": "files"}):
        weights, trainer = _fit("adam", **options)
        if options.keys() & {"update_compression", "optimizer_state", "synchronization"}:  # other arithmetic: it trains
            assert np.isfinite(weights[0]).all() and trainer.history.history["loss"][-1] < 1.0
            continue
        for got, want in zip(weights, reference):
            np.testing.assert_array_equal(got, want, err_msg=str(options))
