"""The guides' code blocks, as the tests run them (shared by test_examples.py and test_examples_connect.py).

A page's ```python blocks run in order in one namespace, as a reader would run them top to
bottom. A block whose first line is ``# Not run by the tests: <reason>`` is shown, reason and
all, to the reader and skipped here. :data:`SUBSTITUTIONS` lists the few edits the tests make to
a block before running it, each with why; the text to replace must be on the page (a stale
substitution fails).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOT_RUN = "# Not run by the tests:"
#: The line every page's setup starts its session with; under Spark Connect the tests give it theirs.
SESSION_LINE = 'spark = SparkSession.builder.master("local[2]").config(map=sparkdl_avg.RECOMMENDED_CONF).getOrCreate()'

#: ``{page: [(text on the page, what the tests run instead, why)]}``
SUBSTITUTIONS: Dict[str, List[Tuple[str, str, str]]] = {
    "guides/data.md": [
        ("table = 2**24 + 4", "table = 2**14 + 4",
         "the full table (2^24 rows of 8 floats and Adam's moments) needs ~10 GB and minutes; "
         "benchmarks/memory.py runs the full size"),
    ],
}


def pages() -> List[str]:
    """The guides whose code blocks the tests run: Getting started and every page of docs/guides/."""
    return ["getting-started.md"] + sorted(str(p.relative_to(DOCS)) for p in (DOCS / "guides").glob("*.md"))


def blocks(page: str) -> List[str]:
    """The ```python blocks of ``page``, in order."""
    return re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def runnable(page: str, session_line: str = SESSION_LINE) -> List[str]:
    """``page``'s blocks as the tests run them: the not-run ones left out, the substitutions made."""
    out = []
    for block in blocks(page):
        if block.startswith(NOT_RUN):
            continue
        for old, new, _why in SUBSTITUTIONS.get(page, []):
            block = block.replace(old, new)
        out.append(block.replace(SESSION_LINE, session_line))
    return out


class Warnings(logging.Handler):
    """Collects the ``sparkdl_avg`` logger's warnings while a page runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> "Warnings":
        logging.getLogger("sparkdl_avg").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("sparkdl_avg").removeHandler(self)


def run(page: str, namespace: dict, session_line: str = SESSION_LINE) -> List[Tuple[str, str]]:
    """Runs ``page``'s blocks in ``namespace``; returns ``[(block, warning)]``: what the library logged in each."""
    logged = []
    for i, block in enumerate(runnable(page, session_line)):
        code = compile(block, f"docs/{page} (python block {i + 1})", "exec")
        with Warnings() as warnings:
            exec(code, namespace)  # noqa: S102 (the documentation's own examples)
        logged += [(block, message) for message in warnings.messages]
    return logged
