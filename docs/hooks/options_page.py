"""The site's options page, generated from the code at build time (``reference/options.md``).

Everything on it is read from where it is declared, so it cannot drift: the option table
(:data:`sparkdl_avg.driver.config.options.OPTIONS`: name, type, default, allowed values, the
jobs' flag, the estimator's Param, the one-line help), ``fit``'s signature and docstring for
its arguments that have no row, the Spark ML stages' Params, and every job's argparse parser
(captured by running its ``parse_args`` with ``parse_args`` itself stubbed out).
``tests/docs/test_site.py`` compares the page with the code.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("train", "evaluate", "predict", "advise", "train_digits", "train_images")


def cell(text) -> str:
    """``text`` made safe for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def code(text) -> str:
    return f"`{text}`" if text not in ("", None) else "—"


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def job_parser(name: str) -> argparse.ArgumentParser:
    """The argparse parser of ``jobs/<name>.py``, as its ``parse_args`` builds it."""
    spec = importlib.util.spec_from_file_location(f"_sparkdl_avg_docs_job_{name}", ROOT / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        module.parse_args([])
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise RuntimeError(f"jobs/{name}.py's parse_args did not call ArgumentParser.parse_args")


def job_flags(name: str) -> List[Tuple[str, str, str]]:
    """``[(flags, default, help)]`` of every option of ``jobs/<name>.py`` but ``--help``."""
    rows = []
    for action in job_parser(name)._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            default = ""
        elif action.required:
            default = "required"
        else:
            default = "" if action.default in (None, argparse.SUPPRESS) else repr(action.default)
        help_text = (action.help or "") % {"default": action.default} if action.help else ""
        if action.choices:
            help_text += f" (one of {', '.join(map(str, action.choices))})"
        rows.append((", ".join(action.option_strings), default, help_text))
    return rows


def _docstring_args(func) -> Dict[str, str]:
    """``{argument: its first sentence}`` from a Google-style ``Args:`` section."""
    doc = inspect.getdoc(func) or ""
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    section = re.split(r"\n\S", section, maxsplit=1)[0]
    out: Dict[str, str] = {}
    for match in re.finditer(r"^    (\w+): (.*?)(?=^    \w+: |\Z)", section, re.MULTILINE | re.DOTALL):
        text = " ".join(match.group(2).split())
        out[match.group(1)] = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0]
    return out


