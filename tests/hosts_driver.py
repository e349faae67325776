"""A driver program for tests/runtime/test_hosts.py: runs on host 0 of the namespaced cluster (scripts/hosts.py).

``python tests/hosts_driver.py --session MASTER_OR_SC_URL --store s3://bucket/prefix --out result.json
SCENARIO ... [--then --session ... SCENARIO ...]`` builds a classic session (``spark://...``, ``local[3]``) or a
Spark Connect one (``sc://...``) with the README's settings, runs the named
scenarios on scikit-learn's digits and writes what each produced (weights
digests, metrics, error messages) as JSON, so the test compares a cluster
run with a ``local[3]`` one. Scenarios:

- ``default_staging``: a fit with the default staging directory; records the error.
- ``fit``: a fit (2 epochs) staged on the store with checkpoints there (its
  round records' host names too), then ``evaluate`` and ``predict``; then a
  new trainer resumes that fit's checkpoint of epoch 2 to epoch 3 (the epochs it trained: ``resumed_epochs``).
- ``whole``: 3 epochs at once (what the resumed fit must equal).
- ``stale``: ``synchronization="stale"``, ``reproducible=True``.
- ``local``: ``optimizer_state="local"`` (issue 40); ``overlap``: the same with ``overlap_rounds=True`` (issue
  50), on ``local[3]`` with one Spark job per round (``state_transport="files"``), the reference; records each
  round's path and whether it was announced ahead.
- ``kill``: the ``fit`` scenario's first fit while host 2's processes are
  killed during round 2 (:meth:`hosts.Cluster.kill_host`).
- ``store_blip``: the same fit through the store (``aggregation="storage"``) with the store's link down
  for 2 s during round 2.
- ``elastic``: an elastic fit (``min_workers=1``, ``max_workers=3``, the
  ``fit`` scenario's settings but Adam's learning rate 0.01, so that two
  epochs reach a held-out accuracy worth comparing) during which host 3 is
  removed for good after round 0 of epoch 0 (once Spark reports its
  executor lost) and a host added after round 2 (the callback waits until
  its executor takes tasks); records the membership changes, each round's
  positions and examples, the held-out accuracy (and a fixed 3-worker
  fit's, classic only), and the weights digest of a fit that replays the membership
  (``ScriptedSlots.replay``). Leaves hosts 1-3 (the added host takes the
  removed one's index).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

WORKERS = 3


def session(url: str):
    from pyspark.sql import SparkSession

    import sparkdl_avg

    builder = SparkSession.builder.remote(url) if url.startswith("sc://") else SparkSession.builder.master(url)
    if not url.startswith("sc://"):
        builder = (builder.config(map=sparkdl_avg.RECOMMENDED_CONF)
                   .config("spark.executor.memory", "512m").config("spark.driver.memory", "1g")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                   .config("spark.task.maxFailures", "4").config("spark.sql.shuffle.partitions", "3"))
    spark = builder.appName("sparkdl_avg-hosts-test").getOrCreate()
    if not url.startswith("sc://"):
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def digits(spark):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    rows = [(i, row.tolist(), int(label)) for i, (row, label) in enumerate(zip(x, y))]
    schema = "id long, features array<float>, label int"

    # Partitioned by id and sorted in each partition: the same partitions whatever the cluster's
    # parallelism (createDataFrame slices a list by it), so every session stages the same files.
    def frame(part):
        return spark.createDataFrame(part, schema).repartition(WORKERS, "id").sortWithinPartitions("id").drop("id")

    return frame(rows[:1500]), frame(rows[1500:])


def model():
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
    m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def digest(m) -> str:
    import numpy as np

    h = hashlib.sha256()
    for w in m.get_weights() + [np.asarray(v) for v in m.optimizer.variables]:
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def trainer(m, staging, **options):
    from sparkdl_avg import ParameterAveragingTrainer

    return ParameterAveragingTrainer(m, num_workers=WORKERS, batch_size=32, averaging_frequency=4, seed=0, slow_warning=False,
                                     staging_dir=staging, **options)


class During:
    """A Keras callback that calls ``action`` ``delay`` seconds after round ``at`` of epoch 0 begins."""

    def __new__(cls, at: int, delay: float, action):
        import keras

        class _During(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.epoch, self.done = 0, None

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_begin(self, batch, logs=None):
                if self.epoch == 0 and batch == at and self.done is None:
                    self.done = threading.Timer(delay, action)
                    self.done.start()

        return _During()


def wait_until(predicate, timeout_s: float, what: str) -> float:
    """Polls ``predicate`` every 0.2 s; returns the seconds it took, raises after ``timeout_s``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def live_slots(spark, wanted: int) -> int:
    """The live task slots, up to ``wanted``, read as elastic rounds read them (status store, or a probe job)."""
    from sparkdl_avg.driver.elastic.membership import probe_task, status_slots

    if not is_connect(spark):
        return status_slots(spark.sparkContext).count
    rows = spark.range(0, wanted, numPartitions=wanted).mapInArrow(probe_task, "host string, pid long").collect()
    return len({(r.host, r.pid) for r in rows})


