"""The ``"spark"`` transport's state out: bases broadcast once, each round a patch of what changed since.

Where the driver's state changes little from round to round (``optimizer_state="local"`` or ``"reset"``: the
driver's optimizer variables change only in their iteration counter; a sparse ``update_compression`` with an outer
rule without momentum: a few percent of the weights), :class:`Downlink` keeps a base of each part of the state in a
Spark broadcast and sends each round only its patch (:mod:`sparkdl_avg.shared.wire.state_patch`, which also has
the executors' half). A part whose patch outgrows :data:`~sparkdl_avg.shared.wire.state_patch.REBASE_SHARE` of its
base becomes the new base.

Thread-safe: stale and asynchronous chunks publish from several driver threads. A base that a newer one replaced is
unpersisted once the last job that reads it released its state (a count per base).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ...shared.wire import state_patch
from ...shared.wire.state_patch import Patch, PatchedState, diff


class _Base:
    """One part's base: the driver's copy (what patches are taken against) and its broadcast."""

    def __init__(self, engine, arrays: Sequence[Any]) -> None:
        self.arrays: List[np.ndarray] = [np.array(a, copy=True) for a in arrays]
        self.nbytes = sum(a.nbytes for a in self.arrays)
        self.broadcast = engine.broadcast(self.arrays)
        self.readers = 0  # published states that read it and are not released yet
        self.retired = False  # a newer base replaced it: unpersisted once no reader is left

    def drop(self) -> None:
        self.arrays = []
        self.broadcast.unpersist()


class Downlink:
    """One fit's bases and patches (see the module docstring).

    Args:
        engine: The session's engine (its broadcasts).
        rebase_share: A part is rebased when its patch would take more than this share of its base's bytes
            (default :data:`~sparkdl_avg.shared.wire.state_patch.REBASE_SHARE`; 0: the whole state every round).
    """

    def __init__(self, engine, rebase_share: Optional[float] = None) -> None:
        self.engine = engine
        self.rebase_share = state_patch.REBASE_SHARE if rebase_share is None else rebase_share
        self._lock = threading.Lock()
        self._bases: List[Optional[_Base]] = [None, None]  # the weights', the optimizer variables'

    def publish(self, weights: Sequence[Any], optimizer: Optional[Sequence[Any]]
                ) -> Tuple[PatchedState, Callable[[], None], int]:
        """The state source of ``(weights, optimizer)``, its release, and the bytes this made travel (the patches,
        and a new base where one was made)."""
        with self._lock:
            used, entries, nbytes = [], [], 0
            for part, arrays in enumerate((weights, optimizer)):
                if arrays is None:
                    used.append(None)
                    entries.append(None)
                    continue
                base = self._bases[part]
                patch = diff(base.arrays, arrays) if base is not None and len(base.arrays) == len(arrays) else None
                if patch is None or patch.nbytes > self.rebase_share * base.nbytes:
                    base = self._rebase(part, arrays)
                    patch = Patch((None,) * len(base.arrays), 0)
                    nbytes += base.nbytes
                base.readers += 1
                used.append(base)
                entries.append(patch.entries)
                nbytes += patch.nbytes
            patches = self.engine.broadcast(tuple(entries))
        state = PatchedState(used[0].broadcast, None if used[1] is None else used[1].broadcast, patches)
        released = []

        def release() -> None:
            with self._lock:
                if released:
                    return
                released.append(True)
                patches.unpersist()
                for base in used:
                    if base is not None:
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
        """Unpersists the bases (the fit's end); a state published and not released keeps its own until then."""
        with self._lock:
            for part, base in enumerate(self._bases):
                if base is not None:
                    base.retired = True
                    if base.readers == 0:
                        base.drop()
            self._bases = [None, None]
