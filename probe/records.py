"""Trial and prompt records on disk: one JSON object per line, append-only, resumable without duplicates
(docs/records.md#trial-records)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from probe.errors import ProbeError, SpanError
from probe.runfolder import OutsideRunError, RunFolder, file_mode, inside
from probe.types import Gold, Prompt, Task, family_of_old_record

log = logging.getLogger(__name__)


class RecordError(ProbeError):
    """A record file holds a line that is not a record (``file:line: what is wrong``, and what to do)."""


def _damaged(path: Path, line: int, what: str) -> RecordError:
    return RecordError(
        f"{path}:{line}: {what}. The file is damaged there (an interrupted run only ever leaves a half-written last "
        "line, which is cut on resume); restore the file, or repair or delete that line (a deleted trial is run "
        "again by `probe run`)"
    )


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
    intervention: str | None = None  # the [[interventions]] entry the model ran under; None: the baseline
    # the scoring rule that decided the answer (probe.scoring.answers.Extraction: boxed, answer_line, last_line, echo,
    # none; CogniLoad: poi_category, poi, last); None: not scored, or recorded before trials carried it
    extraction: str | None = None
    # a served model's answer as token ids, where its engine returned them (vLLM's ``return_token_ids``) for the
    # teacher-forced probe of a two-stage run (probe.runner.forced); None (and absent on disk) otherwise
    output_ids: list[int] | None = None

    @property
    def is_scored(self) -> bool:
        return not self.skipped and self.error is None and self.em is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["output_ids"] is None:  # only two-stage runs record the engine's ids
            del d["output_ids"]
        return d

    @staticmethod
    def from_dict(d: dict) -> "TrialRecord":
        """A record from its JSON object.

        Raises:
            TypeError: a field holds a value of another kind than the record's (``"em": "yes"``), naming it.
        """
        names = {f.name for f in fields(TrialRecord)}
        kept = {k: v for k, v in d.items() if k in names}
        for k, v in kept.items():
            kinds = _FIELD_KINDS.get(k)
            if kinds is not None and not (isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)):
                wanted = dict.fromkeys(_KIND_NAMES[t] for t in kinds if not (t is int and float in kinds))
                raise TypeError(f"field {k!r} holds {json.dumps(v)[:60]} (a {type(v).__name__}); a trial record's "
                                f"{k} is {' or '.join(wanted)}")
        if "family" not in kept:  # written before records named their family
            kept["family"] = family_of_old_record(str(d.get("source", "")))
        return TrialRecord(**kept)


_KIND_NAMES = {str: "text", int: "a whole number", float: "a number", bool: "true/false", type(None): "null",
               dict: "an object", list: "a list"}


def _kinds(annotation: str) -> tuple[type, ...] | None:
    """The JSON kinds a field's annotation admits (None: not checked here, e.g. ``gold``)."""
    kinds: list[type] = []
    for part in (p.strip() for p in annotation.split("|")):
        base = part.split("[")[0]
        kind = {"str": str, "int": int, "float": float, "bool": bool, "None": type(None), "dict": dict,
                "list": list}.get(base)
        if kind is None:
            return None
        kinds.append(kind)
        if kind is float:
            kinds.append(int)  # JSON writes 1.0 as 1 where it can
    return tuple(dict.fromkeys(kinds))


_FIELD_KINDS = {f.name: k for f in fields(TrialRecord) if (k := _kinds(str(f.type))) is not None}

_REQUIRED_TRIAL_FIELDS = tuple(f.name for f in fields(TrialRecord)
                               if f.default is MISSING and f.default_factory is MISSING)