def spark_master(spark) -> str:
    """The classic session's master URL; ``""`` under Spark Connect."""
    return "" if is_connect(spark) else spark.sparkContext.master


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


LOSE_AFTER, JOIN_AFTER = 0, 2  # the rounds of epoch 0 after which host 3 is removed and a host added


def elastic(spark, df, store: str, out: dict) -> None:
    """The ``elastic`` scenario (see the module docstring); fills ``out``."""
    import keras
    from sklearn.datasets import load_digits

    import hosts
    from sparkdl_avg.driver.elastic.membership import PROBE_EVERY_S, ScriptedSlots

    cluster = hosts.Cluster.attach()
    out["hosts_before"] = [h.index for h in cluster.workers]

    class Changes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch != 0:
                return
            if batch == LOSE_AFTER:
                out["removed_at"] = time.time()
                t0 = time.monotonic()
                cluster.remove_host(3)  # from host 0: hosts.py runs it in the namespaces `up` ran in
                out["lost_seen_s"] = wait_until(lambda: live_slots(spark, WORKERS) == WORKERS - 1, 60,
                                                "the executor loss")
                # The next round then plans for two workers: Connect's probe result is kept PROBE_EVERY_S, so
                # one from before the removal would plan three (and the loss would show a round later, a
                # different membership and so different weights).
                time.sleep(max(0.0, PROBE_EVERY_S + 0.1 - (time.monotonic() - t0)) if is_connect(spark) else 0)
            elif batch == JOIN_AFTER:
                out["add_began"] = time.time()
                index = cluster.add_host()
                out["added"] = [str(index), f"{hosts.PREFIX}-h{index}"]
                out["registered_s"] = wait_until(lambda: live_slots(spark, WORKERS) == WORKERS, 90,
                                                 "executor of the added host")
                out["registered_at"] = time.time()

    def fast_model():
        m = model()
        m.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return m

    def fit(m, callbacks=(), elastic=True):
        options = dict(min_workers=1, max_workers=WORKERS) if elastic else {}
        with trainer(m, f"{store}/staging", **options) as t:
            t.fit(df, epochs=2, verbose=0, callbacks=list(callbacks))
            return t

    x, y = load_digits(return_X_y=True)

    def accuracy(m) -> float:
        return float(m.evaluate((x[1500:] / 16.0).astype("float32"), y[1500:], verbose=0, return_dict=True)["accuracy"])

    t0 = time.monotonic()
    m = fast_model()
    t = fit(m, [Changes()])
    out["fit_end"], out["fit_s"] = time.time(), time.monotonic() - t0
    out["membership"] = t.stats.membership
    out["rounds"] = [{"epoch": r.epoch, "round": r.round, "num_workers": r.num_workers, "start": r.start,
                      "examples": r.examples, "k": r.averaging_frequency, "t_start": r.t_start,
                      "wall_s": r.wall_s} for r in t.stats.records]
    out["accuracy"] = accuracy(m)
    out["digest"] = digest(m)
    out["hosts_after"] = [h.index for h in hosts.Cluster.attach().workers]
    replayed = fast_model()
    t0 = time.monotonic()
    with ScriptedSlots.replay(t.stats.membership):
        fit(replayed)
    out["replay_s"] = time.monotonic() - t0
    out["replayed_digest"] = digest(replayed)
    if not is_connect(spark):  # the same under Connect, bitwise (the fit scenario's digests show it): fit once
        fixed = fast_model()
        t0 = time.monotonic()
        fit(fixed, elastic=False)
        out["fixed_s"], out["fixed_accuracy"] = time.monotonic() - t0, accuracy(fixed)


