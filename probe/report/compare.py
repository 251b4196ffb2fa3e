"""``compare_runs``: several analysed runs side by side in one self-contained page (docs/records.md#report)."""

from __future__ import annotations

import logging
from pathlib import Path

from probe.analysis.families import family_order
from probe.analysis.results import Analysis, AnalysisFileError, read_analysis
from probe.errors import ProbeError
from probe.report.html import esc, page, plain_figure_text
from probe.report.sections import ReportContext, report_section
from probe.runfolder import RunFolder, write_atomic

log = logging.getLogger(__name__)


class CompareError(ProbeError):
    """The runs cannot be compared as analysed (a missing or stale analysis, or different settings)."""


def read_analyses(run_dirs: list[Path]) -> list[tuple[str, Analysis]]:
    """(label, analysis) of each run folder, as on disk; labels are folder names, made unique.

    Raises:
        CompareError: a run has no usable analysis (names the run and says what to do).
    """
    named: list[tuple[str, Analysis]] = []
    labels: list[str] = []
    for d in run_dirs:
        label = Path(d).name
        label = label if label not in labels else f"{label}#{len(labels)}"
        labels.append(label)
        try:
            named.append((label, read_analysis(RunFolder(d))))
        except AnalysisFileError as e:
            raise CompareError(f"compare reads each run's analysis.json as it is and re-estimates nothing; run "
                               f"{label!r}: {e}") from None
    return named


@plain_figure_text
def compare_runs(run_dirs: list[Path], out: Path) -> Path:
    """Write ``out/report.html`` and ``out/figures/*.png`` comparing several analysed run folders.

    Args:
        run_dirs: run folders, each analysed (``probe analyze``) since its trials last changed.
        out: output folder.

    Returns:
        Path of the comparison page.

    Raises:
        CompareError: no run folder given; a run's analysis is missing, stale or of another schema; the runs were
            analysed with different alpha (their significance marks would not compare).
    """
    if not run_dirs:
        raise CompareError("compare: give at least one run folder")
    named = read_analyses(run_dirs)
    alphas = {a.settings.alpha for _, a in named}
    if len(alphas) > 1:
        raise CompareError(f"runs analysed with different alpha {sorted(alphas)}; re-analyse them with one alpha")
    folder = RunFolder(out)
    ctx = ReportContext(named[0][1].settings, folder.figures)
    parts = []
    for family in family_order({f for _, a in named for f in a.families}):
        section = report_section(family)
        parts.append(section.html(section.merged([(label, a.families[family]) for label, a in named
                                                   if family in a.families]), ctx))
    runs = "".join(f"<li><b>{esc(label)}</b>: <code>{esc(d)}</code>, {a.n_trials} trials, trials sha256 "
                   f"{esc(a.inputs.trials_sha256[:12])}…, analysed {esc(a.created)}</li>"
                   for (label, a), d in zip(named, run_dirs))
    with_interventions = [(label, a.interventions) for label, a in named if a.interventions is not None]
    if with_interventions:
        section = report_section("interventions")
        parts.append(section.html(section.merged(with_interventions), ctx))
    body = f"<h1>ICE-Probe comparison of {len(run_dirs)} run(s)</h1><ul>{runs}</ul>" + "".join(parts)
    write_atomic(folder.report, page("ICE-Probe comparison", body), root=folder.root)
    log.info("%s: comparison of %d runs", folder.report, len(run_dirs))
    return folder.report


__all__ = ["CompareError", "compare_runs", "read_analyses"]
