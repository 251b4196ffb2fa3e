"""Report sections: one per task family, registered under the family's name, as the analyses are
(docs/architecture.md#how-one-trial-flows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from probe.analysis.estimates import Cell
from probe.config import AnalysisSection
from probe.registry import Registry
from probe.report.blocks import Block, ReportContext, merge_results, to_html, to_markdown

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class ReportSection:
    """One family's part of every rendering, as registered: the blocks it says (``report.html``, a ``probe compare``
    page, ``analysis.md`` and a results page are these blocks rendered), the numbers it publishes (``tables``) and,
    optionally, its rows and lines of the plain-text main table.

    Attributes:
        family: the family's name (its analysis' name).
        blocks: ``(result, settings) -> [Block]`` (:mod:`probe.report.blocks`), of one run's result or of several
            runs' results merged.
        tables: ``result -> [(name, rows)]``: ``tables/<name>.csv`` (rows of flat values).
        main_rows: ``result -> [(cell, mark)]``: its rows of the main EM table (a mark follows the model's name).
        main_lines: ``(result, settings) -> lines``: its lines below the main table.
        merge: ``[(run label, result)] -> result`` where rows cannot simply be joined; None:
            :func:`probe.report.blocks.merge_results` (every model renamed ``<run>: <model>``, every row kept).
    """

    family: str
    blocks: Callable[[Any, AnalysisSection], list[Block]]
    tables: Callable[[Any], list[tuple[str, Rows]]]
    main_rows: Callable[[Any], list[tuple[Cell, str]]] | None = None
    main_lines: Callable[[Any, AnalysisSection], list[str]] | None = None
    merge: Callable[[list[tuple[str, Any]]], Any] | None = None

    def html(self, result: Any, ctx: ReportContext) -> str:
        """Its part of ``report.html`` or of a comparison page (figures written through ``ctx``)."""
        return to_html(self.blocks(result, ctx.settings), ctx)

    def markdown(self, result: Any, settings: AnalysisSection) -> list[str]:
        """Its part of ``analysis.md`` and of a results page."""
        return to_markdown(self.blocks(result, settings))

    def merged(self, named: list[tuple[str, Any]]) -> Any:
        """Several runs' results as one."""
        return (self.merge or merge_results)(named)

    def rows(self, result: Any) -> list[tuple[Cell, str]]:
        """Its rows of the main table (none unless ``main_rows`` is given)."""
        return [] if self.main_rows is None else self.main_rows(result)

    def lines(self, result: Any, settings: AnalysisSection) -> list[str]:
        """Its lines below the main table (none unless ``main_lines`` is given)."""
        return [] if self.main_lines is None else self.main_lines(result, settings)


SECTIONS: Registry[ReportSection] = Registry("report section")


def register_section(section: ReportSection) -> ReportSection:
    """Register another family's report section (a benchmark of your own). Returns it.

    Raises:
        DuplicateEntryError: another section is registered for the family.
    """
    return SECTIONS.register(section.family, section)


def report_section(family: str) -> ReportSection:
    """The report section of ``family`` (``interventions`` for the causal tests).

    Raises:
        UnknownNameError: no section of that name (close names suggested).
    """
    return SECTIONS.get(family)


__all__ = ["ReportContext", "ReportSection", "Rows", "SECTIONS", "register_section", "report_section"]
