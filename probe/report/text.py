"""The plain-text main table the CLI prints: EM per model × condition × load, each family's lines below it.

:func:`main_table_text` renders an analysis (``probe analyze``); :func:`main_table` renders the cells of a run's
trials without analysing it (``probe run``, :func:`probe.analysis.tabulate_run`). Rows and lines come from each
family's report section (:mod:`probe.report.sections`).
"""

from __future__ import annotations

from pathlib import Path

from probe import formatting as fmt
from probe.analysis.estimates import Cell
from probe.analysis.results import Analysis
from probe.analysis.run import tabulate_run
from probe.runfolder import RunFolder

MAIN_HEADER = ["model", "condition", "load", "n", "EM mean (SEM)", "95% CI (clustered)", "strict EM", "hop recall",
               "truncated", "uninterp.", "errors", "skipped", "scoring path"]
# short names of the scoring rules (probe.scoring.answers.Extraction), in the order the scorer tries them
PATH_NAMES = {"boxed": "box", "answer_line": "line", "last_line": "last", "echo": "echo", "poi_category": "poi+cat",
              "poi": "poi", "last": "last", "none": "none"}
PATH_LEGEND = ("scoring path: share of outputs decided by a box, an Answer: line, the last line (last), a last line "
               "refused as an echo of the gold (echo) or nothing (none); strict EM counts box and line answers only; "
               "§ = the mix differs from Control's (sign-flip test by question, p < alpha)")


def scoring_path(c: Cell) -> str:
    """The cell's share of each scoring rule, e.g. ``box 40% line 10% last 50%``, and ``§ p=…`` when flagged."""
    if c.extraction_shares is None:
        return fmt.DASH
    order = list(PATH_NAMES)
    shares = sorted(c.extraction_shares.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    text = " ".join(f"{PATH_NAMES.get(k, k)} {fmt.pct(v)}" for k, v in shares)
    return f"{text} § p={fmt.p_value(c.scoring_path_p)}" if c.scoring_path_shift else text


def cell_row(c: Cell, mark: str = "") -> list[str]:
    """One row of the main table (``load`` ``all`` for a cell pooled over loads); ``mark`` follows the model."""
    em = fmt.DASH if c.em_mean is None else f"{fmt.num(c.em_mean)} ({fmt.num(c.em_sem)})"
    return [
        f"{c.model}{mark}", c.condition, "all" if c.load is None else str(c.load), str(c.n), em,
        fmt.ci(c.em_ci_low, c.em_ci_high), fmt.num(c.strict_em_mean), fmt.num(c.hop_recall_mean, ".2f"),
        fmt.pct(c.truncated_rate), fmt.pct(c.uninterpretable_rate), str(c.n_error), str(c.n_skipped),
        scoring_path(c),
    ]


def main_table_text(analysis: Analysis) -> str:
    """The main table as aligned plain text, each family's lines (taxonomy, H1, thresholds…) below it.

    Args:
        analysis: an analysis (or the cells-only one of :func:`probe.analysis.tabulate_run`).

    Returns:
        Multi-line text.
    """
    from probe.report.sections import report_section

    rows = [MAIN_HEADER]
    lines: list[str] = []
    for name, result in analysis.families.items():
        section = report_section(name)
        rows += [cell_row(c, mark) for c, mark in section.rows(result)]
        lines += section.lines(result, analysis.settings)
    if analysis.interventions is not None:
        lines += report_section("interventions").lines(analysis.interventions, analysis.settings)
    widths = [max(len(r[i]) for r in rows) for i in range(len(MAIN_HEADER))]
    out = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*out, PATH_LEGEND, "", *lines])


def main_table(run_dir: str | Path | RunFolder) -> str:
    """The main table of a run folder's trials (cells only), computed without writing anything."""
    return main_table_text(tabulate_run(run_dir))


__all__ = ["MAIN_HEADER", "PATH_LEGEND", "cell_row", "main_table", "main_table_text", "scoring_path"]
