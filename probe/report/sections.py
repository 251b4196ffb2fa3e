"""Report sections: one per task family, registered under the family's name, as the analyses are
(docs/architecture.md#how-one-trial-flows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from matplotlib.figure import Figure

from probe.analysis.estimates import Cell
from probe.config import AnalysisSection
from probe.registry import Registry
from probe.report.html import fig_png, figure_block
from probe.runfolder import write_atomic

Rows = list[dict[str, Any]]


class ReportContext:
    """What a section may use while it renders, besides its family's result.

    Args:
        settings: the ``[analysis]`` gates of the analysis (``alpha`` for significance marks, the confound gate).
        figures_dir: where :meth:`figure` writes PNGs; None draws nothing to disk (HTML only).
    """

    def __init__(self, settings: AnalysisSection, figures_dir: Path | None = None) -> None:
        self.settings = settings
        self.figures_dir = figures_dir
        self.drawn: list[tuple[Path, str]] = []  # (file, caption) of each figure written, in order

    @property
    def written(self) -> list[Path]:
        """The figure files written so far, in order."""
        return [path for path, _ in self.drawn]

    def figure(self, stem: str, caption: str, fig: Figure | None) -> str:
        """Write ``figures/<stem>.png`` and return its ``<figure>`` block (embedded PNG); "" when ``fig`` is None."""
        if fig is None:
            return ""
        png = fig_png(fig)
        if self.figures_dir is not None:
            path = write_atomic(self.figures_dir / f"{stem}.png", png, root=self.figures_dir.parent)
            self.drawn.append((path, caption))
        return figure_block(png, caption, stem)


@dataclass(frozen=True)
class ReportSection:
    """One family's renderings, as registered: what it draws (``html``), what numbers it publishes (``tables``) and
    how several runs' results combine (``merge``). The text renderings are derived from these unless the section
    writes its own.

    Attributes:
        family: the family's name (its analysis' name).
        html: ``(result, ctx) -> str``: its part of ``report.html`` (figures through ``ctx.figure``) and, given the
            merged result of several runs, of a ``probe compare`` page.
        tables: ``result -> [(name, rows)]``: ``tables/<name>.csv`` (rows of flat values).
        merge: ``[(run label, result)] -> result``: several runs' results as one, each model renamed
            ``<run>: <model>`` (``probe compare``).
        markdown: ``(result, settings) -> lines``: its part of ``analysis.md``; None: every table as a Markdown
            table under the family's name, each cut at :data:`probe.report.tables.MD_ROWS` rows with a line saying so.
        main_rows: ``result -> [(cell, mark)]``: its rows of the main EM table (a mark follows the model's name);
            None: none.
        main_lines: ``(result, settings) -> lines``: its lines below the main table; None: none.
        compare_html: ``(merged result, ctx) -> str``: its part of a comparison page when it differs from ``html``.
    """

    family: str
    html: Callable[[Any, ReportContext], str]
    tables: Callable[[Any], list[tuple[str, Rows]]]
    merge: Callable[[list[tuple[str, Any]]], Any]
    markdown: Callable[[Any, AnalysisSection], list[str]] | None = None
    main_rows: Callable[[Any], list[tuple[Cell, str]]] | None = None
    main_lines: Callable[[Any, AnalysisSection], list[str]] | None = None
    compare_html: Callable[[Any, ReportContext], str] | None = None

    def rows(self, result: Any) -> list[tuple[Cell, str]]:
        """Its rows of the main table (none unless ``main_rows`` is given)."""
        return [] if self.main_rows is None else self.main_rows(result)

    def lines(self, result: Any, settings: AnalysisSection) -> list[str]:
        """Its lines below the main table (none unless ``main_lines`` is given)."""
        return [] if self.main_lines is None else self.main_lines(result, settings)

    def compare(self, merged: Any, ctx: ReportContext) -> str:
        """Its part of a comparison page: ``compare_html``, or ``html`` of the merged result."""
        return (self.compare_html or self.html)(merged, ctx)


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
