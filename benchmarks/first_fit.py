"""The first fit of a Spark application against a warm fit and one-process Keras (issue 48, part 1).

Fails (exit status 1, a message per target missed) when the first fit's
penalty grows past the targets. The task is the suite's
(``benchmarks/bench_cnn.py``): the small CNN on 20,000 synthetic 28×28
images, batch 32, 3 epochs, 2 workers on ``local[2]``. Arms, each a fresh
process (a first fit is per Spark application), interleaved per repeat so
that the machine's load hits them alike:

* ``readme``: README's path: the session with ``RECOMMENDED_CONF``,
  ``sparkdl_avg.warm_up(spark, model)`` right after it, the data ready 1 s
  later (``--ready``), then the first fit and ``--warm-fits`` warm fits (default 2; new trainer,
  new model of the same architecture, as a notebook's re-run cell);
* ``readme_no_model``: the same with ``warm_up(spark)`` (no model given);
* ``plain``: a session without README's settings and no warm-up, the data
  ready at once; the same fits;
* ``keras``: ``model.fit`` in one process, TensorFlow on all cores;
* with ``--baseline DIR`` (a checkout of an earlier sparkdl_avg, e.g. the
  main branch's): ``baseline``, README's path as it was there
  (``warm_up(spark)``) with that checkout's package, interleaved with the
  others, for a before/after in one run.

Targets, on medians over the repeats (``--repeats``, default 3):

* ``readme`` first fit ≤ ``keras`` fit;
* ``readme`` first fit ≤ its warm fit + 3.0 s; ``plain`` first fit ≤ its warm fit + 5.0 s;
* tracing (the slowest worker's ``trace_s`` in the fit that traced) ≤ 1.0 s.

It prints each first fit's timeline (``trainer.stats.first_fit``) and writes
``benchmarks/results/first_fit.json``. Run (≈ 4 min at 3 repeats)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/first_fit.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import harness  # noqa: E402

ARMS = ("readme", "readme_no_model", "plain", "keras", "baseline")
ARM_CONF = {"plain": None}  # readme=False: no RECOMMENDED_CONF at all
TARGETS = {
    "first_minus_keras_s": 0.0,       # readme first fit ≤ keras fit
    "readme_first_minus_warm_s": 3.0,  # readme first fit ≤ warm + 3 s
    "plain_first_minus_warm_s": 5.0,   # plain first fit ≤ warm + 5 s
    "trace_s": 1.0,                    # tracing per worker
}


def _startup(stats) -> dict:
    """``stats.startup``, or the same figures from the records where the package predates it (``baseline``)."""
    startup = getattr(stats, "startup", None)
    if startup is not None:
        return startup
    first = stats.records[0]
    return {"staging_s": stats.staging_s, "wait_executors_s": first.schedule_s,
            "import_s": max(w.import_s for w in first.workers), "build_s": max(w.build_s for w in first.workers),
            "trace_s": max(w.trace_s for w in first.workers),
            "first_steps_s": max(w.compute_s - w.trace_s for w in first.workers), "round1_s": first.wall_s,
            "round2_s": stats.records[1].wall_s if len(stats.records) > 1 else None}


def run_arm(arm: str, args) -> dict:
    """One arm in this process: its fits' wall times and the first fit's timeline."""
    from bench_cnn import build_model, make_data

    x, y = make_data(args.examples, seed=0)
    if arm == "keras":
        model = build_model()
        t = time.perf_counter()
        model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0)
        return {"fits_s": [time.perf_counter() - t]}

    import sparkdl_avg
    from sparkdl_avg import ParameterAveragingTrainer

    model = build_model()
    t0 = time.perf_counter()
    spark = harness.session("local[2]", readme=arm != "plain", app_name=f"first-fit-{arm}")
    session_s = time.perf_counter() - t0
    t_warm = time.perf_counter()  # the data are ready --ready seconds after warm_up is called
    if arm == "readme":
        sparkdl_avg.warm_up(spark, model)
    elif arm in ("readme_no_model", "baseline"):
        sparkdl_avg.warm_up(spark)
    if arm != "plain":
        time.sleep(max(0.0, args.ready - (time.perf_counter() - t_warm)))
    fits, timeline, traces, warm_timelines = [], None, [], []
    for i in range(1 + args.warm_fits):
        m = model if i == 0 else build_model()
        with ParameterAveragingTrainer(m, num_workers=2, batch_size=args.batch_size,
                                       averaging_frequency=args.k, seed=1, slow_warning=False) as tr:
            t = time.perf_counter()
            tr.fit((x, y), epochs=args.epochs, verbose=0)
            fits.append(time.perf_counter() - t)
            if i == 0:
                timeline = _startup(tr.stats)
            else:
                warm_timelines.append(_startup(tr.stats))
            traces += [w.trace_s for r in tr.stats.records for w in r.workers if w.traced]
    spark.stop()
    return {"fits_s": fits, "session_s": session_s, "first_fit": timeline, "warm_fits": warm_timelines,
            "trace_s": max(traces) if traces else 0.0}


def main() -> None:
    p = harness.parser(__doc__, out="first_fit.json", repeats=3)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--k", type=int, default=8, help="averaging_frequency (default: %(default)s, the trainer's)")
    p.add_argument("--warm-fits", type=int, default=2, help="fits after the first, per arm (default: %(default)s)")
    p.add_argument("--ready", type=float, default=1.0, help="seconds from warm_up to the data ready")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
    p.add_argument("--no-check", action="store_true", help="report, but exit 0 when a target is missed")
    p.add_argument("--baseline", default=None, help="a checkout whose package the 'baseline' arm runs (default: no arm)")
    p.add_internal("--one", default=None)
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_arm(args.one, args)), flush=True)
        return
    arms = args.arms.split(",")
    if args.baseline and "baseline" not in arms:
        arms.append("baseline")
    if "baseline" in arms and not args.baseline:
        p.error("--arms: the 'baseline' arm needs --baseline DIR (a checkout of the package to compare with)")
    for arm in arms:
        if arm not in ARMS:
            p.error(f"--arms: unknown arm {arm!r}; expected some of {list(ARMS)}")
    child = [a for a in sys.argv[1:]]
    runs = {arm: [] for arm in arms}
    for rep in range(args.repeats):
        for arm in arms:
            env = dict(os.environ)
            if arm == "baseline":  # that checkout's package first, on the driver and (inherited) the executors
                env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.baseline), env.get("PYTHONPATH", "")])
            proc = subprocess.run([sys.executable, __file__, *child, "--one", arm], capture_output=True, text=True,
                                  env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                raise SystemExit(f"arm {arm} failed:\n{proc.stderr[-3000:]}")
            r = json.loads(lines[-1][len("RESULT "):])
            runs[arm].append(r)
            extra = ""
            if r.get("first_fit"):
                extra = "  timeline: " + ", ".join(f"{k} {v:.2f}" for k, v in r["first_fit"].items()
                                                    if isinstance(v, float))
            print(f"[{rep}] {arm:>15}: fits {[round(t, 2) for t in r['fits_s']]}"
                  f"{'  trace %.2f' % r['trace_s'] if 'trace_s' in r else ''}{extra}  load {os.getloadavg()[0]:.1f}",
                  flush=True)

    def med(arm, f):
        return statistics.median(f(r) for r in runs[arm]) if arm in runs else None

    first = {a: med(a, lambda r: r["fits_s"][0]) for a in arms}
    warm = {a: med(a, lambda r: statistics.median(r["fits_s"][1:])) for a in arms if a != "keras"}
    figures = {}
    if "readme" in arms and "keras" in arms:
        figures["first_minus_keras_s"] = first["readme"] - first["keras"]
    if "readme" in arms:
        figures["readme_first_minus_warm_s"] = first["readme"] - warm["readme"]
    if "plain" in arms:
        figures["plain_first_minus_warm_s"] = first["plain"] - warm["plain"]
    # the arms whose fits trace (after warm_up(spark, model) the warm-up's tasks did: the fit sees no trace)
    traced = [r["trace_s"] for a in ("readme_no_model", "plain") if a in arms for r in runs[a]]
    if traced:
        figures["trace_s"] = statistics.median(traced)
    load = os.getloadavg()[0]
    print(f"\n| arm | first fit s | warm fit s | first − warm s |  (medians of {args.repeats}; load {load:.1f})")
    print("|---|---|---|---|")
    for a in arms:
        w = warm.get(a)
        print(f"| {a} | {first[a]:.2f} | {'' if w is None else f'{w:.2f}'} | {'' if w is None else f'{first[a] - w:+.2f}'} |")
    keys = ["driver_s", "staging_s", "wait_executors_s", "import_s", "build_s", "trace_s", "first_steps_s",
            "round1_s", "round2_s"]
    print(f"\n| arm (first fit, medians) | {' | '.join(keys)} |")
    print("|---|" + "---|" * len(keys))
    for a in arms:
        if a == "keras":
            continue
        cells = []
        for key in keys:
            values = [r["first_fit"].get(key) for r in runs[a] if r["first_fit"].get(key) is not None]
            cells.append(f"{statistics.median(values):.2f}" if values else "")
        print(f"| {a} | {' | '.join(cells)} |")
    missed = [f"{name} = {value:+.2f} s, target ≤ {TARGETS[name]:+.1f} s"
              for name, value in figures.items() if value > TARGETS[name]]
    harness.write_results(args.out, args, conf=harness.settings(), arm_conf={"plain": harness.overrides(
        harness.settings(), harness.settings(readme=False))}, figures=figures, targets=TARGETS, missed=missed,
        runs=runs)
    for name, value in figures.items():
        print(f"{name}: {value:+.2f} s (target ≤ {TARGETS[name]:+.1f} s){'  MISSED' if value > TARGETS[name] else ''}")
    if missed and not args.no_check:
        raise SystemExit("first_fit: the first fit's penalty grew past its targets:\n  " + "\n  ".join(missed))


if __name__ == "__main__":
    main()
