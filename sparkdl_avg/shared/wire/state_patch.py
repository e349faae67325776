"""A round's state sent as what changed since the round before, on a base the executors hold: the patch format,
both halves.

Under ``optimizer_state="local"`` (or ``"reset"``) the driver's optimizer variables never change but for the
iteration counter, and with a sparse ``update_compression`` (``"topk"``, ``"threshold"``) and an outer rule without
momentum a round changes a few percent of the weights. Sending the whole state every round then sends mostly what
every executor already has: with Adam, three times the weights. The ``"spark"`` transport
(:class:`~sparkdl_avg.driver.transport.downlink.Downlink`) keeps a *base* of each part of the state (the weights, the
optimizer variables) in a Spark broadcast, which an executor fetches once and keeps (a new executor fetches it as
any broadcast, from the driver or its peers), and each round sends only a :class:`Patch` against the round before:
per array, the positions whose bits differ and their new values, or the array whole where that is smaller. The
executors keep each patch's broadcast too, so a round's state is the base and the chain of patches since, and each
executor fetches only the newest. A part whose round's patch grows past :data:`REBASE_SHARE` of its base, or whose
chain grows past :data:`CHAIN_SHARE` of it, is sent whole again as a new base.

The executors rebuild the state bitwise (:func:`apply`): the same bits as the whole state, whatever the dtype
(``-0.0``, NaN payloads). What is read is :class:`PatchedState`, a state source as
:class:`~sparkdl_avg.shared.wire.exchange.BroadcastState` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

REBASE_SHARE = 0.5
"""A part of the state whose round's patch would take more than this share of its base's bytes is sent whole, as a
new base.

A dense rule (outer momentum, plain averaging of dense updates) changes every weight every round: its weights are
rebased every round, what the whole state cost before patches (a changed value travels with its position, 8 bytes
against 4, so a patch of more than half the values would cost more than the array whole anyway)."""

CHAIN_SHARE = 1.0
"""A part whose chain of patches since its base would take more than this share of the base's bytes is sent whole,
as a new base.

A chain costs the network only its newest patch a round (executors keep the older ones), but it costs each round's
task the applying of all of it, a joining executor the fetching of all of it, and the executors' block managers its
bytes: at most the base's bytes more, with 1.0. The trade: a re-base sends the base to every executor once more
(docs/benchmarks/sparse_codecs.md, "The state sent as a patch")."""

BLOCK = 1 << 22
"""Values compared at a time (the driver's temporaries stay a few MiB whatever the model's size)."""

#: What an array's entry in a :class:`Patch` is: ``None`` (unchanged), ``("all", array)`` or ``("at", positions,
#: values)`` (flat C-order positions, int32 or int64, ascending; the values in the array's dtype).
Entry = Optional[Tuple[Any, ...]]


@dataclass(frozen=True)
class Patch:
    """What changed in a list of arrays since their base, one :data:`Entry` per array, and its size in bytes."""

    entries: Tuple[Entry, ...]
    nbytes: int


def _bits(a: np.ndarray) -> Optional[np.ndarray]:
    """``a``'s values as unsigned integers of their width, flat (``None``: a width compared some other way)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.itemsize not in (1, 2, 4, 8):
        return None
    return flat.view(f"u{flat.dtype.itemsize}")


