"""One standing job for a fit's Spark SQL rounds: its tasks, its thread and its idle timer.

Under Spark Connect the server analyses, optimises and plans every job it
is sent, and its Python tasks start and end through Spark SQL's Python
runner: most of what a Connect round costs beyond a classic one
(docs/benchmarks.md, "Spark Connect round overhead, one job for the
rounds"). :class:`StandingRounds` keeps one job whose ``N`` tasks train
round after round: the driver announces each round (its state and task) in
a file and the tasks answer in files (:mod:`sparkdl_avg.shared.wire.standing`,
:func:`~sparkdl_avg.executor.arrow_entries.run_standing_rounds`). The job is
planned once, its tasks start once, and a round costs what its files cost.
Executors on hosts of their own, which do not see the driver's files, are
given its socket instead (``network``:
:class:`~sparkdl_avg.shared.wire.standing_net.RoundServer`), where a round's
state travels in its word and the sums in the answers; there a job's first
round's state goes out as a Spark broadcast in the job's closure
(:meth:`StandingJob.opening`), which reaches the executors without crossing
the driver's link once per worker.
It is stopped (its tasks end) when a round comes that it cannot run, when
no round comes within :data:`STANDING_IDLE_S` of the last one's end (a
callback's or an evaluation's job then finds the executor slots free), at
an evaluation and at the fit's end; the next round starts a new one.
:class:`~sparkdl_avg.driver.transport.sql.SqlTransport` decides which
rounds may run in it (the trainer's ``standing_rounds``: ``"off"``, none).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from ...executor.arrow_entries import run_standing_rounds
from ...shared.files.fs import join, make_dir, resolve
from ...shared.wire import exchange, round_rows, standing, standing_net
from .base import remove_quietly

logger = logging.getLogger("sparkdl_avg")

#: Seconds the standing round job waits, once a round has ended, for the next one. Past that it is stopped and
#: its tasks free their executor slots (a callback's or an evaluation's job may need them); the next round
#: starts a new one, which costs one job's planning, little against the second the driver spent
#: between the two rounds.
STANDING_IDLE_S = 1.0

#: Seconds a task of the standing round job waits for the driver's next word before it ends (a driver that has gone).
STANDING_DEADLINE_S = 300.0

#: Seconds the fit's end waits for the stopped standing job to end (its tasks see the stop at once).
STANDING_CLOSE_S = 30.0


def driver_address(engine) -> Tuple[str, Optional[str]]:
    """``(host, bind address)``: where the session's executors reach the driver (``spark.driver.host``) and where
    it listens (``spark.driver.bindAddress``, ``None``: the host)."""
    conf = engine.spark.sparkContext.getConf()
    return conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress", None)


class StandingRounds:
    """The standing job of one transport, while it runs: started, kept, handed to a round, stopped (thread-safe).

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        directory: The fit's exchange directory; each job gets a directory of its own under it.
        network: The jobs' words and answers go through the driver's socket (executors on other hosts),
            not files in their directories.
    """

    def __init__(self, engine, directory: str, network: bool = False) -> None:
        self.engine, self.directory, self.network = engine, directory, network
        self._job: Optional[StandingJob] = None  # the standing job, while it runs
        self._lock = threading.Lock()  # guards _job against its idle timer
        self._jobs = 0  # standing jobs started: their directories' names

    def job_for(self, workers: Sequence[int], labels: Optional[Callable[[], Any]], usable: bool,
                places: Optional[Sequence[Optional[str]]] = None) -> Optional["StandingJob"]:
        """The standing job to run a round on ``workers`` in (started if need be), or ``None``: a job of its own.

        ``usable``: whether this round may run in a standing job; ``places``: the host each worker's task of a
        new job should run on (:meth:`~sparkdl_avg.driver.runtime.session.Engine.run_tasks`). A job that
        is started stays reachable until it is stopped: :meth:`stop` stops it
        whatever interrupts the fit.
        """
        with self._lock:
            job = self._job
            if job is not None:
                job.keep()
                if usable and job.workers == list(workers) and not job.ended():
                    job.busy = True
                    return job
                self._job = None
        if job is not None:
            job.stop()
        if not usable:
            return None
        self._jobs += 1
        job = StandingJob(self.engine, join(self.directory, f"standing-{self._jobs}"), workers, labels, places,
                          self.network)
        job.busy = True
        with self._lock:
            self._job = job
        return job

    def idle(self) -> None:
        """A round has ended: stops the standing job if no round comes within :data:`STANDING_IDLE_S` from now."""
        with self._lock:
            job = self._job
            if job is not None:
                job.busy = False
                job.stop_after(STANDING_IDLE_S, self._expire)

    def _expire(self, job: "StandingJob") -> None:
        with self._lock:
            if self._job is not job or job.busy:  # a round took it meanwhile
                return
            self._job = None
        logger.debug("stopping the standing round job: no round within %.1f s", STANDING_IDLE_S)
        job.stop()

    def stop(self, wait_s: float = 0.0) -> None:
        """Stops the standing job, if any; waits up to ``wait_s`` seconds for it to end."""
        with self._lock:
            job, self._job = self._job, None
        if job is not None:
            job.keep()
            job.stop(wait_s)


class StandingJob:
    """One standing round job: its directory, tasks and thread.

    The job is submitted (in a thread of its own, where ``toArrow`` waits
    for it to end) at its first :meth:`announce`. Its words and answers are
    files in ``directory`` (local), or with ``network`` kept by a
    :class:`~sparkdl_avg.shared.wire.standing_net.RoundServer` on the
    driver's address as the executors know it.
    """

    def __init__(self, engine, directory: str, workers: Sequence[int], labels: Callable[[], Any],
                 places: Optional[Sequence[Optional[str]]] = None, network: bool = False) -> None:
        self.engine = engine
        self.directory = directory
        self.workers = list(workers)
        self.labels = labels
        self.places = places
        self.network = network
        if network:
            self.post = standing_net.RoundServer(*driver_address(engine))
        else:
            self.post = standing.FilePost(resolve(directory)[1])
        self.seq = -1  # the latest round announced
        self.future: concurrent.futures.Future = concurrent.futures.Future()  # the job's end (_run)
        self.thread: Optional[threading.Thread] = None
        self.timer: Optional[threading.Timer] = None
        self.busy = False  # a round runs in it (guarded by StandingRounds' lock)
        self.stopped = False
        self.removed = threading.Event()  # its post closed and its directory removed (_remove)
        self._opening: Optional[exchange.BroadcastState] = None  # its first round's state, in its closure (network)
        make_dir(directory)

    def opening(self, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]) -> bool:
        """Whether this job's first round takes ``(weights, optimizer)`` from a Spark broadcast in the job's closure
        (``True``: its word then carries :data:`~sparkdl_avg.shared.wire.standing.OPENING` in place of the arrays).

        Through the driver's socket each task reads the round's state from the driver's one link, so ``N`` workers
        wait for ``N`` copies, and a fit's first round, which nothing overlaps, starts its workers' own optimizer
        states from the driver's variables, ``N`` copies more: 2.1-3.3 s of its 7.1-8.8 s with 3 workers at
        100 Mbit/s (docs/benchmarks/overlap_fits.md). So the round asked before the job is submitted (its first,
        on hosts of their own, classic sessions) puts its state in a broadcast that the job's closure carries, as a
        round of its own would: Spark's torrent, the executors fetching its blocks from the driver and from each
        other. The later rounds' words carry their state as before (their optimizer variables differ from the first
        round's, if only in the step count). The broadcast is destroyed when the job has ended.
        """
        if not self.network or self.engine.sc is None or self.thread is not None:
            return False  # files on one host; Spark Connect has no broadcasts; the job's closure is already sent
        if self._opening is None:
            weights = [np.asarray(w) for w in weights]
            optimizer = None if optimizer is None else [np.asarray(v) for v in optimizer]
            self._opening = exchange.BroadcastState(self.engine.broadcast((weights, optimizer)))
        return True

    def announce(self, entry, task, keep_from: Optional[int] = None) -> int:
        """Has the tasks train ``task`` with ``entry`` (the job starts at the first); returns the round's number.

        ``keep_from``: see :func:`sparkdl_avg.shared.wire.standing.announce` (a round announced ahead).
        """
        word = standing.go(entry, task)
        self.seq += 1
        self.post.announce(self.seq, word, keep_from)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="sparkdl_avg-standing-job", daemon=True)
            self.thread.start()
        return self.seq

    def _run(self) -> None:
        body = partial(run_standing_rounds, self.post.board(), STANDING_DEADLINE_S, opening=self._opening)
        try:
            with self.labels():
                self.engine.run_tasks(len(self.workers), body, round_rows.ROUND_SCHEMA,
                                      start=self.workers[0], places=self.places).toArrow()
        except BaseException as exc:  # noqa: BLE001 - the round that waits for it raises it
            self.future.set_exception(exc)
        else:
            self.future.set_result(None)

    def answers(self, seq: int):
        """The workers' rows of round ``seq`` once all have answered; ``None`` if the job ended without them.

        Raises what the job raised (a worker's error, an interrupt).
        """
        delay = 0.0002
        while True:
            batches = self.post.collect(seq, self.workers)
            if batches is not None:
                return batches
            if self.future.done():
                self.future.result()  # the job's error
                return self.post.collect(seq, self.workers)  # answered just before it ended, or not
            time.sleep(delay)
            delay = min(2 * delay, 0.002)  # a stat per worker costs microseconds; this is the round's latency

    def ended(self) -> bool:
        """Whether the job has ended (an error, or its tasks' deadline)."""
        return self.future.done()

    def stop_after(self, seconds: float, expire: Callable[["StandingJob"], None]) -> None:
        """Calls ``expire(self)`` in ``seconds`` unless :meth:`keep` comes first."""
        self.timer = threading.Timer(seconds, expire, (self,))
        self.timer.daemon = True
        self.timer.start()

    def keep(self) -> None:
        """Cancels :meth:`stop_after`."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def stop(self, wait_s: float = 0.0) -> None:
        """Tells the tasks to end; the directory goes when the job has ended. Waits up to ``wait_s`` seconds for it."""
        if self.stopped:
            return
        self.stopped = True
        if self.thread is None or self.thread.ident is None:  # never submitted
            self._remove()
            return
        try:
            self.post.stop()
        except OSError as exc:  # its tasks then end at their deadline
            logger.warning("Could not stop the standing round job under %s: %s", self.directory, exc)
        self.future.add_done_callback(lambda _: self._remove())
        if wait_s > 0:  # until its directory is gone, not only its job: the caller may remove the tree above it
            self.removed.wait(wait_s)

    def _remove(self) -> None:
        """The job's post closed and its directory removed (once its tasks have ended)."""
        try:
            self.post.close()
            remove_quietly(self.directory)
            if self._opening is not None:
                self._opening.broadcast.destroy(blocking=False)
        finally:
            self.removed.set()