def render() -> str:
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.config import options as table
    from sparkdl_avg.driver.config.codegen import literal
    from sparkdl_avg.ml import KerasAveragingEstimator, KerasAveragingModel

    def flag(o) -> str:
        return "—" if o.cli is None else code(o.cli.flag or "--" + o.name.replace("_", "-"))

    def param(o) -> str:
        return "—" if o.param is None else code(o.param.name)

    def allowed(o) -> str:
        return cell(o.check) if o.check is not None else "any"

    header = ("| option | type | default | allowed values | job flag | Spark ML Param | what it is |\n"
              "|---|---|---|---|---|---|---|")

    def rows(scope) -> str:
        return "\n".join(
            f"| `{o.name}` | `{cell(o.annotation)}` | `{cell(literal(o.default))}` | {allowed(o)} | {flag(o)} "
            f"| {param(o)} | {cell(o.help)}{cell('; None: ' + o.unset) if o.unset else ''} |"
            for o in table.of(scope))

    out = [
        "---",
        "hide: [toc]",  # the tables need the width
        "search:",
        "  boost: 0.5",  # a table of every option: the guides explain them, so search ranks them first
        "---",
        "",
        "# Options",
        "",
        "Generated from the code when the site is built (`docs/hooks/options_page.py`): the option table",
        "`sparkdl_avg/driver/config/options.py` (every entry point derives its options from it), `fit`'s",
        "signature, the Spark ML stages' Params and the jobs' parsers. "
        "`tests/docs/test_site.py` checks it against them.",
        "A value the option refuses raises a `ConfigurationError` that names the option (the flag in the",
        "jobs, the Param in the estimator) and says what it must be: the *allowed values* column.",
        "",
        "## The trainer: `ParameterAveragingTrainer(model, ...)`",
        "",
        "`model` (required): a compiled `keras.Model` with fully known input shapes, trained in place",
        "(`trainer.model`). The estimator takes it as `kerasModel` (a model or a `.keras` path), the jobs as",
        "`--model FILE.keras` or `--model-builder MODULE:FUNCTION`.",
        "",
        header,
        rows(table.TRAINER),
        "",
        "The update rule's numbers, given flat by the jobs and the estimator (the trainer takes a rule",
        "object or a spec such as `\"slowmo:slow_momentum=0.7\"` instead):",
        "",
        header,
        rows(table.RULE),
        "",
        "## `trainer.fit(data, ...)`",
        "",
        "Returns a `keras.callbacks.History` with one value per epoch of the loss, each compiled metric and,",
        "with `validation_data`, their `val_*`. Arguments without a row in the option table (no flag or Param",
        "of their own) are documented from `fit`'s docstring.",
        "",
        header,
    ]
    rows_by_name = {o.name: o for o in table.of(table.FIT)}
    args = _docstring_args(ParameterAveragingTrainer.fit)
    for name, p in inspect.signature(ParameterAveragingTrainer.fit).parameters.items():
        if name == "self":
            continue
        o = rows_by_name.get(name)
        if o is not None:
            out.append(f"| `{o.name}` | `{cell(o.annotation)}` | `{cell(literal(o.default))}` | {allowed(o)} "
                       f"| {flag(o)} | {param(o)} | {cell(o.help)} |")
        else:
            default = "required" if p.default is inspect.Parameter.empty else f"`{cell(literal(p.default))}`"
            annotation = "—" if p.annotation is inspect.Parameter.empty else f"`{cell(p.annotation)}`"
            out.append(f"| `{name}` | {annotation} | {default} | see the description | — | — | "
                       f"{cell(args.get(name, ''))} |")
    out += [
        "",
        "## MLflow tracking: `MlflowLogger(...)` and the `mlflow*` flags and Params",
        "",
        header,
        rows(table.TRACKING),
        "",
        "## Spark ML stages",
        "",
        "`KerasAveragingEstimator`'s Params are the rows above that name one, plus these; "
        "`KerasAveragingModel` (what `fit` returns) has the ones marked.",
        "",
        "| Param | estimator | model | default | what it is |",
        "|---|---|---|---|---|",
    ]
    from_rows = {o.param.name for o in table.OPTIONS if o.param is not None}
    estimator, model = KerasAveragingEstimator(), KerasAveragingModel()
    model_params = {p.name for p in model.params}
    seen = set()
    for stage in (estimator, model):
        for p in stage.params:
            if p.name in from_rows or p.name in seen:
                continue
            seen.add(p.name)
            default = stage.getOrDefault(p) if stage.hasDefault(p) else None
            shown = "unset" if default is None else f"`{cell(literal(default))}`"
            out.append(f"| `{p.name}` | {'yes' if estimator.hasParam(p.name) else '—'} "
                       f"| {'yes' if p.name in model_params else '—'} | {shown} | {cell(p.doc)} |")
    out += ["", "`kerasModel`: the compiled `keras.Model` or the path of a `.keras` file (constructor or "
            "`setKerasModel`); each `fit` trains a fresh copy.", ""]
    out += ["## The jobs' flags", "",
            "Every flag of `jobs/*.py` (`--help` prints the same). The training options above are the same",
            "rows; a bad flag ends the job with one `error:` line naming it, before any training round.", ""]
    for name in JOBS:
        out += [f"### `jobs/{name}.py`", "", "| flag | default | what it is |", "|---|---|---|"]
        for flags, default, help_text in job_flags(name):
            out.append(f"| `{cell(flags)}` | {code(cell(default)) if default else '—'} | {cell(help_text)} |")
        out.append("")
    return _wrap_tables("\n".join(out)) + "\n"


def _wrap_tables(text: str) -> str:
    """Each Markdown table of ``text`` in a ``<div class="options-table">`` (md_in_html): the site's CSS
    (docs/stylesheets/extra.css) keeps the code in its cells (option names, flags, Params) unbroken."""
    out: List[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        row, before = line.startswith("|"), i > 0 and lines[i - 1].startswith("|")
        if row and not before:
            out += ['<div class="options-table" markdown>', ""]
        out.append(line)
        if row and not (i + 1 < len(lines) and lines[i + 1].startswith("|")):
            out += ["", "</div>"]
    return "\n".join(out)
