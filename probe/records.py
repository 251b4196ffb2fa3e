"""Trial records on disk: one JSON object per line, append-only, resumable without duplicates.

A crash can leave a half-written last line; ``read_jsonl`` ignores (and logs) it, and the next write starts on a
fresh line, so a resumed run neither loses a finished trial nor records one twice.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Iterator

from probe.types import Gold

log = logging.getLogger(__name__)


@dataclass
class TrialRecord:
    """One model answering one prompt. Flat fields; a missing value is None (null on disk)."""

    trial_id: str
    model: str
    prompt_id: str
    task_id: str
    source: str
    condition: str
    load: int
    achieved_load: float
    replication: int
    prompt_tokens: int
    output: str | None
    answer: str | None
    gold: Gold
    em: float | None
    hop_recall: float | None
    truncated: bool
    uninterpretable: bool
    skipped: bool = False
    skip_reason: str | None = None
    error: str | None = None  # a backend error (API failure): not a wrong answer, retried on the next run
    s_sim: float | None = None
    completion_tokens: int | None = None
    meta: dict | None = None  # source-specific values (CogniLoad: d, N, rho)
    family: str = "ice"  # the task family that scored it and analyses it (probe.tasks): ice, cogniload

    @property
    def is_scored(self) -> bool:
        return not self.skipped and self.error is None and self.em is not None

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TrialRecord":
        names = {f.name for f in fields(TrialRecord)}
        kept = {k: v for k, v in d.items() if k in names}
        if "family" not in kept:  # written before records named their family: the source's
            from probe.tasks import family_of

            kept["family"] = family_of(str(d.get("source", "")))
        return TrialRecord(**kept)


def make_trial_id(model: str, prompt_id: str) -> str:
    return f"{model}::{prompt_id}"


def read_jsonl(path: Path) -> Iterator[dict]:
    """Yield the complete JSON lines of ``path``; a broken last line (crash mid-write) is skipped."""
    if not path.exists():
        return
    with path.open("r", encoding="utf-8") as fh:
        lines = fh.readlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                log.warning("%s:%d: ignoring a half-written last line (interrupted run)", path, i)
            else:
                raise


def append_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Append rows and fsync, so that a record on disk is complete. Returns the number written.

    A half-written last line (a crash mid-write) is cut off first: it was never a record.
    """
    rows = list(rows)
    if not rows:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_last_line(path)
    with path.open("a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return len(rows)


def _drop_partial_last_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        log.warning("%s: removing a half-written last line (%d bytes) left by an interrupted run",
                    path, len(data) - keep)
        fh.truncate(keep)


def load_trials(path: Path) -> list[TrialRecord]:
    """Trial records of a file, last record of each trial_id winning (an error later retried successfully)."""
    by_id: dict[str, TrialRecord] = {}
    for d in read_jsonl(path):
        by_id[d["trial_id"]] = TrialRecord.from_dict(d)
    return list(by_id.values())


def done_trial_ids(path: Path) -> set[str]:
    """Trials that need no rerun: everything recorded except backend errors."""
    return {t.trial_id for t in load_trials(path) if t.error is None}
