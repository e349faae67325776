"""The round protocol's model can fail: each earlier fix of the protocol, reverted, is caught by an invariant.

Usage: ``.venv/bin/python scripts/protocol_mutants.py`` (under a minute on 2 cores). Each mutant swaps one of the
board's step programs (sparkdl_avg/shared/wire/board.py) for the program as it was before a fix, then runs the state
machine of tests/transport/test_round_protocol.py as CI does; it prints the invariants that the failures name
(docs/round-protocol.md, "How they are checked"). A mutant that is not caught exits 1.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "transport")]
import test_round_protocol as t  # noqa: E402
from sparkdl_avg.shared.wire import board as b  # noqa: E402
from sparkdl_avg.shared.wire.board import PASSED, STOP, WAIT, _seq, round_name  # noqa: E402

orig = {k: getattr(b, k) for k in ("word", "owed", "first_round", "announce")}

def word_no_passed(seq):  # before a0094e5: a missing word is waited for, whatever came after it
    if (yield ("exists", STOP)):
        return None
    data = yield ("read", round_name(seq))
    return data if data is not None else WAIT

def owed_answered_only(seq, workers):  # before a0094e5: only "answered" was checked
    return not (yield from b.answered(seq, workers))

def first_round_max():  # a0094e5's own choice, undone by 63c4be0: join at the highest word
    names = yield ("list",)
    if STOP in names:
        return None
    seqs = [s for s in (_seq(n, "round-") for n in names) if s is not None]
    return max(seqs) if seqs else WAIT

def owed_successor(seq, workers):  # a0094e5's passed(): over once round seq + 1 exists
    if (yield from b.answered(seq, workers)):
        return False
    return not (yield ("exists", round_name(seq + 1)))

def announce_answers_first(seq, word, keep_from=None):  # before 63c4be0/0a1e483: answers removed before words
    yield ("write", round_name(seq), word)
    floor = seq if keep_from is None else keep_from
    names = yield ("list",)
    for prefix in ("done-", "round-"):
        for name in names:
            s = _seq(name, prefix)
            if s is not None and s < floor:
                yield ("remove", name)

def word_successor_is_passed(seq):  # before 0a1e483: a later word present means over, without reading again
    if (yield ("exists", STOP)):
        return None
    data = yield ("read", round_name(seq))
    if data is not None:
        return data
    names = yield ("list",)
    if any((_seq(n, "round-") or -1) > seq for n in names):
        return PASSED
    return WAIT

MUTANTS = {
    "a0094e5 reverted (no PASSED; answered only)": {"word": word_no_passed, "owed": owed_answered_only},
    "a0094e5's join at the highest word (63c4be0 reverted, 1 of 3)": {"first_round": first_round_max},
    "a0094e5's passed = successor exists (63c4be0 reverted, 2 of 3)": {"owed": owed_successor},
    "answers removed before words (63c4be0/0a1e483 reverted, 3 of 3)": {"announce": announce_answers_first},
    "0a1e483 reverted: word() takes a later word for over": {"word": word_successor_is_passed},
}
missed = []
for name, patch in MUTANTS.items():
    for k, v in orig.items():
        setattr(b, k, v)
    for k, v in patch.items():
        setattr(b, k, v)
    try:
        t.RoundProtocol.TestCase("runTest").runTest()
        print(f"{name}: NOT CAUGHT")
        missed.append(name)
    except Exception as exc:  # noqa: BLE001 - hypothesis' failures, one or a group
        subs = getattr(exc, "exceptions", None) or [exc]
        text = " | ".join(str(e) for e in subs)
        found = sorted(set(re.findall(r"invariant \d", text))) or [type(exc).__name__ + ": " + text[:200]]
        print(f"{name}: caught by {found}")
for k, v in orig.items():
    setattr(b, k, v)
sys.exit(1 if missed else 0)
