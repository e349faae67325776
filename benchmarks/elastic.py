"""Elastic rounds on the namespaced hosts cluster (issue 39): a worker host lost for good, and one that joins.

A classic session on scripts/hosts.py's cluster (host 0: the master and this
benchmark's driver; hosts 1..H-1: a 1-core worker each; no S3 store: the
data are staged on the shared disk, under the cluster's state directory).
Every arm fits scikit-learn's digits (1,500 training examples, the 64-32-10
MLP of tests/hosts_driver.py) with batch 8 and ``k = 2``; rounds are timed
by the driver's records (``wall_s``). Each repeat runs, in this order:

- ``elastic``: ``min_workers=1``, ``max_workers=W`` (``W = H - 1``). After
  round ``--lose-at`` a thread removes a worker host for good
  (``hosts.py remove``, a spot reclaim, while the next round runs); after
  round ``--join-at`` a thread adds one (``hosts.py add``). The rounds that
  start after Spark's status store shows the loss, and before it shows the
  added host's executor, run on ``W - 1`` workers; their median round time
  is the ``elastic`` figure. The join is timed from the status store
  showing the new executor to the first round with ``W`` workers, in
  rounds started since (1: the next round) and seconds.
- ``fixed``: elastic rounds off, ``num_workers=W`` on the ``W`` hosts (the
  joined one included); a host is removed after round ``--lose-at``; the
  rounds that start after the loss shows run ``W`` tasks on ``W - 1`` slots
  (today's behaviour).
- ``steady``: elastic rounds off, ``num_workers=W - 1`` on the ``W - 1``
  hosts left, for the baseline (its first round, with the fit's start-up,
  left out); then a host is added back for the next repeat (untimed).

A monitor thread reads the status store's live task slots every 50 ms (what
elastic rounds plan from) and records when they change. With ``--sleep S``
every worker sleeps ``S`` seconds per minibatch before training
(:class:`sparkdl_avg.testing.Sleeper`): all hosts share this machine's few
cores, and a sleep holds a task slot without them, standing for compute on
a host of its own, so that round times measure the scheduling (``W`` tasks
on ``W - 1`` slots take two waves) and not the shared cores. ``--sleep 0``
is the CPU-bound run. Usage (as root; the cluster comes up, and down at the
end, also on failure)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/elastic.py [--hosts 9] [--sleep 0.5] [--repeats 2]

Writes ``benchmarks/results/elastic.json`` (``--out``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

BATCH, K = 8, 2


# ---------------------------------------------------------------- on host 0 (the driver)


class Monitor:
    """Reads the status store's live task slots every 50 ms in a thread; keeps ``(time, slots)`` at each change."""

    def __init__(self, sc) -> None:
        from sparkdl_avg.driver.elastic.membership import status_slots

        self.read = lambda: status_slots(sc).count
        self.changes = [(time.time(), self.read())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            count = self.read()
            if count != self.changes[-1][1]:
                self.changes.append((time.time(), count))

    def first(self, after: float, predicate) -> float:
        """When the slots first met ``predicate`` after ``after`` (waits up to 120 s for it)."""
        deadline = time.time() + 120
        while time.time() < deadline:
            for at, count in self.changes:
                if at >= after and predicate(count):
                    return at
            time.sleep(0.05)
        raise TimeoutError(f"the live slots never changed as expected after {after}: {self.changes}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def hosts_py(cluster, *argv: str) -> str:
    """``hosts.py add`` or ``remove N`` on the running cluster, from host 0 (``Cluster`` runs it where ``up`` ran)."""
    if argv[0] == "add":
        return str(cluster.add_host())
    return " ".join(map(str, cluster.remove_host(int(argv[1]))))


def drive(args) -> None:
    import keras

    import hosts
    import hosts_driver
    from sparkdl_avg import ParameterAveragingTrainer, testing

    cluster = hosts.Cluster.attach()
    workers = len(cluster.workers)
    spark = hosts_driver.session(cluster.master_url)
    sc = spark.sparkContext
    sc.setLogLevel("WARN")  # the scheduler's lost executors and retried tasks, timestamped, in the driver's log
    df, _ = hosts_driver.digits(spark)
    staging = os.path.join(cluster.state_dir, "staging")
    monitor = Monitor(sc)
    t0 = time.time()
    while monitor.read() < workers and time.time() - t0 < 120:
        time.sleep(0.2)
    if args.sleep > 0:
        testing.Sleeper(args.sleep).__enter__()  # for every fit of this script, to its end
    results = {"hosts": len(cluster.hosts), "workers": workers, "sleep_s": args.sleep, "batch_size": BATCH, "k": K,
               "repeats": []}
    actions: list = []

    def in_thread(name: str, *argv: str) -> threading.Thread:
        def act():
            at = time.time()
            try:
                out = hosts_py(hosts.Cluster.attach(), *argv)
                actions.append({"what": name, "began": at, "done": time.time(), "out": out.strip()})
            except Exception as exc:  # noqa: BLE001 - reported in the results
                actions.append({"what": name, "began": at, "failed": str(exc)})
        thread = threading.Thread(target=act)
        thread.start()
        return thread

    def last_worker() -> str:
        return str(max(h.index for h in hosts.Cluster.attach().workers))

    def at_rounds(plan):
        """A callback that runs ``plan[r]()`` after the fit's ``r``-th round (counted over epochs)."""
        class At(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.rounds, self.threads = 0, []

            def on_train_batch_end(self, batch, logs=None):
                action = plan.get(self.rounds)
                if action is not None:
                    self.threads.append(action())
                self.rounds += 1
        return At()

    def fit(arm: str, epochs: int, callback=None, **options) -> list:
        m = hosts_driver.model()
        with ParameterAveragingTrainer(m, batch_size=BATCH, averaging_frequency=K, seed=0, slow_warning=False,
                                       staging_dir=staging, **options) as t:
            t.fit(df, epochs=epochs, verbose=0, callbacks=[callback] if callback else [])
            for thread in getattr(callback, "threads", []):
                thread.join()
            return [{"arm": arm, "epoch": r.epoch, "round": r.round, "num_workers": r.num_workers,
                     "t_start": r.t_start, "wall_s": r.wall_s, "job_s": r.job_s, "schedule_s": r.schedule_s,
                     "workers_s": r.workers_s, "aggregate_s": r.aggregate_s, "broadcast_s": r.broadcast_s,
                     "transport": r.transport, "aggregation": r.aggregation,
                     "hosts": sorted(w.host for w in r.workers)} for r in t.stats.records]

    for rep in range(args.repeats):
        got = {}
        # elastic: a host lost for good, then one added.
        actions.clear()
        began = time.time()
        rounds = fit("elastic", args.epochs_elastic, at_rounds({
            args.lose_at: lambda: in_thread("remove", "remove", last_worker()),
            args.join_at: lambda: in_thread("add", "add")}), min_workers=1, max_workers=workers)
        lost = monitor.first(began, lambda c: c < workers)
        added = next(a for a in actions if a["what"] == "add")
        got["elastic"] = {"rounds": rounds, "lost_at": lost, "actions": list(actions),
                          "registered_at": monitor.first(added["began"], lambda c: c == workers)}
        # fixed: the same loss with elastic rounds off.
        actions.clear()
        began = time.time()
        rounds = fit("fixed", args.epochs_fixed, at_rounds({
            args.lose_at: lambda: in_thread("remove", "remove", last_worker())}), num_workers=workers)
        got["fixed"] = {"rounds": rounds, "lost_at": monitor.first(began, lambda c: c < workers),
                        "actions": list(actions)}
        # steady: W - 1 workers on the W - 1 hosts left.
        got["steady"] = {"rounds": fit("steady", args.epochs_steady, num_workers=workers - 1)}
        began = time.time()
        hosts_py(hosts.Cluster.attach(), "add")
        monitor.first(began, lambda c: c == workers)
        results["repeats"].append(got)
        with open(args.out, "w") as f:
            json.dump({**results, "monitor": monitor.changes}, f, indent=1)
    monitor.stop()
    spark.stop()


# ---------------------------------------------------------------- on this machine


def summary(results: dict) -> dict:
    """Per repeat and pooled: the arms' median round times after the loss, and the join (see the module docstring).

    ``steady``: the steady fit's rounds but its first (the fit's start-up);
    ``elastic``: the elastic arm's rounds that started after the status
    store showed the loss and before it showed the new executor; ``fixed``:
    the fixed arm's rounds that started after the loss showed.
    """
    w = results["workers"]
    reps, pooled = [], {"steady": [], "elastic": [], "fixed": []}
    for rep in results["repeats"]:
        e, f = rep["elastic"], rep["fixed"]
        arms = {"steady": rep["steady"]["rounds"][1:],
                "elastic": [r for r in e["rounds"] if e["lost_at"] <= r["t_start"] < e["registered_at"]],
                "fixed": [r for r in f["rounds"] if r["t_start"] >= f["lost_at"]]}
        since = [r for r in e["rounds"] if r["t_start"] >= e["registered_at"]]
        first = next((i for i, r in enumerate(since) if r["num_workers"] == w), None)
        row = {arm: statistics.median(r["wall_s"] for r in rounds) for arm, rounds in arms.items()}
        row.update({f"{arm}_rounds": len(rounds) for arm, rounds in arms.items()},
                   elastic_workers=sorted({r["num_workers"] for r in arms["elastic"]}),
                   join_rounds=None if first is None else first + 1,
                   join_s=None if first is None else since[first]["t_start"] - e["registered_at"],
                   first_joined_round_s=None if first is None else since[first]["wall_s"],
                   add_s=next(a["done"] - a["began"] for a in e["actions"] if a["what"] == "add"))
        reps.append(row)
        for arm, rounds in arms.items():
            pooled[arm] += [r["wall_s"] for r in rounds]
    return {"repeats": reps, "pooled": {arm: statistics.median(v) for arm, v in pooled.items() if v}}


def table(results: dict) -> str:
    w, got = results["workers"], summary(results)
    lines = [f"| repeat | steady {w - 1} workers: median round s (rounds) | elastic after the loss: median s (rounds; "
             f"workers) | fixed {w} tasks on {w - 1} slots: median s (rounds) | elastic ÷ steady | fixed ÷ steady "
             f"| join: rounds after registration (s) | first round with the new host s |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(got["repeats"]):
        lines.append(f"| {i + 1} | {r['steady']:.2f} ({r['steady_rounds']}) | {r['elastic']:.2f} ({r['elastic_rounds']}; "
                     f"{r['elastic_workers']}) | {r['fixed']:.2f} ({r['fixed_rounds']}) | "
                     f"{r['elastic'] / r['steady']:.2f} | {r['fixed'] / r['steady']:.2f} | "
                     + (f"{r['join_rounds']} ({r['join_s']:.1f}) | {r['first_joined_round_s']:.1f} |"
                        if r["join_rounds"] is not None else "– (the fit ended first) | – |"))
    p = got["pooled"]
    lines.append(f"| pooled | {p['steady']:.2f} | {p['elastic']:.2f} | {p['fixed']:.2f} | "
                 f"{p['elastic'] / p['steady']:.2f} | {p['fixed'] / p['steady']:.2f} | | |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "drive"])
    p.add_argument("--hosts", type=int, default=9, help="hosts including host 0 (W = hosts - 1 workers)")
    p.add_argument("--sleep", type=float, default=0.5, help="seconds each worker sleeps per minibatch (0: none)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--lose-at", type=int, default=4, help="the round after which a host is removed")
    p.add_argument("--join-at", type=int, default=14, help="the elastic arm's round after which a host is added")
    p.add_argument("--epochs-elastic", type=int, default=3)
    p.add_argument("--epochs-fixed", type=int, default=2)
    p.add_argument("--epochs-steady", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1500, help="the driver's time limit")
    p.add_argument("--out", default=os.path.join(HERE, "results", "elastic.json"))
    p.add_argument("--table-only", action="store_true", help="reprint the table of --out")
    args = p.parse_args()
    if args.table_only:
        with open(args.out) as f:
            print(table(json.load(f)))
        return
    if args.mode == "drive":
        drive(args)
        return
    import hosts

    state = os.path.join(ROOT, "output", "hosts-elastic-bench")
    out = os.path.join(state, "result.json")
    load = {"before": os.getloadavg()}
    t0 = time.time()
    with hosts.Cluster(hosts=args.hosts, store=False, state_dir=state, ttl_s=args.timeout_s + 600).running() as cluster:
        load["up_s"] = time.time() - t0
        argv = [sys.executable, os.path.abspath(__file__), "drive", "--out", out]
        for name in ("sleep", "repeats", "lose_at", "join_at", "epochs_elastic", "epochs_fixed", "epochs_steady"):
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        proc = cluster.run(0, argv, env=cluster.driver_env(), timeout=args.timeout_s, check=False)
        load["after"] = os.getloadavg()
        with open(os.path.join(ROOT, "output", "elastic-driver.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        if not os.path.exists(out):
            raise SystemExit(f"the driver wrote no results ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
        with open(out) as f:
            results = json.load(f)
        if proc.returncode != 0:
            print(f"the driver failed ({proc.returncode}) after {len(results['repeats'])} repeat(s):\n"
                  f"{(proc.stdout + proc.stderr)[-4000:]}", file=sys.stderr)
    results.update(load=load, command=" ".join(["benchmarks/elastic.py", *sys.argv[1:]]), summary=summary(results))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    print(f"load average before {load['before']}, after {load['after']}")


if __name__ == "__main__":
    main()
