"""The update codecs (sparkdl_avg.shared.wire.compression): bf16 rounding, int8 blocks, int4 nibbles, topk's and
threshold's sparse deltas, error feedback."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from sparkdl_avg.shared.wire import compression as c


def _vector(n=10_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    x[::97] *= 50  # a few large values, as in real deltas
    return x


def test_bf16_rounds_to_nearest_even_like_ml_dtypes():
    x = np.concatenate([_vector(), np.array([0.0, -0.0, 1.0, -1.5, 3.4e38, -3.4e38, 1e-40, np.inf, -np.inf],
                                            dtype=np.float32)])
    # ties: 1 + 2**-8 lies halfway between two bf16 values (1 and 1 + 2**-7): even is 1
    x = np.append(x, np.float32(1 + 2**-8)).astype(np.float32)
    e = c.encode(x, "bf16")
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(c.decode(e), expected)
    assert c.decode(e)[-1] == 1.0
    assert e.nbytes == 2 * x.size
    nan = c.decode(c.encode(np.array([np.nan, -np.nan], dtype=np.float32), "bf16"))
    assert np.isnan(nan).all()


def test_int8_error_is_within_half_a_step_of_each_block():
    x = _vector(1000)
    e = c.encode(x, "int8", block=64)
    assert e.payload.dtype == np.int8 and e.scales.dtype == np.float32 and e.scales.size == 16  # 1000/64 → 16 blocks
    assert e.nbytes == 1000 + 16 * 4
    back = c.decode(e)
    steps = np.repeat(e.scales, 64)[:1000]
    assert np.all(np.abs(back - x) <= steps / 2 * (1 + 1e-6))
    for b in range(16):  # each block's largest value is exact in magnitude (q = ±127)
        block = x[b * 64:(b + 1) * 64]
        assert np.abs(e.payload[b * 64:(b + 1) * 64]).max() == 127
        np.testing.assert_allclose(np.abs(back[b * 64:(b + 1) * 64]).max(), np.abs(block).max(), rtol=1e-6)


def test_int8_zero_blocks_and_signs():
    x = np.zeros(300, dtype=np.float32)
    x[260:] = np.linspace(-1, 1, 40, dtype=np.float32)
    e = c.encode(x, "int8", block=256)
    np.testing.assert_array_equal(c.decode(e)[:256], 0.0)
    np.testing.assert_array_equal(c.decode(c.encode(-x, "int8", block=256)), -c.decode(e))


def test_slices_at_block_boundaries_decode_alone():
    x = _vector(5000)
    for codec in c.CODECS:
        e = c.encode(x, codec, block=128)
        whole = c.decode(e)
        cuts = [0, 1280, 2560, 5000]
        parts = [c.decode(e.slice(a, b)) for a, b in zip(cuts, cuts[1:])]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="multiple of its block"):
        c.encode(x, "int8", block=128).slice(100, 200)


def test_encoding_is_deterministic():
    x = _vector()
    for codec in c.CODECS:
        a, b = c.encode(x, codec), c.encode(x.copy(), codec)
        assert a.payload.tobytes() == b.payload.tobytes()
        assert (a.scales is None and b.scales is None) or a.scales.tobytes() == b.scales.tobytes()


@pytest.mark.parametrize("codec", [k for k in c.CODECS if k != "threshold"])  # threshold clips: its own test
def test_error_feedback_loses_nothing_over_rounds(codec):
    # Σ decoded = Σ deltas − the last residual: what is dropped in one round is sent in a later one.
    rounds = [_vector(4096, seed=s) for s in range(20)]
    kept, sent = None, np.zeros(4096, dtype=np.float64)
    for delta in rounds:
        e, kept = c.with_feedback(delta, kept, codec)
        assert kept.threshold is None
        sent += c.decode(e)
    total = np.sum(rounds, axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + kept.residual, total, rtol=0, atol=1e-6)
    # without feedback the error grows with the rounds; with it, it stays one round's
    plain = np.sum([c.decode(c.encode(d, codec)) for d in rounds], axis=0, dtype=np.float64)
    assert np.abs(sent - total).max() < np.abs(plain - total).max()


def test_add_decoded_sums_weighted_values_in_float32():
    x = _vector(1000)
    acc = np.ones(1000, dtype=np.float32)
    e = c.encode(x, "int8")
    c.add_decoded(acc, e, weight=3)
    np.testing.assert_array_equal(acc, np.float32(1) + c.decode(e) * np.float32(3))
    assert acc.dtype == np.float32


def test_bad_input_is_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="unknown codec 'fp4'; expected one of 'bf16', 'int8', 'int4', 'topk', 'threshold'"):
        c.encode(_vector(), "fp4")
    with pytest.raises(ValueError, match=r"flat float32 vector; got shape \(2, 3\)"):
        c.encode(np.zeros((2, 3)), "bf16")


# ------------------------------------------------------------------ int4 (issue 40)


def _int4_values(e):
    """The signed 4-bit values of an int4 payload: byte i holds value 2i in its low nibble, 2i + 1 in its high."""
    low, high = (e.payload & 15).astype(np.int8), (e.payload >> 4).astype(np.int8)
    q = np.stack([low, high], axis=1).reshape(-1)
    return np.where(q > 7, q - 16, q)[: e.size]


def test_int4_packs_two_values_a_byte_low_nibble_first():
    e = c.encode(np.array([7, -1, 3], dtype=np.float32), "int4")  # one block: scale 7 / 7 = 1
    assert e.payload.dtype == np.uint8 and e.payload.tolist() == [0xF7, 0x03]  # -1 = 0xF; an odd tail's high nibble 0
    assert e.scales.tolist() == [1.0] and e.block == c.BLOCKS["int4"]
    np.testing.assert_array_equal(c.decode(e), [7, -1, 3])
    for size in (1, 3, 127, 129, 1001):  # odd sizes, and blocks of 64 with a short last one
        x = _vector(size, seed=size)
        e = c.encode(x, "int4", block=64)
        blocks = -(-size // 64)
        assert e.payload.size == (size + 1) // 2 and e.scales.size == blocks
        assert e.nbytes == (size + 1) // 2 + 4 * blocks
        q = _int4_values(e)
        assert q.min() >= -7 and q.max() <= 7
        back = c.decode(e)
        assert back.dtype == np.float32 and back.size == size
        np.testing.assert_array_equal(back, q.astype(np.float32) * np.repeat(e.scales, 64)[:size])
        steps = np.repeat(e.scales, 64)[:size]
        assert np.all(np.abs(back - x) <= steps / 2 * (1 + 1e-6))  # within half a step of its block's scale
        for b in range(blocks):  # each block's largest value is ±7 steps: exact in magnitude
            assert np.abs(q[b * 64:(b + 1) * 64]).max() == 7


def test_int4_encodes_minus_x_as_minus_q_and_zero_blocks_as_zero():
    x = _vector(1001)
    x[:128] = 0
    e, neg = c.encode(x, "int4"), c.encode(-x, "int4")
    np.testing.assert_array_equal(_int4_values(neg), -_int4_values(e))
    np.testing.assert_array_equal(c.decode(neg), -c.decode(e))
    np.testing.assert_array_equal(c.decode(e)[:128], 0.0)
    assert e.scales[0] == 0


def test_int4_slices_cut_whole_blocks_and_bytes_and_decode_alone():
    x = _vector(1001)  # odd: the last slice ends in half a byte
    e = c.encode(x, "int4", block=64)
    cuts = [0, 128, 640, 1001]
    parts = [e.slice(a, b) for a, b in zip(cuts, cuts[1:])]
    assert b"".join(p.payload.tobytes() for p in parts) == e.payload.tobytes()  # the bytes cut, none shared
    np.testing.assert_array_equal(np.concatenate([c.decode(p) for p in parts]), c.decode(e))
    with pytest.raises(ValueError, match="int4 slice must start at a multiple of its block"):
        e.slice(32, 128)
    with pytest.raises(ValueError, match="int4 slice must stop at a whole byte"):
        e.slice(0, 129)
    with pytest.raises(ValueError, match="int4 block must hold an even number of values"):
        c.encode(x, "int4", block=63)


def test_int4_with_feedback_sends_over_rounds_what_one_round_drops():
    # one round drops up to half a step (a fourteenth of each block's largest value); feedback sends it later
    rounds = [_vector(4096, seed=s) for s in range(20)]
    kept, sent = None, np.zeros(4096, dtype=np.float64)
    for delta in rounds:
        e, kept = c.with_feedback(delta, kept, "int4")
        sent += c.decode(e)
        assert np.all(np.abs(kept.residual) <= np.repeat(e.scales, c.BLOCKS["int4"]) / 2 * (1 + 1e-6))
    total = np.sum(rounds, axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + kept.residual, total, rtol=0, atol=1e-6)
    plain = np.sum([c.decode(c.encode(d, "int4")) for d in rounds], axis=0, dtype=np.float64)
    assert np.abs(sent - total).max() < 0.5 * np.abs(plain - total).max()


# ------------------------------------------------------------------ topk (SparseLoCo's sparse deltas)


def test_topk_keeps_each_chunks_largest_magnitudes_with_their_signs_in_two_bits():
    x = _vector(10_000, seed=3)  # two whole chunks of 4,096 and one of 1,808
    e = c.encode(x, "topk")
    positions, values = c.topk_entries(e)
    want = []
    for start in range(0, x.size, 4096):
        chunk = x[start:start + 4096]
        k = c.topk_kept(chunk.size)
        assert k == int(np.ceil(c.TOPK_DENSITY * chunk.size))
        want += sorted(start + np.argsort(-np.abs(chunk), kind="stable")[:k])
    assert positions.tolist() == want
    np.testing.assert_array_equal(np.sign(values), np.sign(x[positions]))
    scales = np.repeat(e.scales, [c.topk_kept(n) for n in (4096, 4096, 1808)])
    # two magnitudes a chunk: its largest kept one (the scale), or half of it, whichever is nearer
    np.testing.assert_array_equal(np.abs(values), np.where(np.abs(x[positions]) >= 0.75 * scales, scales, scales / 2))
    decoded = c.decode(e)
    assert np.count_nonzero(decoded) == positions.size and decoded[positions].tolist() == values.tolist()
    # 82 + 82 + 37 positions of 12 bits and values of 2 bits, three scales
    assert e.nbytes == 2 * (3 * 41 + 21) + (3 * 19 + 10) + 3 * 4 == c.payload_count("topk", 10_000) + 12
    assert e.nbytes / (4 * x.size) < 0.01


def _sparse_sums_equal_dense_sums(codec):
    x = _vector(9000, seed=4)
    e = c.encode(x, codec)
    acc, dense = np.full(9000, 0.25, np.float32), np.full(9000, 0.25, np.float32)
    c.add_decoded(acc, e, weight=7)
    np.add(dense, c.decode(e) * np.float32(7), out=dense)
    assert acc.tobytes() == dense.tobytes()


def test_topk_sums_at_the_positions_equal_the_dense_sums_bitwise():
    _sparse_sums_equal_dense_sums("topk")


def test_threshold_sums_at_the_positions_equal_the_dense_sums_bitwise():
    _sparse_sums_equal_dense_sums("threshold")


@pytest.mark.parametrize("codec", ["topk", "threshold"])
def test_sparse_entries_decode_alike_from_a_read_only_payload_at_an_odd_address(codec):
    # as a worker's shard arrives (np.frombuffer of the bytes, at any offset): positions are read as unaligned
    # 16-bit words, which must not depend on where the payload lies
    e = c.encode(_vector(10_000, seed=8), codec, **({"threshold": np.float32(2e-3)} if codec == "threshold" else {}))
    data = b"\x00" + e.payload.tobytes()
    moved = dataclasses.replace(e, payload=np.frombuffer(data, np.uint8, offset=1))
    assert not moved.payload.flags.writeable and moved.payload.ctypes.data % 2 == 1
    (p1, v1), (p2, v2) = c.sparse_entries(e), c.sparse_entries(moved)
    assert p1.tolist() == p2.tolist() and v1.tobytes() == v2.tobytes() and p1.size > 100


def test_topk_slices_are_whole_chunks():
    e = c.encode(_vector(9000), "topk")
    with pytest.raises(ValueError, match=r"a topk slice must stop at a multiple of its chunk \(4096\) or the end; "
                                         r"got 5000"):
        e.slice(4096, 5000)
    with pytest.raises(ValueError, match=r"a topk chunk must hold 1 to 4096 values \(12-bit positions\); got 8192"):
        c.encode(_vector(), "topk", block=8192)


# ------------------------------------------------------------------ threshold (Deeplearning4j's threshold encoding)


def test_threshold_sends_the_values_past_tau_as_plus_or_minus_tau_in_thirteen_bits():
    x = _vector(10_000, seed=5)  # chunks of 4,096, 4,096 and 1,808
    tau = np.float32(2.5e-3)
    e = c.encode(x, "threshold", threshold=tau)
    positions, values = c.threshold_entries(e)
    want = np.flatnonzero(np.abs(x) >= tau)
    assert positions.tolist() == want.tolist() and 50 < want.size < 500
    np.testing.assert_array_equal(values, np.where(x[want] < 0, -tau, tau).astype(np.float32))
    counts = [int(np.count_nonzero(np.abs(x[a:a + 4096]) >= tau)) for a in (0, 4096, 8192)]
    assert e.counts.tolist() == counts and e.scales.tolist() == [tau] * 3
    # every chunk's 12-bit positions in its chunk, three bytes a pair (the first in the low 12 bits), then a sign bit
    # each, eight a byte, the first lowest: no padding between chunks; per chunk a float32 threshold and a uint16 count
    local, negative = [int(p) % 4096 for p in want], [int(x[p] < 0) for p in want]
    pairs = [local[i] | ((local[i + 1] if i + 1 < len(local) else 0) << 12) for i in range(0, len(local), 2)]
    signs = [sum(b << j for j, b in enumerate(negative[i:i + 8])) for i in range(0, len(negative), 8)]
    assert e.payload.tolist() == [w >> s & 255 for w in pairs for s in (0, 8, 16)] + signs
    assert e.nbytes == 3 * -(-want.size // 2) + -(-want.size // 8) + 3 * (4 + 2)
    np.testing.assert_array_equal(c.decode(e)[want], values)
    assert np.count_nonzero(c.decode(e)) == want.size


def test_a_chunk_past_the_sparse_forms_bytes_travels_as_a_two_bit_map():
    x = _vector(5000, seed=6)
    tau = np.float32(5e-4)  # about 60% of each chunk: sparse would take ~1 byte and 5 bits a value, the map 2 bits
    e = c.encode(x, "threshold", threshold=tau)
    assert e.counts[0] > 2000
    assert e.payload.size == 4096 // 4 + -(-904 // 4)  # both chunks as maps
    positions, values = c.threshold_entries(e)
    want = np.flatnonzero(np.abs(x) >= tau)
    assert positions.tolist() == want.tolist()
    np.testing.assert_array_equal(values, np.where(x[want] < 0, -tau, tau).astype(np.float32))
    # a slice keeps whole chunks and finds the second one's map after the first's
    second = c.threshold_entries(e.slice(4096, 5000))[0]
    assert (second + 4096).tolist() == want[want >= 4096].tolist()


def test_the_threshold_moves_by_the_fewest_steps_of_0966_into_the_density_band():
    x = _vector(100_000, seed=7)
    low, high = c.THRESHOLD_DENSITY
    mags = np.abs(x)

    def density(t):
        return np.count_nonzero(mags >= t) / x.size

    def steps(t, start):
        m = np.log(float(t) / start) / np.log(c.THRESHOLD_STEP)
        assert abs(m - round(m)) < 1e-3, m  # a whole number of Deeplearning4j's steps from where it started
        return round(m)

    up = c.adapt_threshold(x, c.THRESHOLD_START)  # from Deeplearning4j's 1e-4: almost everything passes; raise it
    assert density(up) <= high < density(np.float32(up * c.THRESHOLD_STEP)), (up, density(up))
    assert steps(up, c.THRESHOLD_START) < 0
    down = c.adapt_threshold(x, 10.0)  # nothing passes: lower it
    assert density(np.float32(down / c.THRESHOLD_STEP)) < low <= density(down)
    assert steps(down, 10.0) > 0
    inside = np.float32(np.quantile(mags, 1 - 0.001))
    assert c.adapt_threshold(x, inside) == inside  # within the band it stays
    assert c.adapt_threshold(np.zeros(10, np.float32), 0.5) == np.float32(0.5)  # nothing to send: it stays


def test_threshold_feedback_clips_the_residual_at_five_thresholds_and_otherwise_loses_nothing():
    rounds = [_vector(8192, seed=s) * np.float32(1 + s % 3) for s in range(30)]
    kept, sent, clipped = None, np.zeros(8192), np.zeros(8192)
    taus = []
    for delta in rounds:
        before = delta.astype(np.float64) + (kept.residual if kept is not None else 0)
        e, kept = c.with_feedback(delta, kept, "threshold")
        tau = kept.threshold
        taus.append(tau)
        assert e.scales.tolist() == [np.float32(tau)] * 2
        decoded = c.decode(e)
        sent += decoded
        unclipped = before - decoded
        assert np.all(np.abs(kept.residual) <= c.THRESHOLD_CLIP * np.float32(tau) * (1 + 1e-6))
        clipped += unclipped - kept.residual
        assert c.THRESHOLD_DENSITY[0] <= np.count_nonzero(decoded) / 8192 <= c.THRESHOLD_DENSITY[1]
    total = np.sum(rounds, axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + kept.residual + clipped, total, rtol=0, atol=1e-5)
    assert np.abs(clipped).max() > 0  # the large values (x50) pass 5 thresholds: what Deeplearning4j drops too
    assert len(set(taus)) > 1  # it adapted
    # the next round starts from the kept threshold, or from a given one (the workers' mean at an epoch's start)
    e, _ = c.with_feedback(np.zeros(8192, np.float32), kept, "threshold")
    e2, after = c.with_feedback(np.zeros(8192, np.float32), kept, "threshold", threshold=kept.threshold * 2)
    assert e2.scales[0] != e.scales[0] and after.threshold != kept.threshold


def test_threshold_slices_of_sparse_and_map_chunks_decode_to_the_whole_ones_entries():
    # chunk 1 past the sparse form's bytes (a map), chunks 0 and 2 sparse with odd counts: a slice packs its
    # chunks' entries and maps again as a payload of its own
    x = _vector(10_000, seed=9)
    x[4096:8192] = np.where(np.arange(4096) % 2, 1.0, -1.0).astype(np.float32) * np.float32(5e-3)
    e = c.encode(x, "threshold", threshold=np.float32(2.5e-3))
    assert e.counts.tolist()[1] == 4096 and e.counts[0] % 2 == 1 and e.counts[2] % 2 == 1
    whole_positions, whole_values = c.threshold_entries(e)
    for cuts in ([0, 4096, 8192, 10_000], [0, 8192, 10_000], [0, 4096, 10_000]):
        parts = [e.slice(a, b) for a, b in zip(cuts, cuts[1:])]
        assert [p.payload.size for p in parts] == [c.payload_count("threshold", p.size, counts=p.counts) for p in parts]
        got = [c.threshold_entries(p) for p in parts]
        assert np.concatenate([pos + a for (pos, _), a in zip(got, cuts)]).tolist() == whole_positions.tolist()
        assert np.concatenate([v for _, v in got]).tobytes() == whole_values.tobytes()


def test_threshold_slices_are_whole_chunks_and_bad_thresholds_are_refused():
    x = _vector(9000, seed=8)
    e = c.encode(x, "threshold")
    with pytest.raises(ValueError, match=r"a threshold slice must stop at a multiple of its chunk \(4096\) or the "
                                         r"end; got 5000"):
        e.slice(4096, 5000)
    with pytest.raises(ValueError, match=r"a threshold chunk must hold 1 to 4096 values \(12-bit positions\); "
                                         r"got 8192"):
        c.encode(x, "threshold", block=8192)
    with pytest.raises(ValueError, match="a threshold must be a positive finite number; got -1"):
        c.encode(x, "threshold", threshold=-1)
