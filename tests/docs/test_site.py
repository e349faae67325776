"""The documentation site builds clean and stays true to the code.

``mkdocs build --strict`` (every link and anchor resolves, every page is in the nav, every
mkdocstrings reference imports) builds clean (its time is measured, not asserted: 20-23 s idle, 26-41 s in
CI beside the other tests, docs/benchmarks/test_suite_time.md); README.md and every page within their
lengths; the generated options page lists every trainer option, every ``fit`` argument, every
Spark ML Param and every job flag, read here from the code independently of the generator; the
Architecture page names every module of the package.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

from site_build import built_site  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier

ROOT = Path(__file__).resolve().parents[2]

DOCS = ROOT / "docs"
README_MAX_LINES = 250
PAGE_MAX_LINES = 400
JOBS = ("train", "evaluate", "predict", "advise", "train_digits", "train_images")


def test_strict_build_is_clean(built_site):
    site, _, output = built_site
    assert (site / "index.html").is_file() and (site / "reference" / "options" / "index.html").is_file()
    assert "WARNING" not in output, output[-4000:]


def test_home_page_is_the_readme(built_site):
    site, _, _ = built_site
    html = (site / "index.html").read_text(encoding="utf-8")
    assert "synchronous parameter averaging" in html and "make train" in html


def test_every_benchmark_page_is_in_the_nav(built_site):
    """A new docs/benchmarks/<study>.md joins the nav with no edit of mkdocs.yml (docs/hooks/site.py)."""
    site, _, _ = built_site
    nav = (site / "index.html").read_text(encoding="utf-8")
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        target = "benchmarks/" if page.stem == "index" else f"benchmarks/{page.stem}/"
        assert f'href="{target}"' in nav, f"the nav does not list docs/benchmarks/{page.name}"


def test_api_page_shows_the_trainers_options_in_its_signature(built_site):
    """The constructor's signature is generated from the options table; the API page must show it, not ``**options``."""
    site, _, _ = built_site
    html = re.sub(r"<[^>]+>", "", (site / "reference" / "api" / "index.html").read_text(encoding="utf-8"))
    start = html.index("ParameterAveragingTrainer(")
    shown = html[start:html.index(")", start)]
    for name in ("num_workers", "averaging_frequency", "state_transport", "optimizer_state"):
        assert name in shown, f"the API page's trainer signature lacks {name}: {shown[:300]!r}"
    assert "**options" not in shown


def test_readme_and_pages_are_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= README_MAX_LINES, f"README.md has {len(readme)} lines (at most {README_MAX_LINES})"
    long = {str(p.relative_to(DOCS)): n for p in DOCS.rglob("*.md")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > PAGE_MAX_LINES}
    assert not long, f"pages over {PAGE_MAX_LINES} lines: {long}"


def test_a_link_without_a_target_fails_the_build():
    """MkDocs' own validation lets ``[text]()`` through; the site's hook refuses it, naming the page and the link."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("docs_site_hooks", DOCS / "hooks" / "site.py")
    hooks = importlib.util.module_from_spec(spec)  # (not "site": the standard library's is imported already)
    spec.loader.exec_module(hooks)
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_path="guides/x.md"))
    with pytest.raises(ValueError, match=r"^guides/x\.md: links without a target: \[docs/advisor\.md\]\(\)$"):
        hooks.on_page_markdown("See [docs/advisor.md]() and [the guide](guide.md).", page)
    assert hooks.on_page_markdown("See [the guide](guide.md).", page) == "See [the guide](guide.md)."


# ----------------------------------------------------------------- the options page


@pytest.fixture(scope="module")
def options_page(built_site):
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import options_page as generator
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    text = generator.render()
    site, _, _ = built_site
    assert "num_workers" in (site / "reference" / "options" / "index.html").read_text(encoding="utf-8")
    return text


def _first_cells(text: str) -> set:
    """The backticked first cell of every table row."""
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", text, re.MULTILINE)}


def _section(text: str, title: str) -> str:
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def test_options_page_lists_every_trainer_option(options_page):
    from sparkdl_avg import ParameterAveragingTrainer

    names = [n for n in inspect.signature(ParameterAveragingTrainer.__init__).parameters if n not in ("self", "model")]
    listed = _first_cells(_section(options_page, "## The trainer"))
    missing = [n for n in names if n not in listed]
    assert not missing, f"the options page lacks trainer options {missing}"
    assert "`model` (required)" in options_page


def test_options_page_lists_every_fit_argument_with_its_default(options_page):
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.config.codegen import literal

    section = _section(options_page, "## `trainer.fit(data, ...)`")
    for name, p in inspect.signature(ParameterAveragingTrainer.fit).parameters.items():
        if name == "self":
            continue
        row = re.search(rf"^\| `{name}` \|[^|]*\| ([^|]*) \|", section, re.MULTILINE)
        assert row, f"the options page has no row for fit's {name}"
        expected = "required" if p.default is inspect.Parameter.empty else f"`{literal(p.default)}`"
        assert row.group(1) == expected, f"fit's {name}: the page says {row.group(1)}, the code {expected}"


def test_options_page_lists_every_param_of_the_spark_ml_stages(options_page):
    from sparkdl_avg.ml import KerasAveragingEstimator, KerasAveragingModel

    mentioned = set(re.findall(r"`(\w+)`", options_page))
    for stage in (KerasAveragingEstimator(), KerasAveragingModel()):
        missing = sorted(p.name for p in stage.params if p.name not in mentioned)
        assert not missing, f"{type(stage).__name__}: Params missing from the options page: {missing}"


def _help(job: str) -> str:
    """What ``jobs/<job>.py --help`` prints (its module run here, its parser's own help)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location(f"_docs_test_job_{job}", ROOT / "jobs" / f"{job}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        module.parse_args(["--help"])
    return out.getvalue()


@pytest.mark.parametrize("job", JOBS)
def test_options_page_lists_every_job_flag(options_page, job):
    """The flags as ``--help`` prints them (read from the help text, not through the page's generator)."""
    # argparse lists each option as "  --flag METAVAR, -f METAVAR   help": the flags before the help text
    invocations = re.findall(r"^  (-.*?)(?:\s{2,}|$)", _help(job), re.MULTILINE)
    flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", " ".join(invocations))) - {"--help"}
    section = options_page.split(f"### `jobs/{job}.py`", 1)[1].split("\n### ", 1)[0]
    listed = set(re.findall(r"(--[a-z][a-z0-9-]*)", " ".join(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))))
    assert flags <= listed, f"jobs/{job}.py's flags missing from the options page: {sorted(flags - listed)}"
    assert listed <= flags, f"the options page lists flags jobs/{job}.py does not have: {sorted(listed - flags)}"