def diff(base: Sequence[np.ndarray], arrays: Sequence[Any]) -> Patch:
    """The patch that turns ``base`` into ``arrays`` bitwise (each read once, in order; ``arrays`` may be a model's
    variables read on access).

    An array travels ``"at"`` its changed positions when that takes fewer bytes than the array itself (a position
    and a value each), else ``"all"``; one of another shape or dtype than its base travels ``"all"``.
    """
    if len(base) != len(arrays):
        raise ValueError(f"a patch needs as many arrays as its base: {len(arrays)} against {len(base)}")
    entries: List[Entry] = []
    nbytes = 0
    for b, a in zip(base, arrays):
        a = np.asarray(a)
        old, new = _bits(b), _bits(a)
        if a.shape != b.shape or a.dtype != b.dtype or old is None:
            entries.append(("all", np.array(a, copy=True)))
            nbytes += a.nbytes
            continue
        width = 4 if new.size < 2**31 else 8
        # changed positions a block at a time, stopping once they would cost more than the array whole
        limit = new.size * a.dtype.itemsize // (width + a.dtype.itemsize)
        found: List[np.ndarray] = []
        count = 0
        for lo in range(0, new.size, BLOCK):
            at = np.flatnonzero(old[lo:lo + BLOCK] != new[lo:lo + BLOCK])
            count += at.size
            if count > limit:
                break
            found.append((at + lo).astype(np.int32 if width == 4 else np.int64))
        if count > limit:
            entries.append(("all", np.array(a, copy=True)))
            nbytes += a.nbytes
        elif count == 0:
            entries.append(None)
        else:
            positions = np.concatenate(found)
            entries.append(("at", positions, np.ascontiguousarray(a).reshape(-1)[positions]))
            nbytes += count * (width + a.dtype.itemsize)
    return Patch(tuple(entries), nbytes)


def apply(base: Sequence[np.ndarray], entries: Sequence[Entry], in_place: bool = False) -> List[np.ndarray]:
    """``base`` with ``entries`` applied (:func:`diff`'s).

    ``in_place``: ``base`` is the caller's own copy (writable, C-ordered): changed where it changes, no array copied;
    else new arrays, ``base`` left as it is.
    """
    if len(base) != len(entries):
        raise ValueError(f"a patch of {len(entries)} arrays does not fit a base of {len(base)}")
    out = []
    for b, entry in zip(base, entries):
        if entry is not None and entry[0] == "all":
            out.append(np.array(entry[1], copy=True))
            continue
        a = b if in_place and isinstance(b, np.ndarray) and b.flags.writeable and b.flags.c_contiguous \
            else np.array(b, copy=True)
        if entry is not None:
            _, positions, values = entry
            a.reshape(-1)[positions] = values
        out.append(a)
    return out


def _own_copy(broadcast) -> Tuple[Any, bool]:
    """A broadcast's value as a copy of this task's own where one can be had without a second copy, and whether it is.

    A Python worker keeps what ``value`` unpickled for every later task; its executor keeps the pickled bytes in a
    file. Read from that file, the base is unpickled afresh each round, as a round's broadcast was before patches,
    and patched in place: no copy of the state more than before in the worker, and no patch kept in it between
    tasks. (Where Spark hands the value over another way, encrypted broadcasts, ``value`` is read and patched into
    new arrays.)
    """
    path = getattr(broadcast, "_path", None)
    if path is not None and hasattr(broadcast, "load_from_path"):
        return broadcast.load_from_path(path), True
    return broadcast.value, False


def _rebuild(base, chain: Sequence[Any]) -> List[np.ndarray]:
    """The arrays of broadcast ``base`` with each patch of ``chain`` (broadcasts of entries) applied in order: new
    arrays, the broadcasts left as Spark keeps them."""
    arrays, own = _own_copy(base)
    for patch in chain:
        entries, _ = _own_copy(patch)  # read afresh, let go once applied
        arrays, own = apply(arrays, entries, in_place=own), True
    return arrays if own else apply(arrays, (None,) * len(arrays))


@dataclass(frozen=True)
class PatchedState:
    """The round's state as bases the executors keep and the patches since (a state source: :meth:`load`).

    Attributes:
        weights: ``(base, chain)``: a broadcast of the weights' base (a list of arrays) and a tuple of broadcasts of
            the patches since, oldest first, each against the one before (:attr:`Patch.entries`).
        optimizer: The optimizer variables', likewise; ``None``: no optimizer variables sent.
    """

    weights: Tuple[Any, Tuple[Any, ...]]
    optimizer: Optional[Tuple[Any, Tuple[Any, ...]]]

    def load(self) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """The round's state, bitwise what the driver sent: new arrays (the bases stay as Spark keeps them)."""
        weights = _rebuild(*self.weights)
        return weights, None if self.optimizer is None else _rebuild(*self.optimizer)
