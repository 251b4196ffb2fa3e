"""``render_report``: a run folder's ``analysis.json`` (+ ``attention_summary.npz``) -> ``report.html`` and figures
(docs/records.md#report)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from probe.analysis.results import Analysis, read_analysis
from probe.report.html import esc, page, plain_figure_text
from probe.report.sections import ReportContext, report_section
from probe.records import check_records
from probe.runfolder import RunFolder, write_atomic

log = logging.getLogger(__name__)


def _header(analysis: Analysis, title: str) -> str:
    imp = analysis.imported
    imp_html = ""
    if imp is not None:
        imp_html = (f"<p>Imported from <code>{esc(imp.file)}</code> ({imp.n_rows} rows, sha256 "
                    f"{esc(imp.sha256[:12])}…): {imp.n_error} backend errors and {imp.n_skipped} empty outputs are "
                    f"not scored; {imp.n_truncated} outputs recognised as truncated "
                    f"(rule: {esc(imp.truncation_rule)}).</p>")
    return (f"<h1>{esc(title)}</h1>"
            f"<p class=\"note\">{analysis.n_trials} trials ({analysis.n_scored} scored, {analysis.n_error} errors, "
            f"{analysis.n_skipped} skipped) from <code>{esc(analysis.inputs.trials)}</code>, sha256 "
            f"{esc(analysis.inputs.trials_sha256[:12])}…; analysed {esc(analysis.created)} (seed {analysis.seed}, "
            f"{esc(analysis.seed_source)}).</p>{imp_html}")


@plain_figure_text
def render_report(run_dir: str | Path | RunFolder) -> Path:
    """Write ``report.html`` (self-contained) and ``figures/*.png`` for an analysed run folder.

    Args:
        run_dir: the run folder (``probe analyze`` has written its ``analysis.json``).

    Returns:
        Path of ``report.html``.

    Raises:
        RecordError: a record file of the run holds a damaged line (``file:line``): nothing is written.
        AnalysisFileError: the analysis is missing, stale or of another schema (the message says to run
            ``probe analyze``).
    """
    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    check_records(run)  # a damaged record is named as such, not reported as a stale analysis
    analysis = read_analysis(run)
    ctx = ReportContext(analysis.settings, run.figures)
    sections = "".join(report_section(name).html(result, ctx) for name, result in analysis.families.items())
    if analysis.interventions is not None:  # the causal tests (probe.report.interventions)
        sections += report_section("interventions").html(analysis.interventions, ctx)
    notes = "".join(f"<li>{esc(n)}</li>" for n in analysis.notes)
    methods = "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in analysis.methods.items())
    title = f"ICE-Probe report: {run.name}"
    body = (_header(analysis, title) + sections
            + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
            + f"<h2>Methods</h2><ul>{methods}</ul>")
    write_atomic(run.report, page(title, body), root=run.root)
    if ctx.drawn:  # the figures in the report's order, with its captions (the results page follows it)
        write_atomic(run.figure_index, json.dumps([{"file": f.name, "caption": c} for f, c in ctx.drawn], indent=1),
                     root=run.root)
    log.info("%s: report with %d figures", run.report, len(ctx.drawn))
    return run.report


__all__ = ["render_report"]
