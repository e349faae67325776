"""A fresh user's bad inputs, tried and classified automatically (issue 48, part 2: the trial).

Each case is one mistake a new user might make — an option, a ``fit`` argument, the data (columns, dtypes,
shapes, NaN, ids, images, text, weights), a preprocessing function, a flag of ``jobs/train.py`` — run against
the library in one Spark session, and classified:

* **clear**: refused (or, where the case says a warning is the right answer, warned) with a message that
  names the parameter, column, flag or value (the case's ``names``, all of them) and says what was expected
  (it has one of :data:`EXPECTATION`'s words);
* **unclear**: refused by the library, but the message misses a name or says nothing of what was expected,
  or a job's argparse error comes with its multi-line usage (README promises one line);
* **wrong**: accepted silently, or refused with a raw Python/numpy/TensorFlow/Spark error (an exception that is
  not one of sparkdl_avg's and was raised outside the package; Python's own ``TypeError`` for an unknown
  keyword argument counts as the library's, as ``sparkdl_avg.errors`` documents).

A case whose cause is the user's own exception (a preprocessing function that raises) needs the names only: the
message's "what was expected" is the user's own.

A script rather than tests: the cases are a survey whose figure is the result (a test per case would make the
suite slower by a Spark session and assert what the survey reports), and each defect it found has its own test.

The cases are in ``bad_inputs_cases.py``. Run (about 4 minutes on 2 loaded cores; results in
docs/benchmarks/bad_inputs.md)::

    PYTHONPATH=$PWD PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bad_inputs.py \\
        --out benchmarks/results/bad_inputs.json

``--only SUBSTRING`` runs the cases whose id contains it; ``--table FILE`` appends a Markdown table of every case.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from bad_inputs_cases import Case, Fixtures, cases  # noqa: E402

#: Words by which a message says what was expected.
EXPECTATION = re.compile(
    r"expect|must|needs?\b|should|one of|instead|\buse\b|\bgive\b|\bset\b|only|cannot|can't|not\b|valid|"
    r"did you mean|outside|above|below|in the range|at least|at most|missing|refus|no column|has no|takes|choose|"
    r"clean|impute|required", re.I)


@dataclass
class Result:
    case: Case
    verdict: str
    how: str
    message: str
    seconds: float
    warnings: List[str] = field(default_factory=list)


# --------------------------------------------------------------- classifying


def _library_raised(exc: BaseException) -> bool:
    """The exception is sparkdl_avg's, or was raised by its code (an unknown keyword's ``TypeError``)."""
    import sparkdl_avg

    if isinstance(exc, sparkdl_avg.SparkdlAvgError):
        return True
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
        return True  # Python's own refusal of an unknown keyword, as errors.py documents for every call
    frames = traceback.extract_tb(exc.__traceback__)
    package = os.path.dirname(sparkdl_avg.__file__)
    # raised by a ``raise`` of the package's own (not numpy's error inside a call the package made)
    return (bool(frames) and frames[-1].filename.startswith(package) and isinstance(exc, (TypeError, ValueError))
            and (frames[-1].line or "").lstrip().startswith("raise"))


def _names_all(text: str, names: Sequence[str]) -> List[str]:
    return [n for n in names if n.lower() not in text.lower()]


def classify(case: Case, outcome: Any, exc: Optional[BaseException], caught: List[str]) -> Tuple[str, str, str]:
    """(verdict, how, message) of one case."""
    if isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], int) and exc is None:  # a job
        rc, err = outcome
        lines = [line for line in err.splitlines() if line.strip()]
        message = lines[-1] if lines else ""
        if rc == 0:
            return "wrong", "job accepted", message
        errors = [line for line in lines if "error:" in line]
        if not errors:
            return "wrong", f"exit {rc} without an error line ({len(lines)} lines)", "\n".join(lines[-3:])
        message = errors[-1]
        missing = _names_all(message, case.names)
        if len(lines) > 1:
            return "unclear", f"exit {rc}, {len(lines)} lines on stderr (usage first)", message
        if missing or not EXPECTATION.search(message):
            return "unclear", f"exit {rc}; misses {missing or 'what was expected'}", message
        return "clear", f"exit {rc}, one line", message
    if exc is not None:
        message = f"{type(exc).__name__}: {exc}"
        if not _library_raised(exc):
            return "wrong", "raw " + type(exc).__name__, message
        missing = _names_all(str(exc), case.names)
        if missing:
            return "unclear", f"{type(exc).__name__} misses {missing}", message
        if case.expectation and not EXPECTATION.search(str(exc)):
            return "unclear", f"{type(exc).__name__} says nothing expected", message
        return "clear", type(exc).__name__, message
    naming = [w for w in caught if not _names_all(w, case.names)]
    if case.expect == "warn" and naming:
        return "clear", "warned", naming[0]
    if naming:
        return "unclear", "accepted with a warning", naming[0]
    return "wrong", "accepted", "(no error, and no warning naming it)"


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: List[str] = []

    def emit(self, record):
        self.records.append(record.getMessage())


def run_case(case: Case) -> Result:
    handler = _Warnings()
    logging.getLogger("sparkdl_avg").addHandler(handler)
    outcome, error = None, None
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                outcome = case.run()
        except SystemExit as exc:  # an argparse error outside cli.run
            error = RuntimeError(f"SystemExit({exc.code})")
        except BaseException as exc:  # noqa: BLE001 (classified below)
            error = exc
    logging.getLogger("sparkdl_avg").removeHandler(handler)
    texts = [str(w.message) for w in caught] + handler.records
    verdict, how, message = classify(case, outcome, error, texts)
    return Result(case, verdict, how, " ".join(message.split())[:400], time.perf_counter() - started, texts)


# --------------------------------------------------------------------- main


def table(results: List[Result], command: str, load: str, label: str) -> str:
    counts = {v: sum(r.verdict == v for r in results) for v in ("clear", "unclear", "wrong")}
    total = len(results)
    lines = [f"### {label}", "",
             f"`{command}` — {total} cases: **{counts['clear']} clear ({100 * counts['clear'] / total:.1f}%), "
             f"{counts['unclear']} unclear, {counts['wrong']} wrong**; load average at the end: {load}.", "",
             "| # | group | bad input | verdict | how | message (first 400 characters) |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        message = r.message.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {i} | {r.case.group} | {r.case.what.replace('|', '/')} | {r.verdict} | {r.how} | {message} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    import tempfile

    p = harness.parser(__doc__.split("\n\n")[0], out="bad_inputs.json")
    p.add_argument("--only", default=None, help="run only the cases whose id contains this")
    p.add_argument("--table", default=None, help="write the Markdown result table here")
    p.add_argument("--label", default="Result", help="the table's heading")
    args = p.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import sparkdl_avg  # noqa: F401 (TensorFlow imported with its notices filtered)
    import pyarrow as pa
    import pyarrow.parquet as pq

    spark = harness.session()
    spark.sparkContext.setLogLevel("OFF")  # the executors' traces of refused tasks are not what is classified
    sparkdl_avg.warm_up(spark).result()
    f = Fixtures(spark)
    work = tempfile.mkdtemp(prefix="bad_inputs_")
    f.parquet = os.path.join(work, "data.parquet")
    pq.write_table(pa.table({"features": [list(map(float, r)) for r in f.x], "label": f.y}), f.parquet)
    f.model_path = os.path.join(work, "model.keras")
    f.mlp().save(f.model_path)
    f.output_dir = os.path.join(work, "out")

    results = []
    for c in cases(f):
        if args.only and args.only not in c.id:
            continue
        r = run_case(c)
        results.append(r)
        print(f"{r.verdict:8s} {r.seconds:5.1f}s {c.id}: {r.how} — {r.message[:160]}", flush=True)
        if os.path.exists(f.output_dir):
            import shutil

            shutil.rmtree(f.output_dir, ignore_errors=True)
    load = os.getloadavg()
    counts = {v: sum(r.verdict == v for r in results) for v in ("clear", "unclear", "wrong")}
    print(f"{len(results)} cases: {counts}", flush=True)
    command = "PYTHONPATH=$PWD PYSPARK_PYTHON=.venv/bin/python .venv/bin/python " + " ".join(
        ["benchmarks/bad_inputs.py"] + sys.argv[1:])
    harness.write_results(args.out, args, rows=[
        {"id": r.case.id, "group": r.case.group, "what": r.case.what, "verdict": r.verdict, "how": r.how,
         "message": r.message, "seconds": round(r.seconds, 2)} for r in results], counts=counts)
    if args.table:
        text = table(results, command, f"{load[0]:.2f}", args.label)
        with open(args.table, "a", encoding="utf-8") as out:
            out.write("\n" + text)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
