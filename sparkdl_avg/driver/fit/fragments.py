"""``sync_fragments``: fragment rounds on the driver (Streaming DiLoCo, Douillard et al. 2025).

The split (:func:`split`): the trainable variables, in ``model.trainable_variables``
order (the order of the trainable entries of the model's weights), are cut into
``F`` contiguous, non-empty fragments, a variable never split, whose largest
fragment (in elements) is as small as a contiguous split allows. ``F`` larger
than the number of trainable variables is refused.

The protocol, with ``c`` the fit's fragment rounds so far (checkpointed) and
``S(c)`` the variables round ``c`` synchronises (fragment ``c mod F`` and every
non-trainable variable, so BatchNorm statistics are averaged every round):

- the driver sends the full state ``to_send(w)`` as in any round (so a worker
  without own weights can start: the fit's first round, a worker an elastic
  round adds, one whose file was lost);
- each worker starts from its own weights with ``S(c−1)`` replaced by the sent
  values (the new global values of the previous round's fragment: adoption at
  the start of the next round), trains ``k`` minibatches, keeps its weights
  and returns the sums (or, under ``update_compression``, the deltas from the
  sent values) of ``S(c)`` only;
- the driver applies the fit's update rule to ``S(c)`` alone, with the rule's
  state sliced to those variables: the other variables and their state are
  unchanged, so the values a worker adopted for a fragment are still the sent
  ones when that fragment is next synchronised, ``F`` rounds later, and the
  fragment's delta spans its ``F`` rounds of training.

Optimizer variables follow ``optimizer_state`` as in any round (averaged in
full every round with ``"average"``; ``"local"`` keeps them on the workers, so
only the fragment travels). Error-feedback residuals chain per fragment (the
residual ledger's lag is ``F``). ``F = 1`` is the plain round: none of this
runs. The workers' half is :mod:`sparkdl_avg.shared.wire.fragments`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ConfigurationError
from ...shared.wire.fragments import FragmentRound, WeightFiles
from ...shared.wire.sparse_rows import MIN_TABLE_ROWS
from ...shared.files.fs import join
from ..transport.chains import KEPT, KeptKind
from ..transport.local_states import LocalStateLedger

TAG = "sync-fragments"
"""The tag of the workers' own weights in a checkpoint; ``"<TAG>-counter/0/0"`` holds the fragment counter."""


def split(sizes: Sequence[int], fragments: int) -> List[int]:
    """The fragment of each trainable variable, from their element counts (see the module docstring).

    The contiguous split whose largest fragment is the smallest possible: the least cap ``C`` for which filling
    fragments in order, each up to ``C`` elements, needs at most ``fragments`` of them (a binary search over ``C``),
    then that filling, starting a new fragment early only where exactly one variable per fragment is left.

    Raises:
        ConfigurationError: ``fragments`` exceeds the number of variables.
    """
    n = len(sizes)
    if fragments > n:
        raise ConfigurationError(
            f"The 'sync_fragments' parameter must be at most the model's number of trainable variables ({n}): "
            f"a fragment holds whole variables. Got sync_fragments={fragments} instead."
        )
    sizes = [int(size) for size in sizes]

    def fill(cap: int) -> List[int]:
        out, load, p = [], 0, 0
        for j, size in enumerate(sizes):
            # a new fragment when this one would pass the cap, or when the variables left are only enough for one
            # per fragment left (no fragment empty)
            if out and (load + size > cap or n - j <= fragments - 1 - p):
                p, load = p + 1, 0
            out.append(p)
            load += size
        return out

    low, high = max(sizes), max(sum(sizes), 1)
    while low < high:  # the least cap whose filling needs at most `fragments` fragments
        cap = (low + high) // 2
        if fill(cap)[-1] < fragments:
            high = cap
        else:
            low = cap + 1
    return fill(low)


