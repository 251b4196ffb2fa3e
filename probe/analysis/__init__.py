"""Records -> estimates, as typed results: EM per cell with clustered CIs, H1-H3, power, attention ↔ behaviour,
taxonomy (family ``ice``); GLM, thresholds, accuracy cells and needle/hay attention (family ``cogniload``).

Entry points:

- :func:`analyze_run`: a run folder -> :class:`Analysis`, written to ``analysis.json`` (schema
  :data:`SCHEMA_VERSION`);
- :func:`read_analysis`: ``analysis.json`` as it is on disk -> :class:`Analysis` (refuses a missing, stale or
  other-schema file, saying to run ``probe analyze``);
- :func:`tabulate_run`: the cells of a run's trials without fits or files (the quick table of ``probe run``);
- :func:`analyze_external`: trial records written by other tools, re-scored with the toolkit's scoring into a run
  folder (:mod:`probe.records_import`), then analysed like any other;
- :func:`analyze_interventions`: the causal tests of trials run under interventions (``Analysis.interventions``;
  every other estimate reads baseline trials only).

Each task family's analysis is registered by name in :mod:`probe.analysis.catalog`; the results of a family are
``Analysis.families[name]`` (:class:`probe.analysis.ice.IceResult`, :class:`probe.analysis.cogniload.CogniloadResult`).
Rendering (text, Markdown, CSV, HTML, figures) is :mod:`probe.report`'s.
"""

from __future__ import annotations

from probe.analysis.families import FamilyAnalysis, FamilyData, FamilyOutput, family_analysis, register_family_analysis
from probe.analysis.interventions import InterventionResult, analyze_interventions
from probe.analysis.results import (
    SCHEMA_VERSION,
    Analysis,
    AnalysisFileError,
    AnalysisMissingError,
    AnalysisSchemaError,
    StaleAnalysisError,
    read_analysis,
)
from probe.analysis.run import AnalysisConfigError, analyze_external, analyze_run, tabulate_run
from probe.analysis import catalog  # noqa: F401  (registers the toolkit's family analyses)


__all__ = [
    "Analysis",
    "AnalysisConfigError",
    "AnalysisFileError",
    "AnalysisMissingError",
    "AnalysisSchemaError",
    "FamilyAnalysis",
    "FamilyData",
    "FamilyOutput",
    "InterventionResult",
    "SCHEMA_VERSION",
    "StaleAnalysisError",
    "analyze_external",
    "analyze_interventions",
    "analyze_run",
    "family_analysis",
    "read_analysis",
    "register_family_analysis",
    "tabulate_run",
]
