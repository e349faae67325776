"""Ctrl-C during a fit: always a ``KeyboardInterrupt``, the fit's Spark jobs cancelled, no py4j noise.

A classic PySpark driver talks to its JVM over py4j sockets, one per Python thread, in request/answer pairs. A
``KeyboardInterrupt`` raised while the main thread waits for an answer (a round's Spark job runs for most of a fit)
breaks that pair: py4j logs ``KeyboardInterrupt while sending command`` with tracebacks at ``ERROR`` and shuts the
connection down, and PySpark's own SIGINT handler (``SparkContext``'s ``signal_handler``) calls ``cancelAllJobs`` on
the very connection that is waiting, which fails (``reentrant call``), so the job is not cancelled and keeps the
executors busy after the interrupt; sometimes the broken connection surfaces as a ``Py4JError`` (``Gateway must be
connected to send cancel cmd``) that would read as a ``WorkerError``.

:func:`guarded` (on ``fit``) and :func:`cancelling` (around its rounds, with the fit's job group) guard a fit on the
main thread while the SIGINT handler is Python's default or PySpark's. The guard's handler never calls py4j.
Interrupted outside a Spark call it raises ``KeyboardInterrupt`` as usual. Interrupted inside one (any py4j call; a
job under :func:`spark_call` once the group is known) it lets the call return instead, and the interrupt is raised as
``KeyboardInterrupt`` then (by :func:`spark_call`, or, for another py4j call, as soon as the main thread has left
py4j). Meanwhile a thread of its own gives the fit's jobs :data:`GRACE_S` to end by themselves (a round that ends
keeps its Python workers and their replicas), then cancels them (classic: the job group,
``SparkContext.cancelJobGroup``; Spark Connect: the tag, ``SparkSession.interruptTag``; a classic call before the fit
knows its group: every job, as PySpark's handler does), which makes the waiting call fail at once. A second Ctrl-C,
or a call still running :data:`FORCE_AFTER_S` seconds after the cancel, raises at once. Whatever the block raises
while an interrupt is pending, or an error caused by a ``KeyboardInterrupt`` (a ``Py4JError`` raised while py4j
handled one), leaves it as ``KeyboardInterrupt``. The executors' side of a cancel (killed tasks' workers) is
:func:`sparkdl_avg.daemon.quiet_when_killed`.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import logging
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, NoReturn, Optional, TypeVar

T = TypeVar("T")

logger = logging.getLogger("sparkdl_avg")

GRACE_S = 1.0
"""How long a job that a Ctrl-C interrupted may run on before it is cancelled.

A round that ends by then keeps its Python workers: a cancelled job's running tasks are killed, their workers with
them, and the next fit builds those replicas again (about a second each on a 2-core host)."""

FORCE_AFTER_S = 5.0
"""How long an interrupted Spark call may go on after its jobs were cancelled before the interrupt is raised in it."""

_POLL_S = 0.01

_guard: Optional["_Guard"] = None  # the guard of the fit running on the main thread


def caused_by_interrupt(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` is a ``KeyboardInterrupt`` or was raised while one was handled (its cause or context chain)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def cancel(engine, group: Optional[str], everything: bool = False) -> None:
    """Cancels the Spark jobs of ``group`` (classic: job group; Connect: tag); never raises.

    Without an engine or a group, only with ``everything``: every job of the classic SparkContext (as PySpark does).
    """
    try:
        if engine is not None and group is not None:
            engine.cancel(group)
        elif everything:
            from pyspark import SparkContext

            sc = SparkContext._active_spark_context
            if sc is not None:
                sc.cancelAllJobs()
    except BaseException as exc:  # noqa: BLE001 - the interrupt is what the user must see
        logger.debug("cancelling the Spark jobs of %s failed: %r", group, exc)


def _in_py4j(frame) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("py4j."):
            return True
        frame = frame.f_back
    return False


def _takes_over(handler: Any) -> bool:
    """Whether a guard may stand in for SIGINT ``handler``: Python's default, PySpark's (cancels, raises), a guard's."""
    return (
        handler is signal.default_int_handler
        or isinstance(getattr(handler, "__self__", None), _Guard)
        or (callable(handler) and str(getattr(handler, "__module__", "")).startswith("pyspark."))
    )


