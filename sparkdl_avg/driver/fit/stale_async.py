"""Stale-synchronous and asynchronous training: an epoch as chunks each worker trains without waiting.

This module owns ``synchronization="stale"`` and ``"async"`` on the driver. An epoch keeps the rounds of synchronous
training (the same ``k`` per round, the same examples, the same seeds): chunk ``j = r·N + i`` is worker ``i``'s part of
round ``r``. ``N`` driver threads ("slots") each run one chunk at a time as a one-task Spark job
(:meth:`~sparkdl_avg.driver.fit.rounds.RoundRunner.run_chunk`: Spark runs concurrent jobs); the main thread gives a free
slot the next chunk as soon as the bound allows and applies each chunk's update when it returns, so a fast worker gets
the current weights and its next chunk at once instead of waiting for the round's slowest worker. The communication is
the fit's transport (task results, broadcasts or the staging directory; the Spark SQL round under Connect): no socket,
no server.

**Bound.** A chunk of round ``r`` starts only when every round before ``r - s`` is applied (``s``: the ``staleness``
option; ``"async"`` has no bound). So a worker is at most ``s`` rounds ahead of the oldest chunk not yet applied, and
the weights a chunk reads lack at most ``s`` rounds (its record's ``staleness``). With ``s = 0`` every chunk of round
``r`` reads the weights after round ``r - 1``: synchronous training, up to the order of floating-point additions
(except under ``on_nonfinite="skip"``: a skipped replica's share is left out, where a synchronous round averages the
others).

**Update.** Worker ``i`` read ``w_read`` (what the update rule sends) and returns ``w_i``; the driver applies
``w ← w + g(τ)/N · (w_i − w_read)`` at once, and likewise the optimizer's variables (Adam's moments) with
``optimizer_state="average"``. ``τ`` (the record's ``delay``) is the number of updates applied between the read and
this one, over ``N``: about one round for a worker as fast as the others. With ``staleness_aware`` (Zhang et al., IJCAI
2016) ``g(τ) = 1/max(1, τ)``, else 1; updates of a synchronous round have ``τ < 1``, so either way ``s = 0`` is
synchronous averaging. The optimizer's iteration counter follows the global step: minibatches applied over ``N``.
Block-momentum rules (BMUF, SlowMo) act once per ``N`` applied updates (a "block", the asynchronous round): the block's
summed updates are their block gradient ``G``, and the rule's step replaces the plain one.

**What differs between runs.** Which slot trains which chunk, and when each update is applied relative to the others,
follow the workers' timing, so two asynchronous runs (``s > 0``) differ in the last bits and, with real stragglers, in
the weights each chunk starts from. Each chunk itself is deterministic: its examples, its dropout seeds and the state it
reads are fixed when it starts, so a chunk Spark retries gives the same update. ``reproducible=True`` (with
``"stale"``) removes the timing: updates are applied in chunk order (a chunk that returns early waits for those before
it) and a chunk of round ``r`` reads the state after exactly the rounds before ``r - s`` (a snapshot kept for it; a
schedule asked for round ``r``'s ``k`` sees that state's logs), so its staleness is always ``s`` (fewer in an epoch's
first rounds) and two runs give bitwise the same weights. The workers still run ahead as far as the bound lets them;
what it costs is freshness: every chunk reads weights ``s`` rounds old, even when newer ones exist.

Epochs still end together: validation, ``on_epoch_end``, checkpoints and the next epoch see every chunk of the epoch
applied; after a callback sets ``stop_training`` at a block's end, the chunks still running are waited for and dropped,
as a synchronous fit stops after that round. So that a slow worker does not hold an epoch's end back, a free slot takes
the next chunk only if the other slots, at their measured pace, would not train every chunk left in the epoch before it
trained that one (:meth:`StaleRunner._worth_starting`); free slots take chunks fastest first. Keras' batch hooks run
once per block.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...shared.wire.aggregation import PartialResult, merge
from .rounds import RoundRunner, check_finite
from .update import replica_means
from ..algorithms.rules import UpdateRule


def _is_float(a: np.ndarray) -> bool:
    """Whether updates move ``a``: any non-integer, non-bool dtype (``bfloat16`` is not a numpy ``floating``)."""
    dtype = np.asarray(a).dtype
    return not (np.issubdtype(dtype, np.integer) or dtype == np.bool_)


class StaleUpdater:
    """The global state under asynchronous updates: float64 copies, the counters, the rule's blocks.

    Pure numpy (no Spark, no model), so the update arithmetic is tested on its own. See the module docstring for the
    formulas.

    Args:
        weights: The model's weights at the epoch's start.
        optimizer: The optimizer's variables then.
        rule: The update rule (resolved for ``num_workers``).
        rule_state: The rule's state (``RuleState.state``), updated in place at each block's end.
        trainable: Per weight, whether the rule's momentum applies to it.
        num_workers: ``N``: updates per block, and the ``1/N`` of each update.
        iterations: Position of the iteration counter among ``optimizer``.
        average_optimizer: Whether updates move the optimizer's variables too.
        aware: Scale updates by ``1/max(1, τ)``.
    """

    def __init__(self, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray], rule: UpdateRule,
                 rule_state: Dict[str, List[np.ndarray]], trainable: Sequence[bool], num_workers: int,
                 iterations: int, average_optimizer: bool, aware: bool) -> None:
        self.dtypes = [np.asarray(w).dtype for w in weights]
        self.opt_dtypes = [np.asarray(v).dtype for v in optimizer]
        self.w = [np.array(w, np.float64) if _is_float(w) else np.array(w) for w in weights]
        self.opt = [np.array(v, np.float64) if _is_float(v) else np.array(v) for v in optimizer]
        self.rule, self.rule_state, self.trainable = rule, rule_state, list(trainable)
        self.n = num_workers
        self.it = iterations
        self.base_iterations = int(np.asarray(optimizer[iterations]))
        self.average_optimizer, self.aware = average_optimizer, aware
        self.applied = 0  # updates applied (skipped non-finite chunks count too)
        self.steps_applied = 0  # minibatches of the applied chunks
        self.in_block = 0  # updates applied since the last block's end
        self.block_start = self.weights()

    def weights(self) -> List[np.ndarray]:
        """The global weights, in the model's dtypes (copies: in-flight chunks keep what they read)."""
        return [w.astype(d) if _is_float(w) else w.copy() for w, d in zip(self.w, self.dtypes)]

    def optimizer(self) -> List[np.ndarray]:
        """The optimizer's variables, in their dtypes, the iteration counter at the global step."""
        out = [v.astype(d) if _is_float(v) else v.copy() for v, d in zip(self.opt, self.opt_dtypes)]
        out[self.it] = np.asarray(self.base_iterations + self.steps_applied // self.n, dtype=self.opt_dtypes[self.it])
        return out

    def read(self) -> Tuple[List[np.ndarray], List[np.ndarray], int]:
        """What a chunk starts from: ``(sent weights, optimizer variables, version)``."""
        sent = self.rule.to_send(self.weights(), self.rule_state, self.trainable)
        return sent, self.optimizer(), self.applied

    def apply(self, result: PartialResult, sent: Sequence[np.ndarray], opt_read: Sequence[np.ndarray], version: int,
              steps: int) -> Tuple[float, float]:
        """Applies one chunk's ``result`` read at ``version`` from ``sent``/``opt_read``; returns ``(scale, delay)``.

        A chunk with no examples (a non-finite replica under ``on_nonfinite="skip"``) moves nothing but still counts.
        """
        delay = (self.applied - version) / self.n
        scale = (1.0 / max(1.0, delay) if self.aware else 1.0) / self.n
        if result.examples:
            # w_i - w_read (sums of deltas are that already): the same means as a synchronous round's
            moves = replica_means(result.weight_sums, result.examples, sent, result.delta_sums, move=True)
            for w, m in zip(self.w, moves):
                if _is_float(w):
                    w += scale * m
            if self.average_optimizer and result.optimizer_sums is not None:
                moves = replica_means(result.optimizer_sums, result.examples, opt_read, result.delta_sums, move=True)
                for i, (v, m) in enumerate(zip(self.opt, moves)):
                    if i != self.it and _is_float(v):
                        v += scale * m
        else:
            scale = 0.0
        self.applied += 1
        self.steps_applied += steps
        self.in_block += 1
        return scale, delay

    @property
    def block_full(self) -> bool:
        """Whether ``N`` updates were applied since the last block's end."""
        return self.in_block >= self.n

    def end_block(self, learning_rate: float) -> List[np.ndarray]:
        """Ends a block: the update rule turns its summed updates into its step; returns the new weights.

        ``learning_rate``: the optimizer's at the block's start (SlowMo's ``γ``).
        """
        new = self.rule.apply(self.block_start, self.block_start, list(self.w), self.rule_state, self.trainable,
                              learning_rate)
        self.w = [np.array(w, np.float64) if _is_float(w) else np.array(w) for w in new]
        self.block_start = self.weights()
        self.in_block = 0
        return new


@dataclass
class _InFlight:
    """A chunk a slot is training."""

    slot: int
    round: int
    part: int
    index: int
    steps: int
    sent: List[np.ndarray]
    optimizer: List[np.ndarray]
    version: int
    staleness: int
    t_read: float


@dataclass
class EpochHooks:
    """What the trainer's epoch loop does around the chunks (callbacks, progress, the schedule).

    Attributes:
        next_steps: ``(round, steps_before, logs) -> k`` of a new round, cut to the epoch.
        chunk_end: ``(record, logs, minibatches per worker)`` after each applied chunk.
        block_begin: ``(block)`` before a block's first update.
        block_end: ``(block, logs) -> stop`` after a block's last; ``True`` stops the epoch.
    """

    next_steps: Callable[[int, int, Dict[str, float]], int]
    chunk_end: Callable[[Any, Dict[str, float], float], None]
    block_begin: Callable[[int], None]
    block_end: Callable[[int, Dict[str, float]], bool]


class StaleRunner:
    """Runs the epochs of one fit as chunks, stale-synchronously (``bound`` rounds) or asynchronously.

    Args:
        rounds: The fit's :class:`~sparkdl_avg.driver.fit.rounds.RoundRunner`: its settings, the chunks' jobs, their
            records and the model's state.
        bound: The staleness bound ``s``; ``None``: asynchronous.
        aware: Scale updates by their delay (``staleness_aware``).
        group: The fit's Spark job group, given to every chunk's job.
        reproducible: Apply updates in chunk order, each chunk reading the state after exactly the rounds before
            ``r - bound`` (needs a bound).
    """

    def __init__(self, rounds: RoundRunner, bound: Optional[int], aware: bool, group: Optional[str],
                 reproducible: bool = False) -> None:
        self.rounds = rounds
        self.bound = bound
        self.reproducible = reproducible
        self.aware = aware
        self.group = group
        self._took: Dict[int, float] = {}  # per slot: seconds its latest chunk took, read to result (no replica build)
        self._settings_steps = rounds.settings.epoch_steps

    def _chunks_left(self, chunk: int, rounds: List[Tuple[int, int]], rounds_done: int) -> int:
        """Chunks of the epoch not yet started, from ``chunk`` on (the rounds not yet planned at the latest ``k``)."""
        n = self.rounds.settings.num_workers
        planned = (rounds_done + len(rounds)) * n - chunk
        start, k = rounds[-1]
        return planned + n * -(-(self._settings_steps - start - k) // k)

    def _worth_starting(self, slot: int, left: int) -> bool:
        """Whether ``slot`` should take the next chunk, with ``left`` chunks to go in the epoch.

        At an epoch's end a slow slot that takes one of the last chunks holds the whole epoch back: it does not when the
        other slots, at their measured pace, would train every chunk left before it trained its one. The pace is each
        slot's latest chunk that built no replica; a slot passed over is tried again as its estimate decays. Not with
        ``staleness=0``, whose chunks must all read the state after their previous round.
        """
        took = self._took.get(slot)
        others = [self._took.get(o) for o in range(self.rounds.settings.num_workers) if o != slot]
        if took is None or not others or any(t is None for t in others):
            return True
        if took <= left / sum(1.0 / t for t in others):
            return True
        self._took[slot] = 0.8 * took  # a slot passed over is tried again once it might have recovered
        return False

    def run_epoch(self, epoch: int, logs: Dict[str, float], rounds_done: int, steps_before: int,
                  epoch_result: Optional[PartialResult], hooks: EpochHooks) -> Tuple[Dict[str, float], int]:
        """Trains ``epoch`` from round ``rounds_done`` (``steps_before`` minibatches in); returns its logs and rounds."""
        chunks = _ChunkScheduler(self, epoch, logs, rounds_done, steps_before, epoch_result, hooks)
        pool = ThreadPoolExecutor(self.rounds.settings.num_workers, thread_name_prefix="sparkdl_avg-chunk")
        try:
            return chunks.run(pool)
        finally:
            pool.shutdown(wait=True)

    def _end_block(self, updater: StaleUpdater, learning_rate: float) -> float:
        """Ends a block and sets the model's state; returns the learning rate at the next block's start."""
        return self.rounds.set_global_state(updater.end_block(learning_rate), updater.optimizer())

    def _train(self, epoch: int, steps_before: int, info: _InFlight):
        """A slot's thread: one chunk's job; returns ``(result, state published at, job done at)``."""
        return self.rounds.run_chunk(epoch, info.round, info.part, info.slot, steps_before, info.steps, info.sent,
                                     info.optimizer, self.group)


class _ChunkScheduler:
    """One epoch of chunks (:meth:`StaleRunner.run_epoch`): which chunk a free slot takes, and the updates.

    :meth:`run` repeats three steps until no chunk is left to start or running: :meth:`start_chunks` gives free slots
    the next chunks as far as the bound, the epoch and the slots' pace allow; :meth:`collect` takes the chunks that
    returned; :meth:`apply_arrived` applies their updates (:meth:`apply`: the update, the record, a block's end).
    """

    def __init__(self, runner: StaleRunner, epoch: int, logs: Dict[str, float], rounds_done: int, steps_before: int,
                 epoch_result: Optional[PartialResult], hooks: EpochHooks) -> None:
        s = runner.rounds.settings
        self.runner, self.epoch, self.hooks = runner, epoch, hooks
        self.bound, self.reproducible = runner.bound, runner.reproducible
        self.n = n = s.num_workers
        start = runner.rounds.chunk_start()
        self.updater = StaleUpdater(start.weights, start.optimizer, start.rule, start.rule_state, start.trainable, n,
                                    start.iterations, s.average_optimizer, runner.aware)
        self.learning_rate = start.learning_rate
        self.logs, self.epoch_result = logs, epoch_result
        self.first, self.steps_before = rounds_done, steps_before  # where this epoch's chunks start
        self.rounds: List[Tuple[int, int]] = []  # (steps_before, steps) of the rounds from rounds_done on
        self.complete = rounds_done  # rounds before this one are wholly applied
        self.applied: Counter = Counter()  # per round: its chunks applied
        self.inflight: Dict[Any, _InFlight] = {}
        self.free = list(range(n))  # idle slots
        self.chunk, self.blocks = rounds_done * n, rounds_done  # the next chunk's index in the epoch; blocks: Keras batches
        self.stop = False
        self.error: Optional[BaseException] = None
        self.arrived: Dict[int, tuple] = {}  # chunk index -> (info, result, t1, t2), returned but not yet applied
        self.committed = self.chunk  # reproducible: the next chunk to apply
        self.snapshots = {rounds_done: self.updater.read()} if self.reproducible else {}  # rounds applied -> state read
        self.snapshot_logs = {rounds_done: dict(logs)}  # rounds applied -> the epoch's logs then

    def run(self, pool: ThreadPoolExecutor) -> Tuple[Dict[str, float], int]:
        """Trains the epoch's chunks on ``pool``'s threads; returns the epoch's logs and its rounds wholly applied."""
        while True:
            self.start_chunks(pool)
            if not self.inflight:
                break
            done, _ = wait(list(self.inflight), return_when=FIRST_COMPLETED)
            self.collect(done)
            self.apply_arrived()
        if self.error is not None:
            raise self.error
        if self.updater.in_block:  # a stop left a block short
            self.runner._end_block(self.updater, self.learning_rate)
            self.hooks.block_end(self.blocks, self.logs)
        return self.logs, self.complete

    def start_chunks(self, pool: ThreadPoolExecutor) -> None:
        """Gives free slots the next chunks, fastest slot first, while the bound and the epoch allow."""
        while self.free and not self.stop and self.error is None:
            r = self.chunk // self.n
            # The bound first: a schedule asked for round r's k sees the logs of every round before r - s.
            if self.bound is not None and self.complete < r - self.bound:
                break
            if r - self.first == len(self.rounds) and not self._plan_round(r):
                break
            self.free.sort(key=lambda o: self.runner._took.get(o, 0.0))  # the fastest free slot first
            # Not at staleness 0: a chunk started later would read another round's updates, and
            # staleness 0 must read the state after its previous round, as synchronous training does
            # (reproducible chunks read a round's snapshot, whenever they start).
            if (self.inflight and (self.bound != 0 or self.reproducible)
                    and not self.runner._worth_starting(
                        self.free[0], self.runner._chunks_left(self.chunk, self.rounds, self.first))):
                break
            self._start_chunk(pool, r)

    def _plan_round(self, r: int) -> bool:
        """Asks the schedule for round ``r``'s ``k``; ``False``: the epoch has no minibatch left for it."""
        start = self.rounds[-1][0] + self.rounds[-1][1] if self.rounds else self.steps_before
        if start >= self.runner.rounds.settings.epoch_steps:
            return False
        # reproducible: the logs of the state its chunks read, not of whatever has returned
        seen_logs = self.snapshot_logs[max(self.first, r - self.bound)] if self.reproducible else self.logs
        self.rounds.append((start, self.hooks.next_steps(r, start, seen_logs)))
        return True

    def _start_chunk(self, pool: ThreadPoolExecutor, r: int) -> None:
        """Starts the next chunk (of round ``r``) on the first free slot, with the state it may read."""
        if self.reproducible:  # the state after exactly the rounds before r - s
            seen = max(self.first, r - self.bound)
            sent, opt_read, version = self.snapshots[seen]
        else:
            seen = self.complete
            sent, opt_read, version = self.updater.read()
        start, steps = self.rounds[r - self.first]
        info = _InFlight(self.free.pop(0), r, self.chunk % self.n, self.chunk, steps, sent, opt_read, version, r - seen,
                         time.time())
        self.inflight[pool.submit(self.runner._train, self.epoch, start, info)] = info
        self.chunk += 1

    def collect(self, done) -> None:
        """Frees the slots of the chunks ``done`` and keeps their results; a failure is kept to raise at the end."""
        for future in sorted(done, key=lambda f: self.inflight[f].index):
            info = self.inflight.pop(future)
            self.free.append(info.slot)
            if self.error is not None or self.stop:
                continue  # after a failure or a stop, only wait for the chunks still running
            try:
                result, t1, t2 = future.result()
                if not any(w.replica_built for w in result.workers):  # a build is past once done
                    self.runner._took[info.slot] = t2 - info.t_read
                check_finite(result, f"epoch {self.epoch}, round {info.round}",
                             self.runner.rounds.settings.on_nonfinite, whole=False)
            except BaseException as exc:  # re-raised once every running chunk has returned
                self.error = exc
                continue
            self.arrived[info.index] = (info, result, t1, t2)

    def apply_arrived(self) -> None:
        """Applies the returned chunks in arrival order; reproducible: in chunk order, a chunk waiting for those before it."""
        while self.arrived and self.error is None and not self.stop:
            index = self.committed if self.reproducible else min(self.arrived)
            if index not in self.arrived:
                break
            info, result, t1, t2 = self.arrived.pop(index)
            self.committed += 1
            self.apply(info, result, t1, t2)

    def apply(self, info: _InFlight, result: PartialResult, t1: float, t2: float) -> None:
        """Applies one chunk's update, records it and ends the block it fills (Keras' batch hooks)."""
        updater = self.updater
        if updater.in_block == 0:
            self.hooks.block_begin(self.blocks)
        scale, delay = updater.apply(result, info.sent, info.optimizer, info.version, info.steps)
        self.applied[info.round] += 1
        while self.applied[self.complete] == self.n:
            self.complete += 1
        self.epoch_result = merge(self.epoch_result, PartialResult(result.examples, metric_sums=result.metric_sums))
        self.logs = self.epoch_result.metric_means()
        record = self.runner.rounds.record_chunk(self.epoch, info.round, info.steps, result, info.t_read, t1, t2,
                                                chunk=info.index, slot=info.slot, staleness=info.staleness,
                                                delay=delay, scale=scale)
        self.hooks.chunk_end(record, self.logs, info.steps / self.n)
        if updater.block_full:
            self.learning_rate = self.runner._end_block(updater, self.learning_rate)
            self.stop = self.hooks.block_end(self.blocks, self.logs) or self.stop
            self.blocks += 1
        if self.reproducible and self.complete not in self.snapshots:  # in chunk order a round ends a block
            self._snapshot()

    def _snapshot(self) -> None:
        """Keeps the state after the rounds now complete for the chunks that will read it (reproducible)."""
        self.snapshots[self.complete], self.snapshot_logs[self.complete] = self.updater.read(), dict(self.logs)
        for m in [m for m in self.snapshots if m < self.chunk // self.n - self.bound]:
            del self.snapshots[m], self.snapshot_logs[m]  # no chunk still to start reads it
