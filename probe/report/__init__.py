"""Estimates -> text, Markdown, CSV, figures and a self-contained ``report.html`` (docs/records.md#report)."""

from __future__ import annotations

from probe.report.compare import CompareError, compare_runs
from probe.report.render import render_report
from probe.report.sections import ReportContext, ReportSection, register_section, report_section
from probe.report.tables import write_tables
from probe.report.text import main_table, main_table_text
from probe.report import catalog  # noqa: F401  (registers the toolkit's sections)

__all__ = ["CompareError", "ReportContext", "ReportSection", "compare_runs", "main_table", "main_table_text",
           "register_section", "render_report", "report_section", "write_tables"]
