"""Report sections: one per task family, registered under the family's name (as the analyses are,
:mod:`probe.analysis.families`).

A section turns its family's result (``Analysis.families[name]``) into every rendering the toolkit makes: its part
of ``report.html`` (with its figures), of ``analysis.md``, its CSV tables, its rows and lines of the plain-text main
table, and its part of a ``probe compare`` page. The shared renderers (:mod:`probe.report.render`,
:mod:`probe.report.tables`, :mod:`probe.report.text`, :mod:`probe.report.compare`) loop over the families of an
analysis and ask this registry; none of them names a family.

The toolkit's sections (``SECTION`` of :mod:`probe.report.ice`, :mod:`probe.report.cogniload` and
:mod:`probe.report.interventions`) are registered by name in :mod:`probe.report.catalog`; a benchmark of your own
calls :func:`register_section`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from matplotlib.figure import Figure

from probe.analysis.estimates import Cell
from probe.config import AnalysisSection
from probe.registry import Registry
from probe.report.html import fig_png, figure_block

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
            self.figures_dir.mkdir(parents=True, exist_ok=True)
            path = self.figures_dir / f"{stem}.png"
            path.write_bytes(png)
            self.drawn.append((path, caption))
        return figure_block(png, caption, stem)


@dataclass(frozen=True)
class ReportSection:
    """One family's renderings, as registered.

    Attributes:
        family: the family's name (its analysis' name).
        html: ``(result, ctx) -> str``: its part of ``report.html`` (figures through ``ctx.figure``).
        markdown: ``(result, settings) -> lines``: its part of ``analysis.md``.
        tables: ``result -> [(name, rows)]``: ``tables/<name>.csv`` (rows of flat values).
        main_rows: ``result -> [(cell, mark)]``: its rows of the main table (a mark follows the model's name).
        main_lines: ``(result, settings) -> lines``: its lines below the main table.
        merge: ``[(run label, result)] -> result``: several runs' results as one, each model renamed
            ``<run>: <model>`` (``probe compare``).
        compare_html: ``(merged result, ctx) -> str``: its part of a comparison page.
    """

    family: str
    html: Callable[[Any, ReportContext], str]
    markdown: Callable[[Any, AnalysisSection], list[str]]
    tables: Callable[[Any], list[tuple[str, Rows]]]
    main_rows: Callable[[Any], list[tuple[Cell, str]]]
    main_lines: Callable[[Any, AnalysisSection], list[str]]
    merge: Callable[[list[tuple[str, Any]]], Any]
    compare_html: Callable[[Any, ReportContext], str]


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
