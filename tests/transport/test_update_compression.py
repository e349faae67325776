"""``update_compression``: compressed deltas on every path, error feedback's residuals, and the option's errors.

The Spark SQL paths and a retried task run on both engines (tests/parity.py's
``CompressedUpdatesMixin``); this module adds the classic transports, the
update rules and stale synchronization, checkpoints, and the format itself.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

from conftest import assert_weights_close, shared_spark
from parity import COMPRESSED_DATA, CompressedUpdatesMixin, compressed_fit, f32_model
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer
from sparkdl_avg.driver.checkpoint import files as ckpt
from sparkdl_avg.driver.transport.feedback import ResidualLedger
from sparkdl_avg.shared.wire import compression
from sparkdl_avg.shared.wire.delta_sums import DeltaLayout, FeedbackFiles
from sparkdl_avg.shared.wire.exchange import FlatLayout


# ``local[2,3]`` (up to 3 attempts per task, for the retried tasks), shared with the other modules that ask for it.
spark = shared_spark("local[2,3]", log_level="OFF")



class TestCompressedUpdates(CompressedUpdatesMixin):
    """The Spark SQL paths and a retried task (Connect: test_connect.py)."""


# ------------------------------------------------------------------ the format


def _state(seed, sizes=(700, 3, 130), opt_sizes=(700, 130)):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=n).astype(np.float32) for n in sizes] + [np.float64(rng.normal())]
    optimizer = [np.int64(seed)] + [rng.normal(size=n).astype(np.float32) for n in opt_sizes]
    return weights, optimizer


@pytest.mark.parametrize("codec", ["int8", "bf16", "int4", "topk", "threshold"])
def test_summing_shard_by_shard_gives_the_whole_sum_bitwise(codec):
    sent_w, sent_o = _state(0)
    # optimizer variable 1 is a first moment ("m"), variable 2 another ("o")
    layout = DeltaLayout(FlatLayout.of(sent_w, sent_o), codec, feedback=(False, False, False), moments=(1,))
    assert layout.sizes == (700 + 3 + 130, 700, 130, 2)
    workers = []
    for i in range(3):
        w, o = _state(10 + i)
        workers.append(layout.pack(w, o, sent_w, sent_o, examples=5 + i, residual=None)[0])
    whole = None
    for packed in workers:
        whole = layout.add(whole, layout.shard_bytes(packed, 0, 1), 0, 1)
    for shards in (2, 3, 5):
        pieces = []
        for j in range(shards):
            acc = None
            for packed in workers:
                acc = layout.add(acc, layout.shard_bytes(packed, j, shards), j, shards)
            pieces.append(layout.parse_summed(layout.summed_bytes(acc), j, shards))
        for got, want in zip(layout.delta_sums(pieces), layout.delta_sums([whole])):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
    # The sum is Σ n · decode(delta): close to the exact example-weighted deltas.
    weight_sums, _ = layout.delta_sums([whole])
    exact = sum((5 + i) * (_state(10 + i)[0][0] - sent_w[0]) for i in range(3))
    if codec in ("topk", "threshold"):  # what it sends of each worker's delta is exactly n · its values, where it sits
        sent = np.zeros(700, np.float32)
        for i, packed in enumerate(workers):
            positions, values = compression.sparse_entries(packed.encoded[0])
            inside = positions < 700
            sent[positions[inside]] += np.float32(5 + i) * values[inside]
        np.testing.assert_array_equal(weight_sums[0], sent)
        return
    tolerance = {"int8": 0.01, "bf16": 0.005, "int4": 0.12}[codec]  # half a step: 1/254, 1/512, 1/14 of a block's max
    assert np.max(np.abs(weight_sums[0] - exact)) < tolerance * np.max(np.abs(exact))
    np.testing.assert_allclose(weight_sums[3], sum((5 + i) * (_state(10 + i)[0][3] - sent_w[3]) for i in range(3)))


def test_int8_sends_about_a_quarter_of_the_weights_bytes_int4_an_eighth_and_bf16_half():
    sent_w, _ = _state(0)
    for codec, low, high in (("int8", 0.25, 0.27), ("int4", 0.125, 0.14), ("bf16", 0.5, 0.51), ("topk", 0.0, 0.012),
                             ("threshold", 0.0, 0.012)):  # threshold: as planned, at the density band's top
        layout = DeltaLayout(FlatLayout.of(sent_w, None), codec, feedback=(False, False, False))
        assert low * layout.flat.nbytes < layout.nbytes < high * layout.flat.nbytes + 64, codec


def test_a_value_of_another_layout_is_refused():
    sent_w, sent_o = _state(0)
    layout = DeltaLayout(FlatLayout.of(sent_w, sent_o), "int8", feedback=(False, False, False))
    data = layout.shard_bytes(layout.pack(*_state(1), sent_w, sent_o, 4, None)[0], 0, 1)
    with pytest.raises(ValueError, match="does not match its layout"):
        layout.parse(data + b"\0", 0, 1)
    with pytest.raises(ValueError, match="unknown update_compression 'fp8'"):
        DeltaLayout(layout.flat, "fp8", feedback=(False, False, False))


@pytest.mark.parametrize("codec, levels", [("int8", 127), ("int4", 7)])
def test_error_feedback_through_residual_files_keeps_what_the_codec_drops(tmp_path, codec, levels):
    """Over rounds, Σ decoded ≈ Σ deltas: the residual, stored in int8 (int4's too), loses only its own rounding."""
    sent_w, _ = _state(0, sizes=(4096,))
    errors = {}
    for feedback in (True, False):
        layout = DeltaLayout(FlatLayout.of(sent_w, None), codec, feedback=(feedback,) * 3)
        rng = np.random.default_rng(3)
        total_sent, total_true, previous, step = np.zeros(4096), np.zeros(4096), None, 0.0
        for r in range(40):
            # every 7th value 10x larger: small values in a block round coarsely
            delta = (rng.normal(size=4096) * 1e-3 * (1 + 10 * (np.arange(4096) % 7 == 0))).astype(np.float32)
            files = FeedbackFiles(str(tmp_path / str(feedback)), previous, f"g{r}") if feedback else None
            residual = files.load(layout, 0) if files else None
            new = [sent_w[0] + delta, sent_w[1]]
            packed, kept = layout.pack(new, None, sent_w[:2], None, 1, residual)
            if files:
                files.save(layout, 0, kept)
            previous = f"g{r}"
            total_sent += layout.add(None, layout.shard_bytes(packed, 0, 1), 0, 1)[0]
            total_true += new[0] - sent_w[0]
            step = max(step, float(np.abs(delta).max()) / levels)
        errors[feedback] = float(np.abs(total_sent - total_true).max())
    # With feedback what is missing is one round's residual (half a step) and the residuals' own rounding.
    assert errors[True] < 0.75 * step, (errors, step)
    assert errors[False] > 3 * errors[True], errors
    with pytest.raises(FileNotFoundError, match="worker 1's error-feedback residual .* is missing"):
        FeedbackFiles(str(tmp_path / "True"), "g39", "g40").load(layout, 1)


def test_the_ledger_reads_lag_rounds_back_deletes_consumed_files_and_round_trips_a_checkpoint(tmp_path):
    directory = str(tmp_path / "feedback")
    ledger = ResidualLedger(directory, num_workers=2, lag=2, compression="int8")
    seen = []
    for rnd in range(4):
        files = ledger.for_round(0, rnd, [0, 1])
        seen.append(files.read)
        for w in (0, 1):
            os.makedirs(directory, exist_ok=True)
            with open(files.path(files.write, w), "wb") as f:
                f.write(bytes([rnd, w]))
        ledger.done(0, rnd, [0, 1])
    assert seen == [None, None, "g0", "g1"]
    assert sorted(os.listdir(directory)) == ["g2-w0.bin", "g2-w1.bin", "g3-w0.bin", "g3-w1.bin"]
    exported = ledger.export()
    assert exported == {"int8/1/0": bytes([3, 0]), "int8/1/1": bytes([3, 1]), "int8/2/0": bytes([2, 0]),
                        "int8/2/1": bytes([2, 1])}
    other = ResidualLedger(str(tmp_path / "other"), num_workers=2, lag=2, compression="bf16")
    other.restore(exported)  # another format: its chains start from zero
    assert other.for_round(5, 0, [0, 1]).read is None
    resumed = ResidualLedger(str(tmp_path / "resumed"), num_workers=2, lag=2, compression="int8")
    resumed.restore(exported)
    first, second = resumed.for_round(5, 0, [0, 1]), resumed.for_round(5, 1, [0, 1])
    assert first.read == "g0" and second.read == "g1"
    with open(first.path(first.read, 1), "rb") as f:
        assert f.read() == bytes([2, 1])  # two rounds back: round 2's, as in the uninterrupted chain
    ledger.close()
    assert not os.path.exists(directory)


def test_threshold_workers_keep_their_threshold_with_the_residual_and_start_an_epoch_from_the_mean(tmp_path):
    """Deeplearning4j's adaptive threshold per worker, through the residual files and the ledger's epoch starts."""
    directory = str(tmp_path / "feedback")
    sent_w, _ = _state(0, sizes=(9000,))
    layout = DeltaLayout(FlatLayout.of(sent_w, None), "threshold", feedback=(True, False, False))
    assert layout.adaptive == (0,)
    ledger = ResidualLedger(directory, num_workers=3, lag=1, compression="threshold")
    rng = np.random.default_rng(1)
    taus, started = {}, {}
    for epoch, rnd in ((0, 0), (0, 1), (1, 0)):
        files = ledger.for_round(epoch, rnd, [0, 1, 2])
        assert files.peers == ((0, 1, 2) if (epoch, rnd) == (1, 0) else ())  # an epoch's first round, files to read
        means = started[(epoch, rnd)] = files.mean_thresholds(layout)
        for w in range(3):
            # workers whose deltas differ in scale adapt different thresholds
            delta = (rng.normal(size=9000) * 1e-3 * (1 + w)).astype(np.float32)
            kept = files.load(layout, w)
            assert (kept is None) == (files.read is None)
            packed, new = layout.pack([sent_w[0] + delta, sent_w[1]], None, sent_w[:2], None, 1, kept,
                                      thresholds=means)
            files.save(layout, w, new)
            assert packed.encoded[0].scales[0] == np.float32(new[0].threshold)
            assert layout.read_residual(layout.residual_bytes(new))[0].threshold == np.float32(new[0].threshold)
            taus[(epoch, rnd, w)] = new[0].threshold
        ledger.done(epoch, rnd, [0, 1, 2])
    assert len({taus[(0, 1, w)] for w in range(3)}) == 3
    # the mean of the three, summed in float64 in worker order, is where every worker of epoch 1 started
    mean = float(np.float32(sum(np.float64(np.float32(taus[(0, 1, w)])) for w in range(3)) / 3))
    assert started == {(0, 0): None, (0, 1): None, (1, 0): [mean, None, None]}
    for w in range(3):  # each moved from the mean by whole steps of 0.966, or not at all
        m = np.log(taus[(1, 0, w)] / mean) / np.log(compression.THRESHOLD_STEP)
        assert abs(m - round(m)) < 1e-3, (w, m)
    # without peers (not an epoch's start) or without an adaptive codec: no mean
    later = ledger.for_round(1, 1, [0, 1, 2])
    assert later.read == "g2" and later.peers == () and later.mean_thresholds(layout) is None
    int8 = DeltaLayout(FlatLayout.of(sent_w, None), "int8", feedback=(True, False, False))
    assert int8.adaptive == () and replace(later, peers=(0, 1, 2)).mean_thresholds(int8) is None
    ledger.close()


# ---------------------------------------------------------- trainer options


def test_the_options_refuse_what_does_not_fit_naming_it():
    model = f32_model()
    with pytest.raises(ConfigurationError, match=r"'update_compression' parameter must be one of None, 'bf16', "
                                                 r"'int8', 'int4', 'topk', 'threshold'. Got 'fp8' instead"):
        ParameterAveragingTrainer(model, update_compression="fp8")
    with pytest.raises(ConfigurationError, match=r"'error_feedback' parameter applies only with 'update_compression'"):
        ParameterAveragingTrainer(model, error_feedback=True)
    with pytest.raises(ConfigurationError, match=r"Error feedback needs synchronization='sync' or 'stale'.*"
                                                 r"update_compression='int8' with synchronization='async'"):
        ParameterAveragingTrainer(model, update_compression="int8", synchronization="async")
    ParameterAveragingTrainer(model, update_compression="bf16", synchronization="async")  # no residuals: fine
    with pytest.raises(ConfigurationError, match=r"'error_feedback' parameter must be a bool or None. Got 1"):
        ParameterAveragingTrainer(model, update_compression="int8", error_feedback=1)


# ------------------------------------------------------------------ training


def test_classic_transports_sum_compressed_deltas_bitwise_like_the_sql_round(spark, tmp_path):
    # int4 differs from int8 only in its codec: one classic path (Spark's tree) against the SQL round
    int8_paths = ({"state_transport": "spark"}, {"state_transport": "spark", "aggregation_depth": 2},
                  {"state_transport": "files"})
    for compression, paths in (("int4", ({"state_transport": "spark", "aggregation_depth": 2},)), ("int8", int8_paths)):
        reference = compressed_fit(compression, state_transport="sql", aggregation="driver")[0].get_weights()
        for options in paths:
            model, trainer = compressed_fit(compression, **options)
            for got, want in zip(model.get_weights(), reference):
                np.testing.assert_array_equal(got, want, err_msg=f"{compression} {options}")
            assert trainer.stats.records[-1].received_bytes == trainer.stats.records[-1].sent_bytes
    # The report's title says what each worker sent and what encoding it cost.
    summary = trainer.stats.summary()
    assert summary["sent_bytes_per_worker_median"] == trainer.stats.records[-1].sent_bytes / 2
    html = open(trainer.write_report(str(tmp_path / "report.html")), encoding="utf-8").read()
    sent = f"each worker sent {summary['sent_bytes_per_worker_median'] / 1e6:.3g} MB per round (int8 deltas, median)"
    assert sent in html


def test_compressed_training_follows_float32_training_with_every_rule(in_process_engine):
    import keras

    for rule in ("average", "bmuf", "slowmo"):
        losses = {}
        arms = ((None, None), ("bf16", None), ("bf16", True), ("int8", None), ("int4", None)) if rule == "average" \
            else ((None, None), ("int8", None))
        for codec, feedback in arms:
            # block momentum on top of Adam overshoots on this small problem; with SGD (momentum) it trains
            model = f32_model(optimizer=None if rule == "average" else keras.optimizers.SGD(0.05, momentum=0.5))
            model, trainer = compressed_fit(codec, epochs=3, model=model, update_rule=rule, error_feedback=feedback)
            losses[(codec, feedback)] = trainer.history.history["loss"]
            assert np.isfinite(model.get_weights()[0]).all()
        plain = losses[(None, None)]
        assert plain[-1] < 0.8 * plain[0], (rule, plain)  # it trains
        for key, got in losses.items():
            assert abs(got[-1] - plain[-1]) < 0.05 * plain[-1], (rule, key, got, plain)


def test_stale_reproducible_int8_repeats_bitwise_and_follows_float32(spark):
    stale = dict(synchronization="stale", staleness=1, reproducible=True)
    first, trainer = compressed_fit("int8", epochs=2, **stale)
    second, _ = compressed_fit("int8", epochs=2, **stale)
    assert_weights_close(second.get_weights(), first.get_weights(), atol=0)
    assert all(r.feedback_max_s > 0 and r.compression == "int8" for r in trainer.stats.records)
    plain = compressed_fit(None, epochs=2, **stale)[1].history.history["loss"]
    assert abs(trainer.history.history["loss"][-1] - plain[-1]) < 0.05 * plain[-1]


class _StopAfterRounds:
    def __new__(cls, rounds):
        import keras

        class Stop(keras.callbacks.Callback):
            seen = 0

            def on_train_batch_end(self, batch, logs=None):
                Stop.seen += 1
                if Stop.seen == rounds:
                    raise KeyboardInterrupt("simulated crash")

        return Stop()


def test_a_resumed_int8_fit_continues_its_residuals_to_the_uninterrupted_weights(in_process_engine, tmp_path, caplog):
    reference, _ = compressed_fit("int8", epochs=3)
    directory = str(tmp_path / "ckpt")
    model = f32_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                        update_compression="int8")
    with pytest.raises(KeyboardInterrupt):  # 4 rounds an epoch: the last checkpoint is after round 6
        trainer.fit(COMPRESSED_DATA, epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every=3,
                    callbacks=[_StopAfterRounds(7)])
    saved = ckpt.load(ckpt.latest(directory))
    assert (saved.epoch, saved.rounds_done) == (1, 2)
    assert sorted(saved.feedback) == ["int8/1/0", "int8/1/1"]  # each worker's residual of the round before
    # issue 38: resumed with another compression, the residuals were dropped without a word
    other = str(tmp_path / "copy")
    shutil.copytree(directory, other)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        compressed_fit(None, epochs=2, fit=dict(checkpoint_dir=other, resume=True))
    dropped = [r.getMessage() for r in caplog.records if "error-feedback residuals" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].startswith(f"Resuming from {ckpt.latest(directory).replace(directory, other)} "
                                                       "without its error-feedback residuals"), dropped
    assert ("update_compression='int8' and this fit uses update_compression=None without error feedback, so the 2 "
            "residual(s)") in dropped[0]
    assert dropped[0].endswith("Resume with update_compression='int8' to keep them.")
    resumed, _ = compressed_fit("int8", epochs=3, model=f32_model(seed=9),
                                fit=dict(checkpoint_dir=directory, checkpoint_every=3, resume=True))
    assert_weights_close(resumed.get_weights(), reference.get_weights(), atol=0)