class _Guard:
    """The state of one guarded call (a fit); see the module's doc."""

    def __init__(self, engine, group: Optional[str]) -> None:
        self.engine = engine  # what to cancel: None until the fit knows its session and group
        self.group = group
        self.main = threading.main_thread().ident
        self.calls = 0  # Spark calls (spark_call) the main thread is in
        self.pending = False  # an interrupt arrived in a Spark call and was not raised yet
        self.synthetic = False  # the watcher sent the main thread a SIGINT to raise the pending interrupt
        self.closed = False
        self.lock = threading.Lock()  # the watcher's interrupt against close(); never taken by the handler
        self.watching = False

    def in_spark_call(self, frame) -> bool:
        """Whether the main thread (at ``frame``) waits in a call that an exception would break.

        Any py4j call; a job (:func:`spark_call`) once its group is known, so that cancelling it ends the wait. Not
        yet (a Connect session's call, or a classic one outside py4j), the interrupt is raised in it: Spark Connect's
        client then interrupts its operation itself.
        """
        return _in_py4j(frame) or (self.calls > 0 and self.group is not None)

    def handle(self, signum, frame) -> None:
        """The SIGINT handler (the main thread, between two bytecodes)."""
        if self.pending:  # the watcher's, or the user's second Ctrl-C: now
            self.pending = self.synthetic = False
            raise KeyboardInterrupt
        if self.synthetic:  # the watcher's, for an interrupt raised meanwhile
            self.synthetic = False
            return
        self.pending = self.in_spark_call(frame)  # before the watcher reads it
        if not self.watching:
            self.watching = True
            # Not threading.Thread: its start() takes a lock that the interrupted main thread may hold.
            _thread.start_new_thread(self.watch, (self.engine, self.group))
        if not self.pending:
            raise KeyboardInterrupt

    def watch(self, engine, group: Optional[str]) -> None:
        """Cancels the fit's jobs and sees that a pending interrupt is raised once the main thread's call returns.

        The jobs have :data:`GRACE_S` to end by themselves (or until the guard closes). Then a call the main thread
        still waits in has its jobs cancelled (before the fit knows its group: every job, as PySpark's handler does),
        and the pending interrupt is raised as soon as the main thread has left its call, or :data:`FORCE_AFTER_S`
        after the cancel, in the call.
        """
        try:
            self._watch(engine, group)
        finally:
            self.watching = False

    def _watch(self, engine, group: Optional[str]) -> None:
        start = time.monotonic()
        cancelled_at = None
        while not self.closed:
            now = time.monotonic()
            if now - start >= GRACE_S:
                if not self.pending:
                    break
                if cancelled_at is None:
                    cancel(engine, group, everything=True)
                    cancelled_at = time.monotonic()
            if self.pending:
                frame = sys._current_frames().get(self.main)
                if not self.in_spark_call(frame) or (cancelled_at is not None and now - cancelled_at > FORCE_AFTER_S):
                    with self.lock:
                        if self.pending and not self.closed:
                            self.synthetic = True
                            _thread.interrupt_main(signal.SIGINT)
                    break
            time.sleep(_POLL_S)
        if cancelled_at is None:
            cancel(engine, group)  # e.g. a stale fit's chunks, still running in threads of their own

    def close(self) -> None:
        """Stops the watcher; a SIGINT it sent is handled (ignored) before the caller restores the previous handler."""
        with self.lock:
            self.closed = True
        deadline = time.monotonic() + 1.0
        while self.synthetic and time.monotonic() < deadline:
            time.sleep(0.001)  # the main thread runs the pending handler between two bytecodes
        self.synthetic = False

    def take(self) -> bool:
        """Whether an interrupt was pending (it is not any more)."""
        pending, self.pending = self.pending, False
        return pending


def _leave(exc: BaseException, guard: Optional[_Guard], engine, group: Optional[str]) -> NoReturn:
    """Raises what a guarded block that raised ``exc`` raises: ``KeyboardInterrupt`` when an interrupt caused it."""
    if (guard is not None and guard.take()) or caused_by_interrupt(exc):
        cancel(engine, group)  # from here, not in a py4j call: also jobs started after the watcher's cancel
        if not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from None  # the error stays its __context__, out of the traceback
    raise exc


@contextlib.contextmanager
def cancelling(engine=None, group: Optional[str] = None) -> Iterator[None]:
    """Inside the block, a Ctrl-C cancels the Spark jobs of ``group`` and always raises ``KeyboardInterrupt``.

    See the module's doc. ``engine`` (:class:`~sparkdl_avg.driver.runtime.session.Engine`) and ``group`` may come
    later: a block nested in a guarded one (on the main thread) aims the outer guard at its own for its duration. On
    another thread than the main one, or while SIGINT has a handler of the user's (or none), only the last part holds:
    the block's errors that a ``KeyboardInterrupt`` caused leave it as one, and the group's jobs are cancelled then.
    """
    global _guard
    main = threading.current_thread() is threading.main_thread()
    outer = _guard if main else None
    if outer is not None:  # nested: the outer guard (its handler) cancels this block's group
        saved = (outer.engine, outer.group)
        outer.engine, outer.group = engine, group
        try:
            yield
        except BaseException as exc:
            _leave(exc, outer, engine, group)
        finally:
            outer.engine, outer.group = saved
        return
    guard = previous = None
    if main:
        previous = signal.getsignal(signal.SIGINT)
        if _takes_over(previous):
            guard = _Guard(engine, group)
            signal.signal(signal.SIGINT, guard.handle)
            _guard = guard
    try:
        yield
        if guard is not None and guard.take():
            raise KeyboardInterrupt
    except BaseException as exc:
        _leave(exc, guard, engine, group)
    finally:
        if guard is not None:
            _guard = None
            guard.close()
            signal.signal(signal.SIGINT, previous)


def guarded(method: Callable[..., T]) -> Callable[..., T]:
    """``method`` inside :func:`cancelling` (a fit: from its first Spark call, before it knows its group)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with cancelling():
            return method(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def spark_call() -> Iterator[None]:
    """Marks a blocking Spark call (a job) of the main thread: an interrupt in it is raised when it returns.

    The call returns (or fails, its jobs cancelled) and the block leaves with ``KeyboardInterrupt`` instead of its
    result or error. Elsewhere (another thread, no guarded fit) only errors a ``KeyboardInterrupt`` caused become one.
    """
    guard = _guard if threading.current_thread() is threading.main_thread() else None
    if guard is not None:
        guard.calls += 1
    try:
        yield
    except Exception as exc:
        if (guard is not None and guard.take()) or caused_by_interrupt(exc):
            raise KeyboardInterrupt from None  # the cancelled job's error stays its __context__
        raise
    finally:
        if guard is not None:
            guard.calls -= 1
    if guard is not None and guard.take():
        raise KeyboardInterrupt
