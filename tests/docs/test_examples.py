"""Every code block of the guides runs as written (docs/getting-started.md, docs/guides/*.md).

Each page's blocks run in order in one namespace on the shared ``local[2]`` session
(``tests/conftest.py``), the way a reader runs them; see :mod:`examples` for the blocks the tests
skip (each says why on the page) or edit. The library must log no warning while they run: the
examples show settings that fit their data (issue 48 item 14: the text example used to warn that
``averaging_frequency`` was cut, and that one process would be faster). README's Quickstart is run
by tests/test_readme.py in a Python of its own; Getting started shows the same block.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import examples  # noqa: E402

SLOWER = "This fit is slower than one process would be"
CUT = "rounds are cut to the epoch"
#: Warnings a page's examples may log; each page says so where its setup is shown: the Quickstart's
#: 1,437 digits are too few for two workers to beat one process, which the slow warning says.
ALLOWED_WARNINGS = {
    "guides/compression.md": (SLOWER,),
    "guides/stragglers.md": (SLOWER,),
    "guides/failures.md": (SLOWER,),
    "guides/watching.md": (SLOWER,),
    "guides/diloco.md": (SLOWER, CUT),
    "guides/ml-pipelines.md": (SLOWER,),
    "guides/data.md": (SLOWER,),
    "guides/inference.md": (SLOWER,),
    "guides/rounds.md": (SLOWER,),
}
#: Blocks (found by a line of theirs) that must log no warning at all: issue 48 item 14's text example.
QUIET = {"guides/data.md": ("TextVectorization",)}


def test_every_guide_has_runnable_blocks_and_few_are_skipped():
    skipped = {page: [b.splitlines()[0] for b in examples.blocks(page) if b.startswith(examples.NOT_RUN)]
               for page in examples.pages()}
    assert sum(len(v) for v in skipped.values()) <= 6, f"too many blocks not run: {skipped}"
    for page, lines in skipped.items():
        for line in lines:
            assert len(line) > len(examples.NOT_RUN) + 10, f"{page}: a block not run says no reason: {line!r}"


def test_substitutions_name_text_on_their_pages():
    for page, subs in examples.SUBSTITUTIONS.items():
        text = (examples.DOCS / page).read_text(encoding="utf-8")
        for old, _new, _why in subs:
            assert old in text, f"{page} no longer has {old!r}: update examples.SUBSTITUTIONS"


def test_getting_started_shows_the_readmes_quickstart():
    readme = (examples.ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = readme.split("## Quickstart", 1)[1]
    block = quickstart.split("```python\n", 1)[1].split("```", 1)[0]
    assert block in examples.blocks("getting-started.md"), "docs/getting-started.md's Quickstart differs from README's"


@pytest.mark.parametrize("page", [p for p in examples.pages() if p != "getting-started.md"])
def test_the_pages_code_blocks_run(spark, page, tmp_path, monkeypatch):
    if not examples.runnable(page):
        pytest.skip(f"docs/{page} has no code block the tests run")
    monkeypatch.chdir(tmp_path)  # files a block writes (model.keras, mlruns) land here
    logged = examples.run(page, {"__name__": "__main__"})
    for marker in QUIET.get(page, ()):
        said = [message for block, message in logged if marker in block]
        assert not said, f"docs/{page}'s example with {marker} logged warnings: {said}"
    warnings = [message for _block, message in logged]
    allowed = ALLOWED_WARNINGS.get(page, ())
    if allowed:
        text = " ".join((examples.DOCS / page).read_text(encoding="utf-8").split())
        assert "one process would be faster" in text or "one process is faster" in text, (
            f"docs/{page} may log the slow warning in the tests but does not tell its reader")
    unexpected = [w for w in warnings if not any(a in w for a in allowed)]
    assert not unexpected, f"docs/{page}'s examples logged warnings: {unexpected}"


def test_a_page_that_shows_no_example_to_run_is_a_known_one():
    assert [p for p in examples.pages() if not examples.runnable(p) and p != "getting-started.md"] == [
        "guides/cluster.md", "guides/connect.md"]
