"""A run folder read once for the analysis: the trials as one table (with ``is_scored``, ``has_output``, ``s_sim``),
the prompts and tasks, and ``probe_records``, the one reader of probe records (docs/records.md#trial-records)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pandas as pd

from probe.errors import ProbeError
from probe.attention.result import RecordCheck, SegmentAttention
from probe.interventions import KeyCount
from probe.records import TrialRecord, load_prompts, load_task_records, load_trials
from probe.runfolder import RunFolder
from probe.types import Prompt, Task

log = logging.getLogger(__name__)

_COLUMNS = [
    "trial_id", "model", "prompt_id", "task_id", "source", "condition", "load", "achieved_load", "replication",
    "prompt_tokens", "em", "hop_recall", "truncated", "uninterpretable", "skipped", "skip_reason", "error",
    "s_sim", "completion_tokens", "family", "intervention", "extraction",
]


def _keys_shortfall(trial: TrialRecord) -> int:
    """Tokens a matched-random intervention wanted but could not draw (an intervened trial's count), else 0."""
    count = KeyCount.from_meta(trial.meta, f"trial {trial.trial_id}")
    return 0 if count is None else count.shortfall


def trials_frame(trials: list[TrialRecord]) -> pd.DataFrame:
    """One row per trial with the analysis columns (see docs/records.md#trial-records).

    Args:
        trials: trial records (any order).

    Returns:
        DataFrame with the columns of ``_COLUMNS`` plus ``is_scored`` and ``has_output``; ``em`` is float with NaN
        where the trial was not scored; ``load`` is int percent.
    """
    rows = [{c: getattr(t, c) for c in _COLUMNS} for t in trials]
    df = pd.DataFrame(rows, columns=_COLUMNS)
    df["em"] = pd.to_numeric(df["em"], errors="coerce").astype(float)
    df["hop_recall"] = pd.to_numeric(df["hop_recall"], errors="coerce").astype(float)
    df["s_sim"] = pd.to_numeric(df["s_sim"], errors="coerce").astype(float)
    df["load"] = df["load"].astype(int)
    df["replication"] = df["replication"].astype(int)
    df["task_id"] = df["task_id"].astype(str)
    df["truncated"] = df["truncated"].fillna(False).astype(bool)
    df["uninterpretable"] = df["uninterpretable"].fillna(False).astype(bool)
    df["skipped"] = df["skipped"].fillna(False).astype(bool)
    df["has_output"] = ~df["skipped"] & df["error"].isna()
    df["is_scored"] = df["has_output"] & df["em"].notna()
    df["keys_shortfall"] = [_keys_shortfall(t) for t in trials]
    return df


def probe_records(run: RunFolder, keys: Iterable[tuple[str, str]], prompts: Mapping[str, Prompt] | None = None,
                  intervention: str | None = None) -> Iterator[tuple[tuple[str, str], SegmentAttention]]:
    """The probe record of each (model, prompt id) that has one, read once and handed on one at a time (an answer
    record is tokens x layers x heads x segments: a family keeps what it needs of it and lets it go).

    This is the analysis' one reader of probe records; where the file lies is
    :meth:`probe.runfolder.RunFolder.attention_record`'s business. Each record is held to what made it
    (:class:`RecordCheck`).

    Args:
        run: the run folder; keys: (model, prompt id) pairs; prompts: the run's prompt records by id when the
            caller has them (else ``prompts.jsonl`` is read for the check); intervention: read the records probed
            under this intervention instead of the baseline's.

    Raises:
        AttentionRecordError: a record that is damaged, or that does not match its prompt or its model's layers
            and heads (naming the file and how to probe the prompt again).
    """
    check = RecordCheck.of(run, prompts)
    for model, pid in dict.fromkeys(keys):
        path = run.attention_record(model, pid, intervention)
        if path.is_file():
            record = SegmentAttention.load(path)
            check(path, model, pid, record)
            yield (model, pid), record


@dataclass(frozen=True)
class RunRecords:
    """The records of a run folder as the analysis reads them once (the folder's paths are a
    :class:`~probe.runfolder.RunFolder`; a run read back whole for a user, analysis included, is
    :class:`probe.loaded_run.Run`).

    Attributes:
        frame: the trial table (:func:`trials_frame`), S_sim filled from the prompt records.
        trials: the trial records (last record of each trial id), in the table's row order.
        prompts: the prompt records by prompt id (empty without ``prompts.jsonl``).
        tasks: the task records by task id (``tasks.jsonl``), or None when the folder has none (a run recorded
            before runs recorded their tasks, or trials imported from another tool).
    """

    frame: pd.DataFrame
    trials: tuple[TrialRecord, ...]
    prompts: dict[str, Prompt]
    tasks: dict[str, Task] | None = None


def in_run_order(trials: list[TrialRecord], prompt_ids: list[str]) -> list[TrialRecord]:
    """The trials in one order whatever order they were written in: by model name, the baseline before the
    interventions (by name), then the prompt's place in ``prompts.jsonl``; trials of prompts it does not hold (a
    folder without one: imported trials) after those, by prompt id and trial id.

    Writers record trials in the order they finish (a local model batches prompts by length, a served one records
    answers as they arrive), and the analysis must not depend on that: the question order of a Monte Carlo sign
    flip, the order of a float sum and the row order of the tables follow this order (a two-stage run and an
    all-torch run of the same answers give the same analysis)."""
    place = {pid: i for i, pid in reversed(list(enumerate(prompt_ids)))}
    return sorted(trials, key=lambda t: (t.model, t.intervention is not None, t.intervention or "",
                                         place.get(t.prompt_id, len(place)), t.prompt_id, t.trial_id))


def load_run_records(run: RunFolder) -> RunRecords:
    """The trials (as records and as a table), prompts and tasks of a run folder, each file read once.

    S_sim missing from a trial is taken from its prompt record.

    Raises:
        ProbeError: the folder has no ``trials.jsonl`` or it holds no trial.
    """
    path = run.trials
    if not path.is_file():
        raise ProbeError(f"{path}: no trial records here; run `probe run` first, or give the run folder")
    prompts = {p.prompt_id: p for p in load_prompts(run.prompts)}
    trials = in_run_order(load_trials(path), list(prompts))
    if not trials:
        raise ProbeError(f"{path}: holds no trial record")
    df = trials_frame(trials)
    tasks = {t.task_id: t for t in load_task_records(run.tasks)} if run.tasks.is_file() else None
    if prompts:
        from_prompt = df["prompt_id"].map(lambda pid: prompts[pid].s_sim if pid in prompts else None)
        df["s_sim"] = df["s_sim"].fillna(pd.to_numeric(from_prompt, errors="coerce").astype(float))
    log.info("%s: %d trials (%d scored), %d prompts", path, len(df), int(df["is_scored"].sum()), len(prompts))
    return RunRecords(frame=df, trials=tuple(trials), prompts=prompts, tasks=tasks)


def load_run_frame(run_dir: str | Path | RunFolder) -> tuple[pd.DataFrame, dict[str, Prompt]]:
    """Trials of a run folder as a table, and its prompts (:func:`load_run_records` without the records)."""
    data = load_run_records(run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir))
    return data.frame, data.prompts