def run(name: str, spark, df, test, store: str) -> dict:
    out: dict = {}
    if name == "elastic":
        elastic(spark, df, store, out)
        return out
    if name == "default_staging":
        t0 = time.monotonic()
        try:
            trainer(model(), None).fit(df, epochs=1, verbose=0)
            out["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test checks its type and message
            out["error"], out["type"] = str(exc), type(exc).__name__
        out["seconds"] = time.monotonic() - t0
        return out
    if name in ("fit", "kill", "store_blip"):
        callbacks = []
        if name != "fit":
            import hosts

            cluster = hosts.Cluster.attach()
            if name == "kill":
                def kill():
                    out["killed_at"] = time.time()
                    out["killed"] = cluster.kill_host(2)
                callbacks = [During(2, 0.3, kill)]
            else:
                def blip():
                    out["blip_at"] = time.time()
                    cluster.set_link(-1, False)
                    time.sleep(2.0)
                    cluster.set_link(-1, True)
                    out["blip"] = True
                callbacks = [During(2, 0.1, blip)]
        m = model()
        ckpt = f"{store}/{name}-ckpt"
        # The blip's rounds go through the store both ways (state out, sums to the storage reducers): the
        # same sums as the tree's, bitwise, so the clean fit's weights are what it must end with.
        options = dict(state_transport="sql", aggregation="storage") if name == "store_blip" else {}
        with trainer(m, f"{store}/{name}-staging", **options) as t:
            history = t.fit(df, epochs=2, verbose=0, callbacks=callbacks, checkpoint_dir=ckpt)
            out["fit_end"] = time.time()
            for cb in callbacks:
                if cb.done is not None:
                    cb.done.join()  # the action ran to its end (the store's link is up again)
            out["loss"] = history.history["loss"]
            out["digest"] = digest(m)
            out["longest_round_s"] = max(r.wall_s for r in t.stats.records)
            out["aggregations"] = sorted({r.aggregation or r.transport for r in t.stats.records})
            out["hosts"] = sorted({w.host for r in t.stats.records for w in r.workers})  # where the replicas ran
            if name == "fit":
                out["evaluate"] = t.evaluate(test, return_dict=True)
                rows = t.predict(test).select("prediction").collect()
                out["predictions"] = [float(r.prediction) for r in rows]
        if name == "fit":  # a new trainer resumes the fit's checkpoint of epoch 2 (on the store) to epoch 3
            resumed = model()
            with trainer(resumed, f"{store}/resume-staging") as t:
                t.fit(df, epochs=3, verbose=0, checkpoint_dir=ckpt, resume=True)
                out["resumed_epochs"] = sorted({r.epoch for r in t.stats.records})
            out["resumed_digest"] = digest(resumed)
        return out
    if name in ("local", "overlap"):  # issue 40: each worker's own Adam state; classic keeps it on the worker's host
        m = model()
        options = dict(optimizer_state="local")
        if name == "overlap":  # issue 50: on local[3] one Spark job per round, the reference
            options.update(overlap_rounds=True)
            if spark_master(spark).startswith("local"):
                options.update(state_transport="files")
        with trainer(m, f"{store}/staging", **options) as t:
            t.fit(df, epochs=2, verbose=0, checkpoint_dir=f"{store}/ckpt")  # epoch ends: states in the store too
            out["digest"] = digest(m)
            out["paths"] = sorted({f"{r.transport}/{r.aggregation}" for r in t.stats.records})
            out["announced_ahead"] = [r.announced_ahead for r in t.stats.records]
            out["restarted"] = t.stats.local_states_restarted
            hosts_of: dict = {}
            for r in t.stats.records:
                for w in r.workers:
                    hosts_of.setdefault(str(w.worker), []).append(w.host)
            out["worker_hosts"] = hosts_of
            out["local_state_s"] = sorted(w.local_state_s for r in t.stats.records[1:] for w in r.workers)
        return out
    if name == "whole":
        whole = model()
        with trainer(whole, f"{store}/staging") as t:
            t.fit(df, epochs=3, verbose=0)
        return {"digest": digest(whole)}
    if name == "stale":
        m = model()
        with trainer(m, f"{store}/stale-staging", synchronization="stale", staleness=1, reproducible=True) as t:
            out["loss"] = t.fit(df, epochs=2, verbose=0).history["loss"]
        out["digest"] = digest(m)
        return out
    raise SystemExit(f"unknown scenario {name!r}")


def main(argv=None) -> None:
    """Runs each ``--then``-separated group of arguments in turn, each on a session of its own in this one process
    (``--session local[3] ... --then --session spark://...``: one interpreter, TensorFlow import and JVM for both)."""
    argv = sys.argv[1:] if argv is None else argv
    groups = [[]]
    for arg in argv:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    p = argparse.ArgumentParser()
    p.add_argument("--session", required=True, help="spark://..., local[3] or sc://...")
    p.add_argument("--store", required=True, help="an s3:// prefix for staging and checkpoints")
    p.add_argument("--out", required=True)
    p.add_argument("scenarios", nargs="+")
    for args in [p.parse_args(group) for group in groups]:
        spark = session(args.session)
        df, test = digits(spark)
        results = {"session": args.session}
        for name in args.scenarios:
            t0 = time.monotonic()
            try:
                results[name] = run(name, spark, df, test, f"{args.store}/{name}")
            except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
                results[name] = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
            results[name]["wall_s"] = time.monotonic() - t0
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        spark.stop()


if __name__ == "__main__":
    main()
