"""Data order and round plan (sparkdl_avg.shared.data.example_order); no Spark, no Keras."""

import numpy as np
import pytest

from sparkdl_avg.shared.data import example_order


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 17, 64, 1000, 1797, 4097])
@pytest.mark.parametrize("seed,epoch", [(0, 0), (7, 3), (2**31 - 1, 11)])
def test_permute_is_a_bijection(size, seed, epoch):
    key = example_order.epoch_key(seed, epoch)
    out = example_order.permute(np.arange(size), size, key)
    assert out.dtype == np.int64
    assert out.shape == (size,)
    np.testing.assert_array_equal(np.sort(out), np.arange(size))


def test_permute_of_a_slice_equals_the_slice_of_the_permutation():
    size, key = 4097, example_order.epoch_key(5, 2)
    whole = example_order.permute(np.arange(size), size, key)
    for start, stop in [(0, 1), (100, 357), (4000, 4097), (17, 18)]:
        np.testing.assert_array_equal(example_order.permute(np.arange(start, stop), size, key), whole[start:stop])


def test_permute_keeps_the_shape_of_positions():
    out = example_order.permute(np.arange(12).reshape(3, 4), 12, example_order.epoch_key(1, 0))
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(np.sort(out.ravel()), np.arange(12))


@pytest.mark.parametrize("size", [17, 1000, 4097])
def test_different_epochs_give_different_orders(size):
    orders = [example_order.EpochOrder(size, 42, epoch).indices(0, size) for epoch in range(4)]
    for i in range(len(orders)):
        for j in range(i + 1, len(orders)):
            assert not np.array_equal(orders[i], orders[j]), (i, j)


@pytest.mark.parametrize("size", [17, 1000, 4097])
def test_different_seeds_give_different_orders(size):
    a = example_order.EpochOrder(size, 1, 0).indices(0, size)
    b = example_order.EpochOrder(size, 2, 0).indices(0, size)
    assert not np.array_equal(a, b)


def _splitmix64(x: int) -> int:
    """splitmix64's finaliser on Python ints (Steele, Lea and Flood 2014; the constants of its reference code)."""
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


@pytest.mark.parametrize("seed,epoch", [(0, 0), (123, 4), (2**31 - 1, 11)])
def test_the_epoch_key_is_splitmix64_of_seed_and_epoch(seed, epoch):
    """Computed with numpy's wrapping uint64 arithmetic; the reference uses exact integers."""
    assert example_order.epoch_key(seed, epoch) == _splitmix64(seed * 1_000_003 + epoch)


def test_same_seed_and_epoch_give_the_same_order_in_every_process_and_version():
    """The order is pinned: a task retried in another process, or a fit resumed from a checkpoint by a
    later version, must visit the same examples. (Changing the permutation breaks resume: say so.)"""
    assert example_order.epoch_key(123, 4) == 1279619382567887744
    order = example_order.EpochOrder(17, 123, 4).indices(0, 17)
    assert order.tolist() == [8, 7, 15, 2, 11, 4, 0, 6, 10, 1, 16, 9, 14, 3, 12, 13, 5]
    assert example_order.EpochOrder(1000, 123, 4).indices(0, 8).tolist() == [960, 535, 844, 832, 424, 664, 629, 731]


def test_shuffled_order_is_not_the_identity():
    size = 1000
    order = example_order.EpochOrder(size, 3, 0).indices(0, size)
    # A pseudo-random permutation leaves few elements in place.
    assert np.sum(order == np.arange(size)) < size // 20


def test_unshuffled_order_is_the_identity():
    order = example_order.EpochOrder(50, 3, 1, shuffle=False)
    np.testing.assert_array_equal(order.indices(10, 20), np.arange(10, 20))


@pytest.mark.parametrize(
    "examples,workers,batch,k,expected",
    [
        (1797, 2, 32, 8, [8, 8, 8, 4]),  # 28 minibatches per worker
        (1797, 1, 32, 8, [8, 8, 8, 8, 8, 8, 8]),  # 56 = 7 * 8
        (1797, 2, 32, 1, [1] * 28),
        (256, 2, 32, 4, [4]),
        (255, 2, 32, 4, [3]),  # 3 minibatches per worker, one short round
        (64, 2, 32, 8, [1]),
        (63, 2, 32, 8, []),  # fewer than N * B examples
        (0, 1, 1, 1, []),
        (100, 3, 5, 2, [2, 2, 2]),  # 6 minibatches per worker
        (100, 3, 5, 4, [4, 2]),
    ],
)
def test_round_lengths(examples, workers, batch, k, expected):
    assert example_order.round_lengths(examples, workers, batch, k) == expected


@pytest.mark.parametrize("examples,workers,batch,k", [(1797, 2, 32, 8), (1000, 3, 7, 5), (77, 1, 1, 10)])
def test_round_lengths_cover_all_full_minibatches(examples, workers, batch, k):
    lengths = example_order.round_lengths(examples, workers, batch, k)
    assert sum(lengths) == examples // (workers * batch)
    assert all(1 <= s <= k for s in lengths)
    assert all(s == k for s in lengths[:-1])


@pytest.mark.parametrize("workers,batch", [(1, 4), (2, 3), (3, 5)])
def test_worker_positions_with_k1_are_consecutive_blocks(workers, batch):
    expected_start = 0
    for rnd in range(4):
        for worker in range(workers):
            positions = example_order.worker_positions(rnd, 1, worker, workers, batch)
            assert positions == range((rnd * workers + worker) * batch, (rnd * workers + worker + 1) * batch)
            assert positions.start == expected_start
            expected_start = positions.stop


@pytest.mark.parametrize("examples,workers,batch,k", [(1797, 2, 32, 8), (1000, 3, 7, 5), (100, 1, 10, 3)])
def test_worker_positions_partition_the_epoch(examples, workers, batch, k):
    """Over all rounds and workers each used position is visited exactly once."""
    lengths = example_order.round_lengths(examples, workers, batch, k)
    seen = []
    before = 0
    for steps in lengths:
        for worker in range(workers):
            positions = example_order.worker_positions(before, steps, worker, workers, batch)
            assert len(positions) == steps * batch
            seen.extend(positions)
        before += steps
    used = sum(lengths) * workers * batch
    assert sorted(seen) == list(range(used))
    assert used <= examples < used + workers * batch


@pytest.mark.parametrize("examples,parts", [(10, 3), (1797, 2), (5, 5), (3, 4), (1, 1)])
def test_split_evenly(examples, parts):
    ranges = example_order.split_evenly(examples, parts)
    assert len(ranges) == parts
    assert [i for r in ranges for i in r] == list(range(examples))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1
