"""Records -> estimates, as typed results, one per task family (``Analysis.families[name]``), and the causal tests of
interventions; the stages and modules are laid out in docs/architecture.md#how-one-trial-flows."""

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
