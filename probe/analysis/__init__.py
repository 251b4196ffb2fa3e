"""Records -> estimates: EM per cell with clustered CIs, H1-H3, power, attention ↔ behaviour, taxonomy.

Entry points: :func:`analyze_run` (a run folder -> ``analysis.json`` and tables), :func:`render_main_table`
(the text the CLI prints from an analysis), :func:`main_table` (the same table straight from a run's trials) and
:func:`analyze_external` (trial records written by other tools, re-scored with the toolkit's scoring).
"""

from __future__ import annotations

from probe.analysis.external import analyze_external, load_external_trials, parse_mapping
from probe.analysis.run import ANALYSIS_FILE, analyze_run, load_analysis, main_table
from probe.analysis.tables import render_main_table

main_table_text = render_main_table

__all__ = [
    "ANALYSIS_FILE",
    "analyze_external",
    "analyze_run",
    "load_analysis",
    "load_external_trials",
    "main_table",
    "main_table_text",
    "parse_mapping",
    "render_main_table",
]