def make_trial_id(model: str, prompt_id: str, intervention: str | None = None) -> str:
    """The id of one trial: ``<model>::<prompt id>``, and ``::<intervention>`` for a trial under an intervention."""
    return f"{model}::{prompt_id}" if intervention is None else f"{model}::{prompt_id}::{intervention}"


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for every record line of ``path`` (nothing when the file is absent).

    Blank lines are skipped. A half-written last line (no newline after it: a crash mid-write) is skipped with a
    warning.

    Raises:
        RecordError: any other line is not valid JSON or not a JSON object (``file:line: ...``).
    """
    path = Path(path)
    if not path.exists():
        return
    for i, raw, partial in _lines(path):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if partial:
                log.warning("%s:%d: ignoring a half-written last line (interrupted run)", path, i)
                continue
            raise _damaged(path, i, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if partial:
                log.warning("%s:%d: ignoring a half-written last line (interrupted run)", path, i)
                continue
            raise _damaged(path, i, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise _damaged(path, i, "JSON nested deeper than a record ever is") from None
        if not isinstance(obj, dict):
            raise _damaged(path, i, f"not a JSON object (a {type(obj).__name__})")
        yield i, obj


# The longest line a record file may hold: a prompt of 100k tokens with its segments is under 2 MiB.
MAX_LINE_BYTES = 16 * 1024 * 1024


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line, whether it is a half-written last one), read a line at a time: a line longer than
    :data:`MAX_LINE_BYTES` is an error naming it, not a file read whole into memory."""
    with path.open("rb") as fh:
        i = 0
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            i += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise _damaged(path, i, f"a line longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB, which no record "
                                        "is")
            yield i, raw, not raw.endswith(b"\n") and not fh.peek(1)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The record objects of ``path`` in file order (see :func:`iter_jsonl`; raises :class:`RecordError`)."""
    for _, obj in iter_jsonl(path):
        yield obj


def append_jsonl(path: Path, rows: Iterable[dict], root: Path | None = None) -> int:
    """Append rows and fsync, so that a record on disk is complete. Returns the number written.

    A half-written last line (a crash mid-write) is cut off first: it was never a record. The file is never opened
    through a link, and with ``root`` (the run folder) no folder on the way may be one
    (:func:`probe.runfolder.inside`).
    """
    rows = list(rows)
    if not rows:
        return 0
    path = Path(path)
    if root is not None:
        inside(root, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_last_line(path)
    fd = _open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return len(rows)


def write_jsonl(path: Path, rows: Iterable[dict], root: Path | None = None) -> int:
    """Write ``path`` whole (under a temporary name, fsynced, then renamed): readers see the old file or the new.
    With ``root`` (the run folder) no link may lie on the way (:func:`probe.runfolder.inside`).

    Returns:
        The number of rows written.
    """
    path = Path(path)
    if root is not None:
        inside(root, path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        n = append_jsonl(tmp, rows)
        if n == 0:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode()))
        tmp.replace(path)
    except BaseException:  # a full disk, Ctrl-C: the old file stays, and no temporary one
        tmp.unlink(missing_ok=True)
        raise
    return n


def index_records(run: RunFolder, paths: Iterable[Path], digest: str | None) -> None:
    """Append each probe record's line to the run's ``attention_index.jsonl`` (its path under ``attention/``, the
    sha256 of its bytes as written, its prompt digest), in one ``write`` that starts with a newline, so a line cut
    by a crash stays a line of its own."""
    rows = [{"record": p.relative_to(run.attention_root).as_posix(),
             "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "prompt_digest": digest} for p in paths]
    if not rows:
        return
    path = inside(run.root, run.attention_index)
    data = ("\n" + "".join(json.dumps(r) + "\n" for r in rows)).encode("utf-8")
    fd = _open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def record_index(run: RunFolder) -> dict[str, str]:
    """Record path under ``attention/`` -> the sha256 it was written with (the last line of each path wins: a
    record probed again is indexed again); empty for a run written before records were indexed. A line that cannot
    be read (cut by a crash) indexes nothing: its record is read without the hash check."""
    path = run.attention_index
    out: dict[str, str] = {}
    if not path.is_file() or path.is_symlink():
        return out
    with path.open("rb") as fh:
        for raw in fh:
            try:
                d = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(d, dict) and isinstance(d.get("record"), str) and isinstance(d.get("sha256"), str):
                out[d["record"]] = d["sha256"]
    return out


def _open_no_link(path: Path, flags: int) -> int:
    """``os.open`` that refuses a link at ``path`` (O_NOFOLLOW), naming it."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), file_mode())
    except OSError as e:
        if path.is_symlink():
            raise OutsideRunError(f"{path}: is a link (to {os.readlink(path)}); records are never written through a "
                                  "link. Remove it, then run the command again") from None
        raise e


