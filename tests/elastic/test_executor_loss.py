"""An executor JVM that dies mid-round on a real standalone cluster: Spark reruns its task, training finishes.

A master and two 1-core workers on 127.0.0.1 are started by
``scripts/cluster.sh up`` (in their own ``CLUSTER_DIR`` under the test's tmp
dir, so they never meet ``test_standalone``'s cluster) and always stopped.
The driver runs in this process (``master = spark://...``), executors run
the venv's interpreter and import the editable ``sparkdl_avg``.

The fault: in round 1 of epoch 0, the first attempt of the task of worker 0
writes a marker file, finds its executor JVM (the Python worker's parent is
the PySpark daemon, whose parent is ``CoarseGrainedExecutorBackend``) and
SIGKILLs it. The driver loses the executor, the standalone master launches a
new one on that worker, and the lost task runs again (attempt 1) elsewhere.
Because a worker's round result depends only on the broadcast state, the
data order and the seed, the final weights equal a clean run's.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import assert_weights_close, make_model, regression_data, spark_session
from sparkdl_avg import ParameterAveragingTrainer, testing
from sparkdl_avg.executor import worker as worker_module

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "cluster.sh")
N, B, K = 2, 8, 2
DATA = regression_data(N * B * K * 4, seed=5)  # 4 rounds per epoch
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two workers (1 core, 1 GiB each); always stopped."""
    directory = tmp_path_factory.mktemp("executor-loss") / "cluster"
    env = dict(os.environ, CLUSTER_DIR=str(directory), PYTHON=sys.executable)
    try:
        up = subprocess.run([SCRIPT, "up"], env=env, capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        yield up.stdout.strip().splitlines()[-1], directory
    finally:
        subprocess.run([SCRIPT, "down"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def spark(cluster):
    url, _ = cluster
    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "768m",
        "spark.task.maxFailures": "4",
    }
    with spark_session(url, "sparkdl_avg-executor-loss", **conf) as session:
        yield session


def executor_ids(sc):
    """The ids of the executors the driver knows now (the driver itself excluded)."""
    jvm = sc._jvm
    ids = jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc._jsc.sc().getExecutorIds())
    return {str(i) for i in ids}


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


@contextlib.contextmanager
def killing_an_executor_once(marker, hold_worker=False):
    """Inside, the first attempt of worker 0's task in round 1 of epoch 0 kills its executor JVM (``_kill_executor_once``).

    ``hold_worker``: the standalone Worker that ran the executor is stopped (SIGSTOP) before the kill, so no
    replacement registers until the test resumes it (:func:`resume_held_worker`); it is always resumed on the way out.
    """
    real = worker_module.run_round_partition
    try:
        with testing.RoundEntry(lambda task, it: _kill_executor_once(real, task, it, str(marker), hold_worker)):
            yield
    finally:
        resume_held_worker(marker)


def resume_held_worker(marker):
    """Resumes the standalone Worker that ``killing_an_executor_once(hold_worker=True)`` stopped, if any."""
    if not marker.exists():
        return
    pid = json.loads(marker.read_text()).get("held_worker_pid")
    if pid:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def trainer_for(model):
    return ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=K, seed=7)


def test_a_killed_executor_is_replaced_and_training_ends_with_a_clean_runs_weights(spark, cluster, tmp_path):
    _, cluster_dir = cluster
    sc = spark.sparkContext

    clean = make_model(seed=2)
    trainer_for(clean).fit(DATA, epochs=2, verbose=0)
    before = wait_for(lambda: executor_ids(sc) if len(executor_ids(sc)) == 2 else None, 60, "two executors")

    marker = tmp_path / "executor-killed.json"
    with killing_an_executor_once(marker):
        survivor = make_model(seed=2)
        trainer = trainer_for(survivor)
        start = time.time()
        history = trainer.fit(DATA, epochs=2, verbose=0)
        elapsed = time.time() - start

    # The fault happened: the first attempt of worker 0's task in epoch 0, round 1 killed its executor JVM.
    assert marker.exists(), "the injected task never ran"
    killed = json.loads(marker.read_text())
    assert killed["executor_id"] in before, (killed, before)
    assert EXECUTOR_CLASS in killed["cmdline"]

    # The driver lost that executor, and the master launched a replacement (a new, higher id).
    after = wait_for(lambda: executor_ids(sc) if len(executor_ids(sc) - before) >= 1 else None, 90, "a new executor")
    assert killed["executor_id"] not in after, (killed, after)
    new = after - before
    assert new and min(int(i) for i in new) > max(int(i) for i in before), (before, after)
    # The master and the worker saw it die of SIGKILL (exit code 137 = 128 + 9).
    logs = cluster_dir / "logs"
    master_log = (logs / "master.log").read_text()
    app = re.search(rf"Launching executor (app-[\w-]+)/{killed['executor_id']} on worker", master_log)
    assert app, master_log[-3000:]
    full_id = re.escape(f"{app.group(1)}/{killed['executor_id']}")
    assert re.search(rf"Removing executor {full_id} because it is EXITED", master_log), master_log[-3000:]
    worker_logs = "".join(p.read_text() for p in sorted(logs.glob("worker-*.log")))
    assert re.search(rf"Executor {full_id} finished with state EXITED message Command exited with code 137", worker_logs)

    # The round was rerun by another Python worker, and training went on to the end.
    records = trainer.stats.records
    assert [(r["epoch"], r["round"]) for r in records] == [(e, r) for e in range(2) for r in range(4)]
    round_1 = next(r for r in records if (r["epoch"], r["round"]) == (0, 1))
    worker_0 = next(w for w in round_1["workers"] if w["worker"] == 0)
    assert worker_0["pid"] != killed["python_pid"]
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()

    # The same weights as the clean run.
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(survivor.get_weights(), clean.get_weights()))
    print(f"fit with a killed executor: {elapsed:.1f} s; executors {sorted(before)} -> {sorted(after)}; "
          f"max |weight difference| from the clean run {diff:.3g}")
    assert_weights_close(survivor.get_weights(), clean.get_weights(), atol=1e-10)