def test_a_threshold_fit_resumed_at_an_epochs_end_starts_from_the_workers_mean_threshold_bitwise(in_process_engine, tmp_path):
    """Issue 58: the residuals and each worker's threshold survive a checkpoint; the resumed epoch's first round
    averages the thresholds from the restored files, as the uninterrupted fit did from its own."""
    reference, trainer = compressed_fit("threshold", epochs=3)
    records = trainer.stats.records
    assert [r.compression for r in records] == ["threshold"] * 12 and all(r.feedback_max_s > 0 for r in records)
    directory = str(tmp_path / "ckpt")
    model = f32_model()
    interrupted = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                            update_compression="threshold")
    with pytest.raises(KeyboardInterrupt):  # 4 rounds an epoch: the last checkpoint is epoch 1's end
        interrupted.fit(COMPRESSED_DATA, epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every=4,
                        callbacks=[_StopAfterRounds(10)])
    saved = ckpt.load(ckpt.latest(directory))
    assert (saved.epoch, saved.rounds_done) == (1, 4)  # epoch 1 done: the resumed fit starts epoch 2
    assert sorted(saved.feedback) == ["threshold/1/0", "threshold/1/1"]
    resumed, _ = compressed_fit("threshold", epochs=3, model=f32_model(seed=9),
                                fit=dict(checkpoint_dir=directory, checkpoint_every=4, resume=True))
    assert_weights_close(resumed.get_weights(), reference.get_weights(), atol=0)


