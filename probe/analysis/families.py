"""Family analyses: one analysis per task family, registered under the family's name; adding one is described in
docs/architecture.md#how-one-trial-flows."""

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
from probe.types import Prompt, Task

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
        tasks: every task record of the run by task id (``tasks.jsonl``), or None when the folder has none.
        settings: the ``[analysis]`` gates.
        seed: the seed of every random draw (the experiment's seed; see :class:`probe.analysis.results.Analysis`).
    """

    family: str
    run: RunFolder
    frame: pd.DataFrame
    trials: tuple[TrialRecord, ...]
    prompts: dict[str, Prompt]
    tasks: dict[str, Task] | None
    settings: AnalysisSection
    seed: int


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


ANALYSES: Registry[FamilyAnalysis] = Registry("analysis family")


def register_family_analysis(entry: FamilyAnalysis) -> FamilyAnalysis:
    """Register another family's analysis (a benchmark of your own). Returns ``entry``.

    Raises:
        DuplicateEntryError: another analysis is registered under the same name (one family, one analysis).
    """
    return ANALYSES.register(entry.name, entry)


def family_analysis(name: str) -> FamilyAnalysis:
    """The analysis of family ``name``.

    Raises:
        UnknownNameError: no analysis of that name (names close matches).
    """
    return ANALYSES.get(name)


def family_order(names: set[str] | list[str]) -> list[str]:
    """Families in report order: the order of :data:`probe.tasks.FAMILIES`, then any others by name."""
    known = [f for f in FAMILIES if f in names]
    return known + sorted(set(names) - set(known))


__all__ = ["ANALYSES", "FamilyAnalysis", "FamilyData", "FamilyOutput", "family_analysis", "family_order",
           "register_family_analysis"]
