"""README.md stays true: the two commands present, links alive, the Quickstart runs as written.

The configuration reference that README.md used to keep by hand is the site's options page,
generated from the option table and checked by tests/docs/test_site.py, which also checks the
layout (docs/architecture.md) and README's length. Every Python block here must parse, and the
Quickstart's runs as written, in a Python of its own (its own ``local[2]`` session, as a
reader's would be); the other checks need no Spark session.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier


ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"



def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def test_the_two_commands():
    text = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for command in ("make train", "make test"):
        assert re.search(rf"^{command}\b", text, re.MULTILINE), f"README.md does not show `{command}` in a code block"
        target = command.split()[1]
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"the Makefile has no '{target}' target"


def _links(text: str):
    """Targets of Markdown links and images, outside code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)  # link texts in backticks become empty: still links
    return re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def test_relative_links_point_to_files():
    text = README.read_text(encoding="utf-8")
    links = _links(text)
    assert links, "found no links in README.md"
    broken = []
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, in-page anchors
        path = target.split("#")[0]
        if not (README.parent / path).exists():
            broken.append(target)
    assert not broken, f"README.md links to missing files: {broken}"


def test_in_page_anchors_exist():
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)

    def slug(heading: str) -> str:  # GitHub's anchor rule
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    anchors = {slug(h) for h in headings}
    missing = [t for t in _links(text) if t.startswith("#") and t[1:] not in anchors]
    assert not missing, f"README.md links to missing headings: {missing}"


def _python_blocks(text: str):
    """The ```python code blocks of ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_every_python_block_parses():
    blocks = _python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no python blocks"
    for block in blocks:
        ast.parse(block)  # a SyntaxError names the line


def test_the_quickstart_runs_as_written(tmp_path):
    """Literally, top to bottom: every name it uses is defined in it (issue #29 item 16: val_df and test_df were not)."""
    blocks = _python_blocks(_section(README.read_text(encoding="utf-8"), "Quickstart"))
    assert len(blocks) == 1, "the Quickstart should be one python block"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    probe = "\nprint('REPLICAS', sum(r.replicas_built for r in trainer.stats.records))\n"
    proc = subprocess.run([sys.executable, "-c", blocks[0] + probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line for line in proc.stdout.splitlines() if line.strip()]
    assert printed[-1] == "REPLICAS 2"  # one replica per worker: not built again on a second set of workers
    assert printed[-2].startswith("{") and "'accuracy'" in printed[-2], proc.stdout[-2000:]
    assert ast.literal_eval(printed[-2])["accuracy"] > 0.8  # the digits are learnt, not just run through
    assert (tmp_path / "model.keras").is_file()
    # Issue 28 item 15: no TensorFlow start-up notices, no Spark progress bars over the epoch lines.
    for noise in ("absl::InitializeLog", "oneDNN", "cuda drivers", "cuInit", "cpu_feature_guard", "[Stage "):
        assert noise not in proc.stderr, proc.stderr[-3000:]
