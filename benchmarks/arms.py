"""Running a benchmark's arms as child processes, in alternating order: one Spark application per arm.

Static Spark settings (the daemon, Unix sockets) and the one-SparkContext-
per-process rule mean each arm of a side-by-side comparison runs in a
process of its own; :func:`run_alternating` runs them ``repeats`` times,
reversing the order every other repeat so that a drift of the machine
weighs on every arm alike, and records the 1-minute load after each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Sequence, Tuple


def run_alternating(script: str, arms: Sequence[str], repeats: int, rounds: int, out: str) -> Tuple[list, List[float]]:
    """Runs ``script --arm A --child-out F --rounds R`` for every arm and repeat; returns (results, load).

    Each child writes a JSON list of result dicts to ``F``; every result
    gets its ``repeat`` added.
    """
    load, results = [os.getloadavg()[0]], []
    for rep in range(repeats):
        for arm in (arms if rep % 2 == 0 else arms[::-1]):
            tmp = os.path.join(os.path.dirname(out), f".arm-{os.path.basename(script)}.tmp")
            subprocess.run([sys.executable, script, "--arm", arm, "--child-out", tmp, "--rounds", str(rounds)],
                           check=True)
            with open(tmp) as f:
                results += [{**r, "repeat": rep} for r in json.load(f)]
            os.remove(tmp)
            load.append(os.getloadavg()[0])
    return results, load
