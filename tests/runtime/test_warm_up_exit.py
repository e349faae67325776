"""Issue 48, part 2, defect 11: a script that ends while ``warm_up`` runs has its job cancelled quietly at exit.

Spark killed the warm-up's tasks as the JVM went down and printed their ERROR traces (114 lines after
a typo a few lines below ``warm_up``). The exit hook turns Spark's logging off and cancels the job group;
here with a stand-in for the session, whose calls the test records.
"""

from __future__ import annotations

import concurrent.futures

from sparkdl_avg.driver.runtime import session


class _Context:
    def __init__(self):
        self.calls = []

    def setLogLevel(self, level):  # noqa: N802 - SparkContext's name
        self.calls.append(("setLogLevel", level))

    def cancelJobGroup(self, group):  # noqa: N802
        self.calls.append(("cancelJobGroup", group))


class _Engine:
    def __init__(self, future):
        self.sc = _Context()
        self.future = future

    cancel_warm_up, cancel = session.Engine.cancel_warm_up, session.Engine.cancel


def test_a_running_warm_up_is_cancelled_with_sparks_logging_off_at_exit(monkeypatch):
    running, done = concurrent.futures.Future(), concurrent.futures.Future()
    done.set_result([1])
    live, finished = _Engine(running), _Engine(done)
    monkeypatch.setattr(session, "_warming", {id(running): live})
    monkeypatch.setattr(session, "_warm_ups", {"a": (0.0, running), "b": (0.0, done)})
    monkeypatch.setattr(session, "WARM_UP_EXIT_WAIT_S", 0.01)
    session._cancel_warm_ups()
    assert live.sc.calls == [("setLogLevel", "OFF"), ("cancelJobGroup", session.WARM_UP_GROUP)]
    assert finished.sc.calls == []  # a finished warm-up is left alone


def test_the_exit_hook_is_registered_once(monkeypatch):
    import atexit

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    session._cancel_at_exit.cache_clear()
    session._cancel_at_exit()
    session._cancel_at_exit()
    assert registered == [session._cancel_warm_ups]
    session._cancel_at_exit.cache_clear()
