"""``overlap_rounds`` on the driver: the workers' own terms in flight, and the fit's end that applies the last average.

The protocol (eager updates, Kale et al. 2025; docs/guides/rounds.md,
"Overlapped rounds") has two halves in flight between rounds: the driver's
pending average, which is the update rule's state
(:class:`~sparkdl_avg.driver.algorithms.overlap.OneRoundLate`), and each
worker's own term ``δ_i/N``, a file chained from its round to its next
(:mod:`sparkdl_avg.executor.overlap`). :class:`OwnDeltaLedger` keeps the
book of those files exactly as ``optimizer_state="local"``'s states are
kept (on the workers' hosts on classic sessions, under the staging
directory on Spark Connect; a retried task reads the same file; a
checkpoint carries the newest complete round's files, tagged
:data:`OWN_TAG`). :func:`apply_pending` is the fit's end: the pending
average applied to the driver's model, nothing left in flight.

Where the rounds run: round ``t + 1`` starts from ``G_t``, which the driver
holds when round ``t`` starts (the weights plus the pending average). Where
the rounds run in a standing job (one host, a local staging directory:
:class:`~sparkdl_avg.driver.transport.sql.SqlTransport`), the round runner
(:meth:`~sparkdl_avg.driver.fit.rounds.RoundRunner.run`, its ``ahead``)
therefore announces round ``t + 1`` before it waits for round ``t``'s sums,
and each task goes straight from answering round ``t`` to training round
``t + 1`` while the driver reads, sums and applies round ``t``. Elsewhere
(hosts of their own, elastic rounds, a schedule that reads the logs) the
rounds run one after another, with the same arithmetic.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

from ...executor.overlap import OwnTerms
from ...shared.files.fs import join
from ...shared.model.modelspec import get_state, set_state
from ..algorithms.overlap import flush
from ..transport.chains import KEPT
from ..transport.local_states import LocalStateLedger

logger = logging.getLogger("sparkdl_avg")

OWN_TAG = "overlap-own"
"""The tag of the workers' own terms in a checkpoint's entries."""


@KEPT.register
class OwnDeltaLedger(LocalStateLedger):
    """Each worker's own term ``δ_i/N`` over one fit's rounds (the files' book; see the module docstring)."""

    name = "overlap"

    def __init__(self, directory: str, num_workers: int, host_local: bool = False) -> None:
        super().__init__(directory, num_workers, host_local, tag=OWN_TAG, kind=OwnTerms)

    @classmethod
    def for_fit(cls, fit) -> Optional["OwnDeltaLedger"]:
        """Under ``overlap_rounds``: kept as ``optimizer_state="local"``'s states are."""
        if not fit.config.overlap_rounds:
            return None
        return cls(join(fit.exchange, "overlap"), fit.plan.num_workers, host_local=fit.plan.engine.sc is not None)

    def export(self) -> Dict[str, bytes]:
        """The newest complete round's own terms, if under the shared directory (else none, with a warning)."""
        complete, unshared = self._complete()
        if unshared:
            logger.warning("This checkpoint carries no overlap_rounds own terms: the workers kept them on their "
                           "hosts after the round before it; a fit resumed from it starts every worker without "
                           "one (a zero own term), which is not the uninterrupted fit's arithmetic.")
            return {}
        return self._read(complete)


def apply_pending(model, rule_state) -> None:
    """Applies the pending average (``overlap_rounds``) to ``model``: the fit's weights with every round's average."""
    if rule_state.state is None:
        return
    weights, optimizer = get_state(model)
    set_state(model, flush(weights, rule_state.state), optimizer)
