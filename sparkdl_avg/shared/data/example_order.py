"""Which examples each worker trains on, in which round of which epoch.

An epoch visits the staged examples in the order of a seeded pseudo-random
permutation. The permutation is a Feistel network with cycle walking, so any
slice of it is computed from ``(seed, epoch, positions)`` alone in memory
proportional to the slice: the driver never materialises an index of the whole
dataset and every task, retried or not, derives the same examples.

Per epoch each of ``N`` workers trains ``S = M // (N·B)`` minibatches of ``B``
examples (``M`` examples in all), in rounds of ``k`` minibatches; the last
round of an epoch is shorter when ``k`` does not divide ``S``. The
``M - S·N·B`` examples left over (fewer than ``N·B``) are skipped for that
epoch; with shuffling they are different examples every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser: a fast, well-mixing 64-bit hash."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def epoch_key(seed: int, epoch: int) -> int:
    """The permutation key of one epoch, derived from the run's seed."""
    mixed = _splitmix64(np.array([seed * 1_000_003 + epoch], dtype=np.uint64))
    return int(mixed[0])


def permute(positions: np.ndarray, size: int, key: int, rounds: int = 4) -> np.ndarray:
    """Maps ``positions`` in ``[0, size)`` through a keyed bijection of ``[0, size)``.

    Args:
        positions: Integer array of positions, each in ``[0, size)``.
        size: Number of elements permuted (the dataset size).
        key: 64-bit permutation key, e.g. from :func:`epoch_key`.
        rounds: Feistel rounds; four give a pseudo-random permutation.

    Returns:
        ``int64`` array of the same shape: the example index at each position.
    """
    positions = np.asarray(positions, dtype=np.int64)
    if size <= 1:
        return positions.copy()
    bits = max(2, int(size - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    round_keys = _splitmix64(np.arange(rounds, dtype=np.uint64) + np.uint64(key & 0xFFFFFFFFFFFFFFFF))

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for rk in round_keys:
            left, right = right, left ^ (_splitmix64(right ^ rk) & mask)
        return (left << half) | right

    out = feistel(positions.astype(np.uint64))
    # Cycle walking: re-encrypt values that fall outside [0, size) until they
    # land inside; this restricts the bijection on [0, 2^bits) to [0, size).
    outside = out >= np.uint64(size)
    while outside.any():
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(size)
    return out.astype(np.int64)


def steps_per_epoch(num_examples: int, num_workers: int, batch_size: int) -> int:
    """Minibatches each worker trains per epoch: ``M // (N·B)`` (0 if fewer than ``N·B`` examples)."""
    return num_examples // (num_workers * batch_size)


def round_lengths(num_examples: int, num_workers: int, batch_size: int, averaging_frequency: int) -> List[int]:
    """Minibatches per worker of each round of one epoch, for a fixed ``k``.

    Returns ``[k, k, ..., r]`` where the last entry is the shorter final round
    (absent when ``k`` divides the epoch's minibatches per worker), or ``[]``
    when there are fewer than ``num_workers * batch_size`` examples.
    """
    steps = steps_per_epoch(num_examples, num_workers, batch_size)
    full, rest = divmod(steps, averaging_frequency)
    return [averaging_frequency] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class EpochOrder:
    """The order in which one epoch visits the staged examples.

    Attributes:
        num_examples: Examples staged (``M``).
        seed: The run's seed.
        epoch: 0-based epoch index.
        shuffle: False visits examples in their staged order (data order of
            the DataFrame's partitions, the RDD or the arrays).
    """

    num_examples: int
    seed: int
    epoch: int
    shuffle: bool = True

    def indices(self, start: int, stop: int) -> np.ndarray:
        """Example indices at epoch positions ``[start, stop)``."""
        positions = np.arange(start, stop, dtype=np.int64)
        if not self.shuffle:
            return positions
        return permute(positions, self.num_examples, epoch_key(self.seed, self.epoch))


def worker_positions(
    steps_before: int, steps: int, worker: int, num_workers: int, batch_size: int, start: Optional[int] = None
) -> range:
    """Epoch positions a worker trains on in one round.

    Args:
        steps_before: Minibatches per worker in this epoch's earlier rounds.
        steps: Minibatches per worker in this round (``k`` of the round).
        worker: 0-based worker index.
        num_workers: Workers per round (``N``).
        batch_size: Examples per minibatch (``B``).
        start: The epoch position of the round's first example; ``None``:
            ``steps_before·N·B``, where every round of the epoch had ``N``
            workers. Elastic rounds (their ``N`` changes within an epoch)
            give it: a round takes the ``N·k·B`` positions after those its
            epoch's earlier rounds took, whatever their workers.

    With ``k = 1`` round ``r`` gives worker ``i`` positions
    ``[(r·N + i)·B, (r·N + i + 1)·B)``, so the workers of a round together
    cover ``N·B`` consecutive positions, like one synchronous minibatch.
    """
    if start is None:
        start = steps_before * num_workers * batch_size
    first = start + worker * steps * batch_size
    return range(first, first + steps * batch_size)


def split_evenly(num_examples: int, parts: int) -> Sequence[range]:
    """Splits ``[0, num_examples)`` into ``parts`` contiguous ranges of near-equal size."""
    bounds = np.linspace(0, num_examples, parts + 1).round().astype(np.int64)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