def _drop_partial_last_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with os.fdopen(_open_no_link(path, os.O_RDWR), "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        log.warning("%s: removing a half-written last line (%d bytes) left by an interrupted run",
                    path, len(data) - keep)
        fh.truncate(keep)


class DuplicateTrialError(RecordError):
    """A trial recorded twice without a backend error in between (two runs wrote into one folder at once)."""


def load_trials(path: Path) -> list[TrialRecord]:
    """Trial records of a file; a trial that failed in a backend (``error``) and was retried later is replaced by
    the retry.

    Raises:
        RecordError: a line is not valid JSON, or not a trial record (a required field missing or of a wrong kind).
        DuplicateTrialError: a trial recorded without an error is recorded again (two runs wrote into the folder
            at once): the message names the file, the lines and how many trials, and says what to do.
    """
    by_id: dict[str, TrialRecord] = {}
    first_line: dict[str, int] = {}
    doubled: list[tuple[str, int, int]] = []
    for line, d in iter_jsonl(path):
        missing = [k for k in _REQUIRED_TRIAL_FIELDS if k not in d]
        if missing:
            raise _damaged(Path(path), line, f"not a trial record (missing {', '.join(missing)})")
        try:
            record = TrialRecord.from_dict(d)
        except TypeError as e:
            raise _damaged(Path(path), line, f"not a trial record ({e})") from None
        old = by_id.get(record.trial_id)
        if old is not None and old.error is None:
            doubled.append((record.trial_id, first_line[record.trial_id], line))
            continue
        by_id[record.trial_id] = record
        first_line[record.trial_id] = line
    if doubled:
        tid, first, again = doubled[0]
        raise DuplicateTrialError(
            f"{path}:{again}: trial {tid!r} is recorded again (first on line {first}); {len(doubled)} trial(s) are "
            "recorded twice, as when two runs write into one folder at once. Their records may differ, so none is "
            "chosen silently: keep one line per trial id (e.g. delete the later copies) and analyse again"
        )
    return list(by_id.values())


R = TypeVar("R")


def _load_records(path: Path, from_dict: Callable[[dict], R], kind: str) -> list[R]:
    """The records of one kind in a file, in file order (``RecordError`` naming the line that is not one)."""
    out: list[R] = []
    for line, d in iter_jsonl(path):
        try:
            out.append(from_dict(d))
        except (KeyError, TypeError, ValueError, SpanError) as e:
            what = f"missing {e}" if isinstance(e, KeyError) else str(e)
            raise _damaged(Path(path), line, f"not a {kind} record ({what})") from None
    return out


def load_prompts(path: Path) -> list[Prompt]:
    """The prompt records of a file (``prompts.jsonl``), in file order.

    Raises:
        RecordError: a line is not valid JSON, or not a prompt record.
    """
    return _load_records(path, Prompt.from_dict, "prompt")


def load_task_records(path: Path) -> list[Task]:
    """The task records of a file (``tasks.jsonl``: what the run loaded from its task sources), in file order.

    Raises:
        RecordError: a line is not valid JSON, or not a task record.
    """
    return _load_records(path, Task.from_dict, "task")


__all__ = ["DuplicateTrialError", "RecordError", "TrialRecord", "append_jsonl", "index_records", "iter_jsonl",
           "load_prompts", "load_task_records", "load_trials", "make_trial_id", "read_jsonl", "record_index",
           "write_jsonl"]


def check_records(run: str | Path | RunFolder) -> None:
    """Read every record file of a run folder (prompts, trials) once, so that damage stops a run early.

    Raises:
        RecordError: a line of one of them is not a record (``file:line: ...``).
    """
    run = RunFolder(run)
    left = sorted(run.root.glob("trials.rank*.jsonl")) if run.root.is_dir() else []
    if left:  # data-parallel processes write shard folders now (probe.runner.shards)
        raise RecordError(f"{left[0]}: a trial file that a data-parallel run of an earlier version left unmerged; "
                          f"append each such file to {run.trials} (`cat trials.rank*.jsonl >> trials.jsonl`), "
                          "delete them, and run again")
    load_task_records(run.tasks)
    load_prompts(run.prompts)
    load_trials(run.trials)