def test_a_topk_diloco_fit_resumed_mid_epoch_continues_its_residuals_and_momentum_bitwise(in_process_engine, tmp_path):
    """Issue 58: a sparse codec under DiLoCo with local optimizer state, interrupted mid-epoch, resumes to the
    uninterrupted run's weights: each worker's residual, its Adam state and the outer momentum come back from the
    checkpoint."""
    options = dict(update_rule="diloco", optimizer_state="local")
    reference, trainer = compressed_fit("topk", epochs=3, **options)
    assert [r.compression for r in trainer.stats.records] == ["topk"] * 12
    directory = str(tmp_path / "ckpt")
    interrupted = ParameterAveragingTrainer(f32_model(), num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                            update_compression="topk", **options)
    with pytest.raises(KeyboardInterrupt):  # 4 rounds an epoch: the last checkpoint is after round 6, mid-epoch 2
        interrupted.fit(COMPRESSED_DATA, epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every=3,
                        callbacks=[_StopAfterRounds(7)])
    saved = ckpt.load(ckpt.latest(directory))
    assert (saved.epoch, saved.rounds_done) == (1, 2)
    assert sorted(saved.feedback) == ["local-optimizer/1/0", "local-optimizer/1/1", "topk/1/0", "topk/1/1"]
    resumed, _ = compressed_fit("topk", epochs=3, model=f32_model(seed=9),
                                fit=dict(checkpoint_dir=directory, checkpoint_every=3, resume=True), **options)
    assert_weights_close(resumed.get_weights(), reference.get_weights(), atol=0)
    assert not np.allclose(reference.get_weights()[0], f32_model().get_weights()[0])  # it trained
