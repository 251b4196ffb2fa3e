"""Family analyses: one analysis per task family, found by the family's name.

Every trial record carries its ``family`` (:mod:`probe.tasks`: ``ice``, ``cogniload``, …). The analysis of a run
(:func:`probe.analysis.run.analyze_run`) splits the trial table by that column and hands each part, as a
:class:`FamilyData`, to the family's :class:`FamilyAnalysis`; the result goes into ``Analysis.families[name]``. No
shared module names a family.

Adding a benchmark's analysis: write ``probe/analysis/<family>.py`` with a frozen dataclass for its result and call
:func:`register_family_analysis` at import; :func:`family_analysis` imports ``probe.analysis.<family>`` the first
time the family is asked for. Its report section registers the same way under :mod:`probe.report` (see
:mod:`probe.report.sections`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from probe.config import AnalysisSection
from probe.records import TrialRecord
from probe.registry import Registry
from probe.runfolder import RunFolder
from probe.tasks import FAMILIES
from probe.types import Prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FamilyData:
    """What a family analysis gets: its own trials and everything it may use.

    Attributes:
        family: the family's name.
        run: the run folder (attention records are found by ``run.attention_record(model, prompt_id)``).
        frame: the family's rows of the trial table (:func:`probe.analysis.frame.trials_frame`).
        trials: the family's trial records (``meta`` included), in the table's row order.
        prompts: every prompt record of the run, by prompt id.
        settings: the ``[analysis]`` gates.
        seed: the seed of every random draw (the experiment's seed; see :class:`probe.analysis.results.Analysis`).
        fill_similarity: whether S_sim may be computed with the embedder where the records lack it.
    """

    family: str
    run: RunFolder
    frame: pd.DataFrame
    trials: tuple[TrialRecord, ...]
    prompts: dict[str, Prompt]
    settings: AnalysisSection
    seed: int
    fill_similarity: bool


@dataclass(frozen=True)
class FamilyOutput:
    """What a family analysis returns.

    Attributes:
        result: the family's result (an instance of its ``result_type``).
        notes: sentences for the analysis' notes (what could not be done, choices made).
        n_attention_records: probe records the analysis found and used (0 when none).
    """

    result: object
    notes: tuple[str, ...] = ()
    n_attention_records: int = 0


@dataclass(frozen=True)
class FamilyAnalysis:
    """One family's analysis, as registered.

    Attributes:
        name: the family's name (as recorded on its trials).
        result_type: the frozen dataclass of its result (``analysis.json`` is read back into it).
        analyze: ``FamilyData -> FamilyOutput``: every estimate of the family.
        tabulate: ``FamilyData -> result``: the family's result with its cells only (no fit, no file read or
            written beyond the trials): the quick table ``probe run`` prints.
        methods: method name -> one line on how it is estimated (the report's Methods).
    """

    name: str
    result_type: type
    analyze: Callable[[FamilyData], FamilyOutput]
    tabulate: Callable[[FamilyData], object]
    methods: dict[str, str]


# An analysis is found by its family's name: the task families' modules are named up front (so a typo is answered
# with the close one), any other name is tried as probe.analysis.<name>.
ANALYSES: Registry[FamilyAnalysis] = Registry("analysis family",
                                              lazy={f: f"probe.analysis.{f}" for f in FAMILIES.names()},
                                              module_pattern="probe.analysis.{name}")


def register_family_analysis(entry: FamilyAnalysis) -> FamilyAnalysis:
    """Register a family's analysis (call at import of ``probe/analysis/<family>.py``). Returns ``entry``.

    Raises:
        DuplicateEntryError: another analysis is registered under the same name (one family, one analysis).
    """
    return ANALYSES.register(entry.name, entry)


def family_analysis(name: str) -> FamilyAnalysis:
    """The analysis of family ``name``, importing ``probe.analysis.<name>`` on first use.

    Raises:
        UnknownNameError: no module of that name (names close matches). ProbeError: the module exists but
            registers no analysis for ``name``.
    """
    return ANALYSES.get(name)


def family_order(names: set[str] | list[str]) -> list[str]:
    """Families in report order: the order of :data:`probe.tasks.FAMILIES`, then any others by name."""
    known = [f for f in FAMILIES if f in names]
    return known + sorted(set(names) - set(known))


__all__ = ["ANALYSES", "FamilyAnalysis", "FamilyData", "FamilyOutput", "family_analysis", "family_order",
           "register_family_analysis"]
