"""``optimizer_state="local"``'s files on a worker's host (shared/wire/local_state.py): what attempts of a round read and keep.

Each test forces an interleaving of task attempts by calling the executors'
half directly, in the order a loaded cluster can run them; no Spark.
"""

import os
import shutil

import numpy as np
import pytest

from sparkdl_avg.shared.wire.local_state import FIT_ALIVE, HOST_IDLE_S, HOST_TTL_S, LocalStateFiles, host_directory

TEMPLATE = [np.zeros(3), np.zeros((), np.int64)]  # a worker's optimizer variables: a moment and a step counter


def state(value):
    return [np.full(3, float(value)), np.asarray(value, np.int64)]


@pytest.fixture
def directory(tmp_path):
    """A fit's directory of these files; its directory on this host is deleted afterwards."""
    path = str(tmp_path / "exchange-1" / "local")
    yield path
    shutil.rmtree(host_directory(path), ignore_errors=True)


def round_files(directory, g):
    """Round ``g``'s files (``g`` reads ``g - 1``'s), kept on the host as on classic sessions."""
    return LocalStateFiles(directory, None if g == 0 else f"g{g - 1}", f"g{g}", host_local=True)


def loaded(files, worker=0):
    own, restarted = files.load(worker, TEMPLATE)
    return (None if own is None else int(own[1])), restarted


def test_an_attempt_that_outlived_its_round_keeps_the_rounds_state(directory):
    """A speculative copy of round 1's task, or one on an executor Spark gave up on, reads its state late: round 1's
    other attempt saved, round 2 read that and saved (pruning round 0's), and only then the late attempt finds round
    0's state gone and restarts. Its save must not replace round 1's state, which a retry of round 2 reads again."""
    round_files(directory, 0).save(0, state(1))
    assert loaded(round_files(directory, 1)) == (1, False)
    round_files(directory, 1).save(0, state(2))  # the attempt whose result the round used
    assert loaded(round_files(directory, 2)) == (2, False)
    round_files(directory, 2).save(0, state(3))
    late = round_files(directory, 1)
    assert loaded(late) == (None, True)  # round 0's state is gone: it would restart from the sent variables
    late.save(0, state(99))
    assert loaded(round_files(directory, 2)) == (2, False)  # a retry of round 2 continues as round 2 did
    assert sorted(os.listdir(host_directory(directory))) == [".fit", "g1-w0.bin", "g2-w0.bin"]


def test_a_retry_while_its_round_is_on_rewrites_the_rounds_state(directory):
    """The first attempt of round 1 saved and failed; the retry reads round 0's state again and writes the same."""
    round_files(directory, 0).save(0, state(1))
    round_files(directory, 1).save(0, state(2))  # the failed attempt's
    retry = round_files(directory, 1)
    assert loaded(retry) == (1, False)
    retry.save(0, state(5))  # (a different value only to see that it is written)
    assert loaded(round_files(directory, 2)) == (5, False)


def test_a_worker_on_a_host_without_its_state_restarts_and_keeps_its_new_one(directory):
    """The worker's host went between rounds 1 and 2: round 2's task elsewhere restarts, and writes its state."""
    round_files(directory, 0).save(0, state(1))
    round_files(directory, 1).save(0, state(2))
    shutil.rmtree(host_directory(directory))
    moved = round_files(directory, 2)
    assert loaded(moved) == (None, True)
    moved.save(0, state(7))
    assert loaded(round_files(directory, 3)) == (7, False)
    again = round_files(directory, 2)  # a retry of that round there, restarting likewise
    assert loaded(again) == (None, True)
    again.save(0, state(7))
    assert loaded(round_files(directory, 3)) == (7, False)


def test_each_user_has_a_folder_of_their_own_on_a_host(monkeypatch):
    import tempfile

    paths = {}
    for uid in (1000, 1001):
        monkeypatch.setattr(os, "getuid", lambda uid=uid: uid)
        paths[uid] = host_directory("/shared/exchange-1/local")
    assert paths[1000] == os.path.join(tempfile.gettempdir(), "sparkdl_avg-local-state-1000",
                                       os.path.basename(paths[1000]))
    assert os.path.dirname(paths[1001]).endswith("sparkdl_avg-local-state-1001")
    assert os.path.basename(paths[1000]) == os.path.basename(paths[1001])  # the fit's key, the same for both


def test_another_fits_folder_on_a_host_goes_once_its_fit_is_gone_not_once_it_is_old(tmp_path):
    """A fit whose rounds take longer than any age limit keeps its states; a fit that has ended leaves nothing."""
    import time

    def fit_directory(name):  # a running fit's shared directory: the driver's ledger wrote FIT_ALIVE there
        path = str(tmp_path / name / "exchange-1" / "local")
        os.makedirs(path)
        open(os.path.join(path, FIT_ALIVE), "wb").close()
        return path

    def age(path, seconds):
        then = time.time() - seconds
        os.utime(host_directory(path), (then, then))

    slow, other, old = fit_directory("slow"), fit_directory("other"), str(tmp_path / "old" / "exchange-1" / "local")
    try:
        round_files(slow, 0).save(0, state(1))
        age(slow, 2 * HOST_TTL_S)  # no round of the slow fit for two hours: it is still on
        round_files(other, 0).save(0, state(5))  # another fit's task on this host sweeps
        assert loaded(round_files(slow, 1)) == (1, False)
        assert time.time() - os.stat(host_directory(slow)).st_mtime < HOST_IDLE_S  # asked: not again for a while

        shutil.rmtree(tmp_path / "slow")  # the slow fit ends: its shared directory goes with it
        round_files(other, 1).save(0, state(6))
        assert os.path.exists(host_directory(slow))  # touched just now (by the check): not asked yet
        age(slow, HOST_IDLE_S + 1)
        round_files(other, 2).save(0, state(7))
        assert not os.path.exists(host_directory(slow))

        # a folder written before the marks (no .fit in it): by its age, as before
        os.makedirs(host_directory(old))
        age(old, HOST_TTL_S - 60)
        round_files(other, 3).save(0, state(8))
        assert os.path.exists(host_directory(old))
        age(old, HOST_TTL_S + 60)
        round_files(other, 4).save(0, state(9))
        assert not os.path.exists(host_directory(old))
        assert loaded(round_files(other, 5)) == (9, False)
    finally:
        for path in (slow, other, old):
            shutil.rmtree(host_directory(path), ignore_errors=True)