def test_options_page_agrees_with_the_option_table(options_page):
    from sparkdl_avg.driver.config import options
    from sparkdl_avg.driver.config.codegen import literal

    for o in options.OPTIONS:
        row = re.search(rf"^\| `{o.name}` \| `[^|]*` \| `([^|]*)` \|", options_page, re.MULTILINE)
        assert row, f"the options page has no row for {o.name}"
        assert row.group(1) == literal(o.default).replace("|", "\\|"), f"{o.name}'s default on the page: {row.group(1)}"


# ----------------------------------------------------------------- the architecture page


def test_layout_names_every_module_and_every_module_says_what_it_owns():
    package = ROOT / "sparkdl_avg"
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1]
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 8, f"{relative} has no module docstring saying what it owns"
        if path.name == "__init__.py":
            below = f"{relative.parent.name}/"  # a folder: in the tree
            assert below in layout or len(relative.parts) == 1, f"the layout does not name {relative.parent}/"
        elif len(relative.parts) == 1:  # the root's modules: in the tree
            assert path.name in layout, f"the layout does not name {relative}"
        elif relative.parts[0] == "driver" and len(relative.parts) == 2:  # the driver's shims of old paths
            assert f"driver/{path.name}" in layout, f"the layout does not name {relative}"
        else:  # a side's modules: in its part of the table, by their path below the side
            side = layout.split(f"**{relative.parts[0]}/**", 1)[1].split("| **", 1)[0]
            name = "/".join(relative.parts[1:])
            assert f"`{name}`" in side, f"the layout does not name {relative} under {relative.parts[0]}/"


def test_layout_names_every_update_rule():
    """Issue 49: the hand-kept layout said "plain, BMUF, SlowMo" after DiLoCo and OuterOptimizer came."""
    from sparkdl_avg.driver.algorithms import registry

    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    rules_row = next(line for line in text.splitlines() if line.startswith("| `algorithms/rules.py`"))
    for cls in registry.RULES.entries():
        if not cls.__module__.startswith("sparkdl_avg."):
            continue  # a user's rule, registered by another test in this process (tests/api/test_extensions.py)
        assert f"`{cls.__name__}`" in rules_row, f"the layout's rules row does not name {cls.__name__}: {rules_row}"


def test_every_example_imports_sparkdl_avg_before_keras():
    """README's rule: ``import sparkdl_avg`` first, which imports TensorFlow with its start-up notices filtered; a
    page's example that imports keras or tensorflow before it prints those notices (issue 60 item 17)."""
    first_import = re.compile(r"^(?:import|from) (sparkdl_avg|keras|tensorflow)\b", re.M)
    late = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M):
            names = first_import.findall(block)
            if "sparkdl_avg" in names and names[0] != "sparkdl_avg":
                late.append(f"{page.relative_to(ROOT)}: {names[0]} before sparkdl_avg")
    assert not late, late


INTERNAL_TITLE = re.compile(r"\bissues?\s*#?\d+|\b(?:first|second|third|fourth|fifth|\d+(?:st|nd|rd|th)) session\b",
                            re.IGNORECASE)


def test_no_title_says_how_the_docs_were_made(built_site):
    """The nav and every page's headings say what a page measures or explains, never the issue or the working
    session it came from (issue 60 item 20: the Benchmarks section opened with "the trial of issue 48, part 2")."""
    site, _, _ = built_site
    nav = re.findall(r'class="md-nav__link[^"]*"[^>]*>(.*?)</(?:a|label)>',
                     (site / "index.html").read_text(encoding="utf-8"), re.S)
    titles = {" ".join(re.sub(r"<[^>]+>", " ", t).split()) for t in nav} - {""}
    assert len(titles) > 20, f"the nav's titles were not found in the built index.html: {sorted(titles)}"
    bad = [f"nav: {t}" for t in titles if INTERNAL_TITLE.search(t)]
    for page in sorted(DOCS.rglob("*.md")):
        fence = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fence = not fence
            elif not fence and re.match(r"#{1,6} ", line) and INTERNAL_TITLE.search(line):
                bad.append(f"{page.relative_to(DOCS)}: {line}")
    assert not bad, bad
