"""The update codecs (sparkdl_avg.shared.compression): bf16 rounding, int8 blocks, error feedback; no Spark."""

import ml_dtypes
import numpy as np
import pytest

from sparkdl_avg.shared import compression as c


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


@pytest.mark.parametrize("codec", c.CODECS)
def test_error_feedback_loses_nothing_over_rounds(codec):
    # Σ decoded = Σ deltas − the last residual: what is dropped in one round is sent in a later one.
    rounds = [_vector(4096, seed=s) for s in range(20)]
    residual, sent = None, np.zeros(4096, dtype=np.float64)
    for delta in rounds:
        e, residual = c.with_feedback(delta, residual, codec)
        sent += c.decode(e)
    total = np.sum(rounds, axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + residual, total, rtol=0, atol=1e-6)
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
    with pytest.raises(ValueError, match="unknown codec 'fp4'; expected one of 'bf16', 'int8'"):
        c.encode(_vector(), "fp4")
    with pytest.raises(ValueError, match=r"flat float32 vector; got shape \(2, 3\)"):
        c.encode(np.zeros((2, 3)), "bf16")