def test_elastic_rounds_shrink_when_the_executor_is_lost_and_grow_when_its_replacement_registers(spark, tmp_path):
    """Issue 39 on a real standalone cluster: the lost executor's slot leaves the plan, its replacement joins it.

    Without elastic rounds a lost executor's tasks queue on the slots that are
    left until a replacement comes; here the round after the loss plans for
    the one slot that is live, and the first round after the master's
    replacement registers plans for two again. Every epoch still trains its
    examples once each, and replaying the recorded membership gives the same
    weights bitwise.
    """
    import keras

    from sparkdl_avg.driver.elastic.membership import ScriptedSlots

    sc = spark.sparkContext
    wait_for(lambda: len(executor_ids(sc)) == 2, 90, "two executors")

    class AwaitReplacement(keras.callbacks.Callback):
        """Once a round ran on fewer workers, lets the replacement come and waits for it (so the test sees it join).

        Until then the killed executor's standalone Worker is held (stopped): on a quiet machine it would otherwise
        launch the replacement before the next round is planned, and no round would ever see the slot lost.
        """

        def on_train_batch_end(self, batch, logs=None):
            reasons = [c["reason"] for c in trainer.stats.membership]
            if "slots lost" in reasons and "slots joined" not in reasons:
                resume_held_worker(marker)
                wait_for(lambda: len(executor_ids(sc)) == 2, 90, "the replacement executor")

    def elastic(model):
        return ParameterAveragingTrainer(model, batch_size=B, averaging_frequency=K, seed=7, min_workers=1,
                                         max_workers=N)

    marker = tmp_path / "executor-killed.json"
    with killing_an_executor_once(marker, hold_worker=True):
        model = make_model(seed=2)
        trainer = elastic(model)
        history = trainer.fit(DATA, epochs=3, verbose=0, callbacks=[AwaitReplacement()])
    assert marker.exists(), "the injected task never ran"

    changes = [(c["epoch"], c["round"], c["workers"], c["reason"]) for c in trainer.stats.membership]
    assert [c[2:] for c in changes] == [(2, "start"), (1, "slots lost"), (2, "slots joined")], changes
    assert changes[1][:2] == (0, 2), changes  # the first round after the one whose executor died
    records = trainer.stats.records
    num_examples = len(DATA[0])
    for epoch in range(3):  # each epoch's rounds take consecutive positions from 0, no overlap, no gap
        rounds = [r for r in records if r.epoch == epoch]
        ends = [r.start + r.num_workers * r.averaging_frequency * B for r in rounds]
        assert [r.start for r in rounds] == [0] + ends[:-1], [(r.start, r.num_workers) for r in rounds]
        assert num_examples - rounds[-1].num_workers * B < ends[-1] <= num_examples
        assert sum(r.examples for r in rounds) == ends[-1]
    assert np.isfinite(history.history["loss"]).all() and history.history["loss"][-1] < history.history["loss"][0]

    replayed = make_model(seed=2)
    with ScriptedSlots.replay(trainer.stats.membership):
        elastic(replayed).fit(DATA, epochs=3, verbose=0)
    assert_weights_close(replayed.get_weights(), model.get_weights(), atol=0)


def _parent(pid):
    """The parent process id of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # the 4th field, after "(comm)"


def _executor_jvm():
    """``(pid, cmdline)`` of the executor JVM above this Python worker (daemon → JVM)."""
    pid, seen = os.getpid(), []
    for _ in range(4):
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the 4th field, after "(comm)"
        if pid <= 1:
            break
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        seen.append((pid, cmdline[:200]))
        if EXECUTOR_CLASS in cmdline:
            return pid, cmdline
    raise RuntimeError(f"no {EXECUTOR_CLASS} among this Python worker's ancestors: {seen}")


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # zombie: dead, not yet reaped
    except FileNotFoundError:
        return True


def _kill_executor_once(real, task, iterator, marker, hold_worker=False):
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if (
        task.epoch == 0 and task.round == 1 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        and not os.path.exists(marker)
    ):
        list(iterator)
        jvm, cmdline = _executor_jvm()
        executor_id = re.search(r"--executor-id (\S+)", cmdline).group(1)
        held = None
        if hold_worker:  # the Worker JVM that launched this executor: stopped, it launches no replacement
            held = _parent(jvm)
            with open(f"/proc/{held}/cmdline", "rb") as f:
                assert b"org.apache.spark.deploy.worker.Worker" in f.read(), f"pid {held} is not the Worker"
            os.kill(held, signal.SIGSTOP)
        tmp = marker + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"python_pid": os.getpid(), "jvm_pid": jvm, "executor_id": executor_id, "cmdline": cmdline,
                       "held_worker_pid": held}, f)
        os.replace(tmp, marker)
        os.kill(jvm, signal.SIGKILL)
        deadline = time.time() + 20
        while not _gone(jvm) and time.time() < deadline:
            time.sleep(0.05)
        os._exit(1)  # the daemon and this worker lose their JVM anyway
    return real(task, iterator)
