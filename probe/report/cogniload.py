"""The CogniLoad section of a report (family ``cogniload``; docs/cogniload.md), drawn from a
:class:`probe.analysis.cogniload.CogniloadResult` and registered with :func:`probe.report.sections.register_section`.

Each job is its own module: :mod:`~probe.report.cogniload_figures` (figures), :mod:`~probe.report.cogniload_html`
(``report.html`` and the comparison page), :mod:`~probe.report.cogniload_markdown` (``analysis.md``),
:mod:`~probe.report.cogniload_tables` (``tables/*.csv``) and :mod:`~probe.report.cogniload_text` (labels, summary
sentences, the lines under the main table). This module adds the rows of the main table and the merge of several
runs' results for ``probe compare``.
"""

from __future__ import annotations

from dataclasses import replace

from probe.analysis.cogniload import FAMILY, CogniloadResult, KnobCells
from probe.analysis.cogniload_attention import NeedleHaySummary
from probe.analysis.estimates import Cell
from probe.report.sections import ReportSection
from probe.report.cogniload_html import section_html
from probe.report.cogniload_markdown import markdown
from probe.report.cogniload_tables import tables
from probe.report.cogniload_text import main_lines


def main_rows(result: CogniloadResult) -> list[tuple[Cell, str]]:
    """Each model's pooled accuracy cell (condition ``CogniLoad``, load ``all``)."""
    return [(result.cells[m].overall, "") for m in sorted(result.cells)]


def merge(named: list[tuple[str, CogniloadResult]]) -> CogniloadResult:
    """Several runs' CogniLoad results as one, each model renamed ``<run>: <model>``."""
    def cells(label: str, k: KnobCells) -> KnobCells:
        def ren(c: Cell) -> Cell:
            return replace(c, model=f"{label}: {c.model}")
        return replace(k, overall=ren(k.overall), d=tuple(map(ren, k.d)), N=tuple(map(ren, k.N)),
                       rho=tuple(map(ren, k.rho)))

    attention = None
    with_att = [(label, r.attention) for label, r in named if r.attention is not None]
    if with_att:
        first = with_att[0][1]
        assert first is not None
        attention = NeedleHaySummary(definition=first.definition, alpha=first.alpha,
                                     models={f"{label}: {m}": a for label, att in with_att
                                             for m, a in (att.models.items() if att is not None else ())})
    return CogniloadResult(
        n_bootstrap=named[0][1].n_bootstrap, seed=named[0][1].seed,
        models={f"{label}: {m}": s for label, r in named for m, s in r.models.items()},
        cells={f"{label}: {m}": cells(label, k) for label, r in named for m, k in r.cells.items()},
        attention=attention)


SECTION = ReportSection(
    family=FAMILY, html=section_html, markdown=markdown, tables=tables, main_rows=main_rows, main_lines=main_lines,
    merge=merge, compare_html=section_html)
