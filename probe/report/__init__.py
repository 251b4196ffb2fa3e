"""Estimates -> figures and a self-contained ``report.html`` (figures embedded as base64 PNG).

:func:`render_report` draws one run folder; :func:`compare_runs` puts several runs side by side. Both read
``analysis.json`` (and ``attention_summary.npz``) and recompute no statistic.
"""

from __future__ import annotations

from probe.report.compare import compare_runs
from probe.report.render import render_report

__all__ = ["compare_runs", "render_report"]
