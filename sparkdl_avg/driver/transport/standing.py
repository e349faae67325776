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
It is stopped (its tasks end) when a round comes that it cannot run, when
no round comes within :data:`STANDING_IDLE_S` of the last one's end (a
callback's or an evaluation's job then finds the executor slots free), at
an evaluation and at the fit's end; the next round starts a new one.
:class:`~sparkdl_avg.driver.transport.sql.SqlTransport` decides which
rounds may run in it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from functools import partial
from typing import Any, Callable, Optional, Sequence

from ...executor.arrow_entries import run_standing_rounds
from ...shared.files.fs import join, make_dir, resolve
from ...shared.wire import round_rows, standing
from .base import remove_quietly

logger = logging.getLogger("sparkdl_avg")

#: Whether Spark Connect rounds run in one standing job where they can (:class:`StandingRounds`): with a
#: local server and staging directory. ``False`` gives every round a job of its own (for comparisons).
STANDING = True

#: Seconds the standing round job waits, once a round has ended, for the next one. Past that it is stopped and
#: its tasks free their executor slots (a callback's or an evaluation's job may need them); the next round
#: starts a new one, which costs one job's planning (tens of milliseconds) against the second the driver spent
#: between the two rounds.
STANDING_IDLE_S = 1.0

#: Seconds a task of the standing round job waits for the driver's next word before it ends (a driver that has gone).
STANDING_DEADLINE_S = 300.0

#: Seconds the fit's end waits for the stopped standing job to end (its tasks see the stop at once).
STANDING_CLOSE_S = 30.0


class StandingRounds:
    """The standing job of one transport, while it runs: started, kept, handed to a round, stopped (thread-safe).

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        directory: The fit's exchange directory; each job gets a directory of its own under it.
    """

    def __init__(self, engine, directory: str) -> None:
        self.engine, self.directory = engine, directory
        self._job: Optional[StandingJob] = None  # the standing job, while it runs
        self._lock = threading.Lock()  # guards _job against its idle timer
        self._jobs = 0  # standing jobs started: their directories' names

    def job_for(self, workers: Sequence[int], labels: Optional[Callable[[], Any]], usable: bool) -> Optional["StandingJob"]:
        """The standing job to run a round on ``workers`` in (started if need be), or ``None``: a job of its own.

        ``usable``: whether this round may run in a standing job. A job that
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
        job = StandingJob(self.engine, join(self.directory, f"standing-{self._jobs}"), workers, labels)
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
    for it to end) at its first :meth:`announce`.
    """

    def __init__(self, engine, directory: str, workers: Sequence[int], labels: Callable[[], Any]) -> None:
        self.engine = engine
        self.directory = directory
        self.path = resolve(directory)[1]  # local
        self.workers = list(workers)
        self.labels = labels
        self.seq = -1  # the latest round announced
        self.future: concurrent.futures.Future = concurrent.futures.Future()  # the job's end (_run)
        self.thread: Optional[threading.Thread] = None
        self.timer: Optional[threading.Timer] = None
        self.busy = False  # a round runs in it (guarded by StandingRounds' lock)
        self.stopped = False
        make_dir(directory)

    def announce(self, entry, task, keep_from: Optional[int] = None) -> int:
        """Has the tasks train ``task`` with ``entry`` (the job starts at the first); returns the round's number.

        ``keep_from``: see :func:`sparkdl_avg.shared.wire.standing.announce` (a round announced ahead).
        """
        word = standing.go(entry, task)
        self.seq += 1
        standing.announce(self.path, self.seq, word, keep_from)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="sparkdl_avg-standing-job", daemon=True)
            self.thread.start()
        return self.seq

    def _run(self) -> None:
        body = partial(run_standing_rounds, self.path, STANDING_DEADLINE_S)
        try:
            with self.labels():
                self.engine.run_tasks(len(self.workers), body, round_rows.ROUND_SCHEMA,
                                      start=self.workers[0]).toArrow()
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
            batches = standing.collect(self.path, seq, self.workers)
            if batches is not None:
                return batches
            if self.future.done():
                self.future.result()  # the job's error
                return standing.collect(self.path, seq, self.workers)  # answered just before it ended, or not
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
            remove_quietly(self.directory)
            return
        try:
            standing.stop(self.path)
        except OSError as exc:  # its tasks then end at their deadline
            logger.warning("Could not stop the standing round job under %s: %s", self.directory, exc)
        self.future.add_done_callback(lambda _: remove_quietly(self.directory))
        if wait_s > 0:
            try:
                self.future.exception(timeout=wait_s)
            except concurrent.futures.TimeoutError:
                pass