@KEPT.register
class Fragments(KeptKind):
    """One fit's fragment rounds: the split, the fragment counter, the workers' own weights (files).

    Args:
        count: ``F``, at least 2.
        weights: The model's weights (shapes), in ``get_state`` order.
        trainable: Per weight, whether it is trainable.
        ledger: The workers' own weights' files (a :class:`LocalStateLedger` of :class:`WeightFiles`).
    """

    name = "fragments"

    def __init__(self, count: int, weights: Sequence[np.ndarray], trainable: Sequence[bool],
                 ledger: LocalStateLedger) -> None:
        variables = [j for j, t in enumerate(trainable) if t]
        of = split([int(np.asarray(weights[j]).size) for j in variables], count)
        self.count, self.ledger, self.counter = count, ledger, 0
        self.trainable = list(trainable)
        fixed = tuple(j for j, t in enumerate(trainable) if not t)
        self.groups: List[Tuple[int, ...]] = [
            tuple(sorted(fixed + tuple(j for j, p in zip(variables, of) if p == q))) for q in range(count)]

    pipelined = False  # a fragment round's sums are its fragment's: the next round's state is not known ahead

    @classmethod
    def for_fit(cls, fit) -> Optional["Fragments"]:
        """Under ``sync_fragments > 1``: the fit's fragments, checked against the model and the rule, the workers'
        own weights beside the transport's files (on the workers' hosts on classic sessions)."""
        from ...shared.model.modelspec import trainable_mask

        count = fit.config.sync_fragments
        if count <= 1:
            return None
        if getattr(fit.transport.settings, "tables", None):
            raise ConfigurationError(
                "The 'sync_fragments' parameter does not apply to models with embedding tables (an Embedding of "
                f"{MIN_TABLE_ROWS:,} rows or more) yet: their rounds send the tables' changed rows, not fragments. Got "
                f"sync_fragments={count}: pass 1.")
        weights, mask = fit.model.get_weights(), trainable_mask(fit.model)
        check_rule_state(fit.plan.rule.init_state(weights, mask), weights, mask, fit.plan.rule.name)
        ledger = LocalStateLedger(join(fit.exchange, "fragments"), fit.plan.num_workers,
                                  host_local=fit.plan.engine.sc is not None, tag=TAG, kind=WeightFiles)
        return cls(count, weights, mask, ledger)

    def synced(self, counter: Optional[int] = None) -> Tuple[int, ...]:
        """The variables fragment round ``counter`` (default: the next) synchronises."""
        return self.groups[(self.counter if counter is None else counter) % self.count]

    def for_round(self, epoch: int, rnd: int, workers, share: bool = False, ahead: bool = False) -> FragmentRound:
        """What round ``rnd`` of ``epoch``'s tasks for ``workers`` do (the next fragment round)."""
        adopt = self.synced(self.counter - 1) if self.counter > 0 else None
        return FragmentRound(self.ledger.for_round(epoch, rnd, workers, share), adopt, self.synced())

    def returned(self) -> Tuple[int, ...]:
        """The next round's fragment: its sums hold those variables alone."""
        return self.synced()

    def done(self, epoch: int, rnd: int, workers, records=()) -> None:
        """The round has ended: its workers' files are complete and the next fragment's turn comes."""
        self.ledger.done(epoch, rnd, workers, records)
        self.counter += 1

    @property
    def host_local(self) -> bool:
        """Whether the workers' own weights are kept on their hosts (see :class:`LocalStateLedger`)."""
        return self.ledger.host_local

    def places(self, workers, live):
        """See :meth:`LocalStateLedger.places`."""
        return self.ledger.places(workers, live)

    def resize(self, num_workers: int) -> None:
        """See :meth:`~sparkdl_avg.driver.transport.chains.RoundChains.resize`."""
        self.ledger.resize(num_workers)

    def close(self) -> None:
        """Deletes the workers' own weights' shared files."""
        self.ledger.close()

    def export(self) -> Dict[str, bytes]:
        """What a checkpoint carries: the workers' own weights and the counter."""
        out = self.ledger.export()
        out[f"{TAG}-counter/0/0"] = str(self.counter).encode("ascii")
        return out

    def restore(self, files: Dict[str, bytes]) -> None:
        """Continues from a checkpoint's :meth:`export` (a checkpoint without one starts at fragment 0)."""
        self.ledger.restore(files)
        data = files.get(f"{TAG}-counter/0/0")
        self.counter = int(data.decode("ascii")) if data is not None else 0

def rule_slice(state: Dict[str, List[np.ndarray]], trainable: Sequence[bool], synced: Sequence[int]):
    """The rule's state lists restricted to the trainable variables among ``synced`` (the same arrays), and a
    function that writes lists of that form back into ``state`` (a rule may replace its lists' items)."""
    position = {j: k for k, j in enumerate(j for j, t in enumerate(trainable) if t)}
    ks = [position[j] for j in synced if j in position]
    sub = {name: [values[k] for k in ks] for name, values in state.items()}

    def write_back(new: Dict[str, List[np.ndarray]]) -> None:
        for name, values in new.items():
            for k, value in zip(ks, values):
                state[name][k] = value

    return sub, write_back


def check_rule_state(state: Dict[str, List[np.ndarray]], weights, trainable, rule_name: str) -> None:
    """Refuses a rule whose state is not one array per trainable variable (it cannot be applied to a fragment)."""
    shapes = [tuple(np.shape(w)) for w, t in zip(weights, trainable) if t]
    for name, values in (state or {}).items():
        if [tuple(np.shape(v)) for v in values] != shapes:
            raise ConfigurationError(
                f"The 'sync_fragments' parameter needs an update rule whose state is one array per trainable "
                f"variable ('average', 'bmuf', 'bmuf_nesterov', 'slowmo', 'diloco'), to apply it to one fragment "
                f"at a time; update_rule {rule_name!r} keeps {name!r} otherwise. Pass sync_fragments=1 or one of "
                "those rules."
            )
