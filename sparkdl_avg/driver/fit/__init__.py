"""One fit's life on the driver: one synchronous round (state out, the job, the update) and stale/async chunks.

May import :mod:`..algorithms`, :mod:`..transport`, :mod:`..config`, :mod:`..runtime`,
:mod:`..elastic`, :mod:`..observe`, :mod:`..data` and the shared side; never :mod:`..api`.

Its other modules:

* :mod:`.fragments`: ``sync_fragments``: fragment rounds on the driver (Streaming DiLoCo, Douillard et al.
  2025).
* :mod:`.hooks`: the fit loop's built-in behaviours, each a :class:`FitHook`: Keras callbacks, progress,
  checkpoints, elastic bookkeeping, ``"auto"``'s re-choice of its path from the link's measured rate, tracking
  observers and the slow and cold-start warnings.
* :mod:`.loop`: one fit's epochs on the driver: :func:`start` builds what they share, :class:`FitLoop` runs
  them.
* :mod:`.overlap`: ``overlap_rounds`` on the driver: the workers' own terms in flight, and the fit's end that
  applies the last average.
* :mod:`.plan`: what a fit settles before its first round: :class:`FitPlan`, and the arithmetic of workers and
  minibatches.
* :mod:`.planner`: the rounds of an epoch, planned one at a time: :class:`RoundPlanner` yields each
  :class:`PlannedRound`.
* :mod:`.rounds`: one round of parameter averaging, on the driver: state out, the Spark job, sums back, the
  update.
* :mod:`.stale_async`: stale-synchronous and asynchronous training: an epoch as chunks each worker trains
  without waiting.
"""
