"""Estimates -> text, Markdown, CSV, figures and a self-contained ``report.html`` (figures embedded as base64 PNG).

- :func:`render_report`: one analysed run folder -> ``report.html`` and ``figures/*.png``;
- :func:`compare_runs`: several analysed runs side by side;
- :func:`write_tables`: ``analysis.md`` and ``tables/*.csv`` of an analysis;
- :func:`main_table_text` / :func:`main_table`: the plain-text main table (of an analysis / of a run's trials).

Everything here reads :class:`probe.analysis.Analysis` (``analysis.json`` as written) and recomputes no statistic.
Each task family's part is drawn by its report section (:mod:`probe.report.sections`); numbers are written by
:mod:`probe.formatting`.
"""

from __future__ import annotations

from probe.report.compare import CompareError, compare_runs
from probe.report.render import render_report
from probe.report.sections import ReportContext, ReportSection, register_section, report_section
from probe.report.tables import write_tables
from probe.report.text import main_table, main_table_text
from probe.report import catalog  # noqa: F401  (registers the toolkit's sections)

__all__ = ["CompareError", "ReportContext", "ReportSection", "compare_runs", "main_table", "main_table_text",
           "register_section", "render_report", "report_section", "write_tables"]
