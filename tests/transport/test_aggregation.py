"""Example-weighted sums and averages (sparkdl_avg.shared.wire.aggregation); no Spark, no Keras."""

import functools

import numpy as np
import pytest

from sparkdl_avg.shared.wire.aggregation import PartialResult, merge, weighted


def worker_result(n, weights, opt=None, metrics=None, worker=0):
    """What one worker returns: its arrays multiplied by its example count."""
    return PartialResult(
        examples=n,
        weight_sums=weighted(weights, n),
        optimizer_sums=weighted(opt, n) if opt is not None else None,
        metric_sums={k: v * n for k, v in (metrics or {}).items()},
        workers=[{"worker": worker, "examples": n}],
    )


def test_weighted_keeps_zero_d_arrays_as_arrays_float32_as_float32():
    out = weighted([np.float32(2.5), np.array(3, dtype=np.int64), np.ones((2, 2), np.float32), np.ones(2)], 4)
    assert all(isinstance(a, np.ndarray) for a in out)
    assert [a.dtype for a in out] == [np.float32, np.float64, np.float32, np.float64]
    assert out[0].shape == () and float(out[0]) == 10.0
    assert out[1].shape == () and float(out[1]) == 12.0
    np.testing.assert_array_equal(out[2], np.full((2, 2), 4.0))


def test_weighted_does_not_modify_its_input():
    a = np.array([1.0, 2.0])
    weighted([a], 3)
    np.testing.assert_array_equal(a, [1.0, 2.0])


def test_unequal_example_counts_weight_the_average():
    rng = np.random.default_rng(0)
    w1 = [rng.normal(size=(3, 2)), rng.normal(size=(2,)), np.array(rng.normal())]
    w2 = [rng.normal(size=(3, 2)), rng.normal(size=(2,)), np.array(rng.normal())]
    expected = [(3 * a + 1 * b) / 4 for a, b in zip(w1, w2)]

    total = merge(worker_result(3, w1, worker=0), worker_result(1, w2, worker=1))
    assert total.examples == 4
    avg = total.average(total.weight_sums, w1)
    for a, e in zip(avg, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-15, atol=1e-15)
    # the 0-d weight stays 0-d
    assert avg[2].shape == ()
    # ... and the plain (unweighted) mean would be noticeably different
    assert not np.allclose(avg[0], (w1[0] + w2[0]) / 2)


def test_unequal_counts_weight_optimizer_state_and_metrics():
    w1, w2 = [np.array([1.0, 2.0])], [np.array([5.0, 10.0])]
    o1, o2 = [np.array(4.0), np.array([0.0, 1.0])], [np.array(8.0), np.array([4.0, 5.0])]
    a = worker_result(3, w1, o1, {"loss": 1.0, "mae": 0.5})
    b = worker_result(1, w2, o2, {"loss": 5.0, "mae": 0.1})
    total = merge(a, b)
    np.testing.assert_allclose(total.average(total.weight_sums, w1)[0], [2.0, 4.0])
    opt = total.average(total.optimizer_sums, o1)
    np.testing.assert_allclose(opt[0], 5.0)
    assert opt[0].shape == ()
    np.testing.assert_allclose(opt[1], [1.0, 2.0])
    means = total.metric_means()
    assert means == pytest.approx({"loss": (3 * 1.0 + 5.0) / 4, "mae": (3 * 0.5 + 0.1) / 4}, rel=1e-15)


def test_average_casts_to_the_dtypes_of_like():
    total = merge(worker_result(2, [np.array([1.0, 2.0], np.float32)]), worker_result(2, [np.array([3.0, 4.0], np.float32)]))
    like = [np.zeros(2, np.float32)]
    avg = total.average(total.weight_sums, like)
    assert avg[0].dtype == np.float32
    np.testing.assert_array_equal(avg[0], np.array([2.0, 3.0], np.float32))


def test_merge_with_none_is_the_identity():
    a = worker_result(2, [np.array([1.0])], metrics={"loss": 1.0})
    assert merge(None, a) is a
    assert merge(a, None) is a
    assert merge(None, None) is None


def test_merge_tree_of_many_workers_equals_the_weighted_mean():
    rng = np.random.default_rng(1)
    counts = [5, 1, 7, 2, 3]
    weights = [[rng.normal(size=(4,)), np.array(rng.normal())] for _ in counts]
    losses = rng.uniform(size=len(counts))
    parts = [worker_result(n, w, metrics={"loss": float(l)}, worker=i) for i, (n, w, l) in enumerate(zip(counts, weights, losses))]
    # a tree: ((0, 1), (2, (3, 4))), like treeAggregate may combine them
    total = merge(merge(parts[0], parts[1]), merge(parts[2], merge(parts[3], parts[4])))
    assert total.examples == sum(counts)
    assert sorted(w["worker"] for w in total.workers) == list(range(len(counts)))
    n = np.array(counts, dtype=np.float64)
    expected0 = sum(c * w[0] for c, w in zip(counts, weights)) / n.sum()
    expected1 = sum(c * w[1] for c, w in zip(counts, weights)) / n.sum()
    avg = total.average(total.weight_sums, weights[0])
    np.testing.assert_allclose(avg[0], expected0, rtol=1e-14)
    np.testing.assert_allclose(avg[1], expected1, rtol=1e-14)
    assert total.metric_means()["loss"] == pytest.approx(float(np.dot(n, losses) / n.sum()), rel=1e-14)


def test_merge_order_does_not_change_the_result():
    rng = np.random.default_rng(2)
    data = [(n, [rng.normal(size=(3,))]) for n in (1, 2, 3, 4)]
    make = lambda: [worker_result(n, w) for n, w in data]  # noqa: E731 - fresh, merge is in place
    left = functools.reduce(merge, make())
    right = functools.reduce(lambda a, b: merge(b, a), make()[::-1])
    np.testing.assert_allclose(left.weight_sums[0], right.weight_sums[0], rtol=1e-14)
    assert left.examples == right.examples == 10


def test_metrics_missing_on_one_side_are_kept():
    a = PartialResult(examples=2, metric_sums={"loss": 2.0})
    b = PartialResult(examples=2, metric_sums={"loss": 4.0, "acc": 2.0})
    total = merge(a, b)
    assert total.metric_means() == pytest.approx({"loss": 1.5, "acc": 0.5})


def test_optimizer_sums_none_stays_none():
    a = worker_result(1, [np.ones(2)])
    b = worker_result(3, [np.zeros(2)])
    total = merge(a, b)
    assert total.optimizer_sums is None
    np.testing.assert_allclose(total.average(total.weight_sums, [np.ones(2)])[0], [0.25, 0.25])


def test_partial_results_survive_pickling():
    """Partials travel between executors and the driver through pickle."""
    import pickle

    a = worker_result(3, [np.array(1.5), np.arange(3.0)], [np.array(2.0)], {"loss": 0.25})
    b = pickle.loads(pickle.dumps(a))
    total = merge(b, worker_result(1, [np.array(0.5), np.zeros(3)], [np.array(6.0)], {"loss": 1.0}))
    avg = total.average(total.weight_sums, [np.array(0.0), np.zeros(3)])
    np.testing.assert_allclose(avg[0], (3 * 1.5 + 0.5) / 4)
    np.testing.assert_allclose(avg[1], 3 * np.arange(3.0) / 4)
    np.testing.assert_allclose(total.average(total.optimizer_sums, [np.array(0.0)])[0], 3.0)
    assert total.metric_means()["loss"] == pytest.approx((0.75 + 1.0) / 4)
