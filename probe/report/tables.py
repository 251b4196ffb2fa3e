"""``analysis.md`` and ``tables/*.csv``: views of an :class:`probe.analysis.Analysis`; nothing here estimates."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any, Iterable

from probe.analysis.results import Analysis
from probe.codec import encode
from probe.records_import import ImportSummary
from probe.report.blocks import md_cell, md_table
from probe.report.sections import Rows, report_section
from probe.report.text import MAIN_HEADER, PATH_LEGEND, cell_row
from probe.runfolder import RunFolder, write_atomic

log = logging.getLogger(__name__)

def rows_of(items: Iterable[object], **extra: Any) -> Rows:
    """CSV rows of result objects: their JSON form, with ``extra`` columns first."""
    return [{**extra, **encode(item)} for item in items]


def _flatten(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}_"))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            continue  # nested rows (scatter points, layers) go to their own files
        else:
            out[f"{prefix}{k}"] = v
    return out


def _flat_table(rows: Rows) -> tuple[list[dict], list[str]]:
    """(flattened rows, every column in order of first appearance)."""
    flat = [_flatten(r) for r in rows]
    names: list[str] = []
    for r in flat:
        names += [k for k in r if k not in names]
    return flat, names


def csv_text(rows: Rows) -> str:
    """CSV text of rows (flattened; a missing value is an empty cell); "" without rows."""
    if not rows:
        return ""
    flat, names = _flat_table(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    w.writeheader()
    for r in flat:
        w.writerow({k: "" if r.get(k) is None else csv_safe(r.get(k)) for k in names})
    return buf.getvalue()


def csv_safe(value: Any) -> Any:
    """A CSV cell that a spreadsheet will not run as a formula: text (not a number) starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return gets a leading ``'``, as OWASP advises (a task id from a shared file
    is text a user opens in a spreadsheet)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


def import_lines(imp: ImportSummary | None) -> list[str]:
    """Markdown lines on how another tool's file was imported (none for the toolkit's own runs)."""
    if imp is None:
        return []
    return [f"Imported from `{imp.file}` ({imp.n_rows} rows; mapping "
            + ", ".join(f"{k}={v}" for k, v in imp.mapping.items())
            + (f", preset {imp.preset}" if imp.preset else "") + "). "
            f"{imp.n_error} backend errors and {imp.n_skipped} empty outputs are not scored; "
            f"{imp.n_truncated} outputs recognised as truncated (rule: {imp.truncation_rule}).", ""]


def render_markdown(analysis: Analysis) -> str:
    """``analysis.md``: header, the main table, every family's part, notes."""
    rows: list[list[str]] = []
    for name, result in analysis.families.items():
        rows += [cell_row(c, mark) for c, mark in report_section(name).rows(result)]
    parts = [f"# Analysis of {analysis.run_dir}", "",
             f"{analysis.n_trials} trials from `{analysis.inputs.trials}` "
             f"(sha256 {analysis.inputs.trials_sha256[:12]}…).", "",
             *import_lines(analysis.imported),
             "## EM per model × condition × load", "", md_table(MAIN_HEADER, rows), "", PATH_LEGEND + ".", ""]
    for name, result in analysis.families.items():
        parts += report_section(name).markdown(result, analysis.settings)
    if analysis.interventions is not None:
        parts += report_section("interventions").markdown(analysis.interventions, analysis.settings)
    if analysis.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in analysis.notes] + [""]
    return "\n".join(parts)


def write_tables(analysis: Analysis, run_dir: str | Path | RunFolder) -> list[Path]:
    """Write ``analysis.md`` and every family's ``tables/*.csv`` into the run folder.

    Args:
        analysis: the run's analysis (:func:`probe.analysis.analyze_run` or :func:`probe.analysis.read_analysis`).
        run_dir: the run folder.

    Returns:
        The paths written.
    """
    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    written: list[Path] = []
    parts: list[tuple[str, object]] = list(analysis.families.items())
    if analysis.interventions is not None:
        parts.append(("interventions", analysis.interventions))
    for name, result in parts:
        for table, rows in report_section(name).tables(result):
            path = run.tables / f"{table}.csv"
            write_atomic(path, csv_text(rows), root=run.root)
            written.append(path)
    write_atomic(run.analysis_md, render_markdown(analysis), root=run.root)
    written.append(run.analysis_md)
    log.info("%s: analysis.md and %d tables written", run.root, len(written) - 1)
    return written


__all__ = ["csv_text", "import_lines", "md_cell", "md_table", "render_markdown", "rows_of", "write_tables"]
