"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

- ``index.md`` is README.md (one source), its links rewritten for the site: ``docs/X`` → ``X``,
  and links to other files of the repository (jobs, notebooks) kept as their path in code.
- ``reference/options.md`` is generated from the option table (``options_page.render``).
- A link without a target (``[text]()``) fails the build.
- Every page under ``docs/benchmarks/`` joins the nav's "Benchmarks" section, after the pages the
  nav names, in the order of their titles: a new study needs no edit of mkdocs.yml.
- Benchmark pages rank below the guides in the site's search (``search: boost: 0.5``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import options_page  # noqa: E402


def readme_for_site(text: str) -> str:
    """README.md's text with its links made the site's."""

    def link(match: re.Match) -> str:
        bang, label, target = match.group(1), match.group(2), match.group(3)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        if target.startswith("docs/"):
            return f"{bang}[{label}]({target[len('docs/'):]})"
        return label if label.startswith("`") else f"{label} (`{target}`)"

    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        out.append(line if fence else re.sub(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)", link, line))
    return "\n".join(out) + "\n"


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


BENCHMARK_SEARCH_BOOST = 0.5


def on_page_markdown(markdown, page, **kwargs):
    """Refuses a link without a target (``[text]()``), which MkDocs' link validation lets through.

    Ranks the benchmark pages (long tables of measurements) below the guides in the site's search:
    material's search takes a page's ``search: boost:`` front matter, set here for every page under
    ``benchmarks/`` that gives none (the generated options page sets 0.5 itself).
    """
    empty = re.findall(r"\[[^\]]*\]\(\s*\)", markdown)
    if empty:
        raise ValueError(f"{page.file.src_path}: links without a target: {', '.join(empty)}")
    meta = getattr(page, "meta", None)
    if meta is not None and page.file.src_path.replace("\\", "/").startswith("benchmarks/"):
        search = meta.setdefault("search", {})
        if isinstance(search, dict):
            search.setdefault("boost", BENCHMARK_SEARCH_BOOST)
    return markdown


def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Benchmarks" in entry:
            section = entry["Benchmarks"]
            named = {next(iter(e.values())) if isinstance(e, dict) else e for e in section}
            extra = sorted((p for p in (docs / "benchmarks").glob("*.md")
                            if f"benchmarks/{p.name}" not in named), key=_title)
            section.extend(f"benchmarks/{p.name}" for p in extra)
    return config


def on_files(files, config, **kwargs):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme_for_site(readme)))
    files.append(File.generated(config, "reference/options.md", content=options_page.render()))
    return files
