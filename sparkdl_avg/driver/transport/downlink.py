"""The ``"spark"`` transport's state out: bases broadcast once, each round a patch of what changed since the last.

Where the driver's state changes little from round to round (``optimizer_state="local"`` or ``"reset"``: the
driver's optimizer variables change only in their iteration counter; a sparse ``update_compression`` with an outer
rule without momentum: a few percent of the weights), :class:`Downlink` keeps a base of each part of the state in a
Spark broadcast and, each round, broadcasts only the patch against the round before; a round's state is the base
and the chain of patches since, which an executor keeps as it keeps any broadcast, so it fetches each once
(:mod:`sparkdl_avg.shared.wire.state_patch`, which also has the executors' half). A part whose round's patch
outgrows :data:`~sparkdl_avg.shared.wire.state_patch.REBASE_SHARE` of its base, or whose chain outgrows
:data:`~sparkdl_avg.shared.wire.state_patch.CHAIN_SHARE` of it, becomes the new base.

Thread-safe: stale and asynchronous chunks publish from several driver threads. A base (with its chain) that a newer
one replaced is unpersisted once the last job that reads it released its state (a count per base).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ...shared.wire import state_patch
from ...shared.wire.state_patch import Patch, PatchedState, apply, diff


class _Base:
    """One part's base and its chain: the base's broadcast, each later round's patch (against the round before) in a
    broadcast of its own, and the driver's copy of the state as last published (what the next patch is taken
    against)."""

    def __init__(self, engine, arrays: Sequence[Any]) -> None:
        self.arrays: List[np.ndarray] = [np.array(a, copy=True) for a in arrays]
        self.nbytes = sum(a.nbytes for a in self.arrays)
        self.broadcast = engine.broadcast(self.arrays)
        self.chain: List[Any] = []  # the patches' broadcasts, oldest first
        self.chain_bytes = 0
        self.readers = 0  # published states that read it and are not released yet
        self.retired = False  # a newer base replaced it: unpersisted once no reader is left

    def extend(self, engine, patch: Patch) -> None:
        """Appends ``patch`` (taken against :attr:`arrays`) to the chain and moves :attr:`arrays` on to it."""
        self.chain.append(engine.broadcast(patch.entries))
        self.chain_bytes += patch.nbytes
        self.arrays = apply(self.arrays, patch.entries, in_place=True)

    def drop(self) -> None:
        self.arrays = []
        self.broadcast.unpersist()
        for patch in self.chain:
            patch.unpersist()


class Downlink:
    """One fit's bases and their chains of patches (see the module docstring).

    Args:
        engine: The session's engine (its broadcasts).
        rebase_share: A part is rebased when a round's patch would take more than this share of its base's bytes
            (default :data:`~sparkdl_avg.shared.wire.state_patch.REBASE_SHARE`; 0: the whole state every round).
        chain_share: ... or when its chain of patches would (default
            :data:`~sparkdl_avg.shared.wire.state_patch.CHAIN_SHARE`).
    """

    def __init__(self, engine, rebase_share: Optional[float] = None, chain_share: Optional[float] = None) -> None:
        self.engine = engine
        self.rebase_share = state_patch.REBASE_SHARE if rebase_share is None else rebase_share
        self.chain_share = state_patch.CHAIN_SHARE if chain_share is None else chain_share
        self._lock = threading.Lock()
        self._bases: List[Optional[_Base]] = [None, None]  # the weights', the optimizer variables'

    def publish(self, weights: Sequence[Any], optimizer: Optional[Sequence[Any]]
                ) -> Tuple[PatchedState, Callable[[], None], int]:
        """The state source of ``(weights, optimizer)``, its release, and the bytes this made travel (this round's
        patches, and a new base where one was made)."""
        with self._lock:
            used, sources, nbytes = [], [], 0
            for part, arrays in enumerate((weights, optimizer)):
                if arrays is None:
                    sources.append(None)
                    continue
                base = self._bases[part]
                patch = diff(base.arrays, arrays) if base is not None and len(base.arrays) == len(arrays) else None
                if (patch is None or patch.nbytes > self.rebase_share * base.nbytes
                        or base.chain_bytes + patch.nbytes > self.chain_share * base.nbytes):
                    base = self._rebase(part, arrays)
                    nbytes += base.nbytes
                elif any(entry is not None for entry in patch.entries):
                    base.extend(self.engine, patch)
                    nbytes += patch.nbytes
                base.readers += 1
                used.append(base)
                sources.append((base.broadcast, tuple(base.chain)))
        state = PatchedState(*sources)
        released = []

        def release() -> None:
            with self._lock:
                if released:
                    return
                released.append(True)
                for base in used:
                    base.readers -= 1
                    if base.retired and base.readers == 0:
                        base.drop()

        return state, release, nbytes

    def _rebase(self, part: int, arrays: Sequence[Any]) -> _Base:
        old = self._bases[part]
        if old is not None:
            old.retired = True
            if old.readers == 0:
                old.drop()
        self._bases[part] = _Base(self.engine, arrays)
        return self._bases[part]

    def close(self) -> None:
        """Unpersists the bases and chains (the fit's end); a state published and not released keeps its own until
        then."""
        with self._lock:
            for part, base in enumerate(self._bases):
                if base is not None:
                    base.retired = True
                    if base.readers == 0:
                        base.drop()
            self._bases = [None, None]
