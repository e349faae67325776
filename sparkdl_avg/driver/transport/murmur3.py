"""Spark's ``hash()`` of an int (a Murmur3 x86_32 port) and the shard keys it gives: which reducer gets which shard.

A sharded Spark SQL round (:mod:`.sql_paths`) repartitions its rows by a
key per shard; Spark hash-partitions them by ``pmod(hash(key), S)``. Keys
chosen here put shard ``j`` in partition ``j``, one shard per reducer task.
Only the driver computes them (the keys travel in the plan), so this lives
on the driver's side.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Tuple


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an ``int`` (Murmur3 x86_32, seed 42): what ``repartition(n, col)`` partitions by."""
    mask = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = (value & mask) * 0xCC9E2D51 & mask
    k1 = rotl(k1, 15) * 0x1B873593 & mask
    h1 = seed ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= (1 << 31) else h1


@functools.lru_cache(maxsize=64)
def shard_keys(shards: int) -> Tuple[int, ...]:
    """Keys ``k_j`` with ``pmod(hash(k_j), shards) == j``: repartitioning by them gives shard ``j`` partition ``j``.

    Without them, hash partitioning of the shard ids 0..S-1 would put
    several shards in one reducer and leave others idle.
    """
    keys: List[Optional[int]] = [None] * shards
    left, candidate = shards, 0
    while left:
        j = spark_int_hash(candidate) % shards
        if keys[j] is None:
            keys[j] = candidate
            left -= 1
        candidate += 1
    return tuple(keys)
