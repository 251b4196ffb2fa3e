"""A user's own tasks: one JSON object per line, in the schema of ``Task.to_dict()`` without ``source``
(docs/method.md#sources)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from probe.errors import TaskFormatError
from probe.types import SEGMENT_KINDS, Gold, Hop, Task

log = logging.getLogger(__name__)

_REQUIRED = ("task_id", "question", "gold", "hops")
_OPTIONAL = ("topic", "meta", "segments", "condition")
_HOP_KEYS = ("fact", "answer")


class _Bad:
    """Builds ``file:line: field: what is wrong`` errors for one line."""

    def __init__(self, path: Path, line: int) -> None:
        self.where = f"{path}:{line}"

    def __call__(self, field: str, what: str) -> TaskFormatError:
        return TaskFormatError(f"{self.where}: {field}: {what}")


def _is_text(v: object) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _check_gold(gold: object, bad: _Bad) -> Gold:
    if isinstance(gold, str):
        if not gold.strip():
            raise bad("gold", "must not be empty")
        return gold
    if isinstance(gold, list):
        if not gold:
            raise bad("gold", "an empty list; give at least one answer")
        for i, g in enumerate(gold):
            if not _is_text(g):
                raise bad(f"gold[{i}]", f"must be a non-empty string, got {g!r}")
        return list(gold)
    if isinstance(gold, dict):
        if not gold:
            raise bad("gold", "an empty object; give at least one key and value")
        for k, v in gold.items():
            if not _is_text(v):
                raise bad(f"gold[{k!r}]", f"must be a non-empty string, got {v!r}")
        return dict(gold)
    hint = f' (write numbers as strings: "{gold}")' if isinstance(gold, (int, float)) else ""
    raise bad("gold", f"must be a string, a list of strings or an object of strings, got {gold!r}{hint}")


def _check_hops(hops: object, bad: _Bad) -> tuple[Hop, ...]:
    if not isinstance(hops, list) or not hops:
        raise bad("hops", f"must be a non-empty list of {{\"fact\": ..., \"answer\": ...}} objects, got {hops!r}")
    out: list[Hop] = []
    for i, h in enumerate(hops):
        if not isinstance(h, dict):
            raise bad(f"hops[{i}]", f"must be an object with keys fact and answer, got {h!r}")
        unknown = sorted(set(h) - set(_HOP_KEYS))
        if unknown:
            raise bad(f"hops[{i}]", f"unknown key(s) {', '.join(unknown)}; valid keys: fact, answer")
        if not _is_text(h.get("fact")):
            raise bad(f"hops[{i}].fact", "must be a non-empty string")
        answer = h.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise bad(f"hops[{i}].answer", f"must be a string or null, got {answer!r}")
        out.append(Hop(fact=h["fact"], answer=answer))
    return tuple(out)


def _check_meta(meta: object, bad: _Bad) -> dict[str, str | int | float]:
    if not isinstance(meta, dict):
        raise bad("meta", f"must be an object, got {meta!r}")
    for k, v in meta.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise bad(f"meta[{k!r}]", f"must be a string or a number, got {v!r}")
    return dict(meta)


def _check_segments(segments: object, bad: _Bad) -> tuple[tuple[str, str], ...]:
    if not isinstance(segments, list):
        raise bad("segments", f"must be a list of [kind, text] pairs, got {segments!r}")
    out: list[tuple[str, str]] = []
    for i, s in enumerate(segments):
        if not (isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and _is_text(s[1])):
            raise bad(f"segments[{i}]", f"must be a [kind, text] pair with non-empty text, got {s!r}")
        if s[0] not in SEGMENT_KINDS:
            raise bad(f"segments[{i}]", f"kind {s[0]!r} is not one of {', '.join(SEGMENT_KINDS)}")
        out.append((s[0], s[1]))
    return tuple(out)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number (write a finite number, or a string)")


def _lone_surrogate(value: object, where: str) -> tuple[str, str] | None:
    """(field, character) of the first string in ``value`` that holds a lone surrogate (a ``\\udXXX`` escape that is
    not half of a pair: not a character, and not writable as UTF-8), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return where, f"U+{ord(value[e.start]):04X}"
        return None
    if isinstance(value, dict):  # a key names the field: "meta", then "meta['k']"
        places = [(f"{where}[{k!r}]" if where else str(k), k, v) for k, v in value.items()]
    elif isinstance(value, list):
        places = [(f"{where}[{i}]", None, v) for i, v in enumerate(value)]
    else:
        return None
    for place, key, v in places:
        found = (_lone_surrogate(key, where) if isinstance(key, str) else None) or _lone_surrogate(v, place)
        if found:
            return found
    return None


def parse_task_line(text: str, path: Path, line: int) -> Task:
    """Validate one JSON line and build its task.

    Args:
        text: the line's text.
        path: the file, for messages.
        line: the 1-based line number, for messages.

    Raises:
        TaskFormatError: ``file:line: field: what is wrong``.
    """
    bad = _Bad(path, line)
    try:
        d = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise bad("json", f"not valid JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # NaN, Infinity: Python's json reads them, JSON has no such numbers
        raise bad("json", str(e)) from None
    except RecursionError:
        raise bad("json", "nested too deeply to be a task (lists or objects inside each other thousands of times)"
                  ) from None
    if not isinstance(d, dict):
        raise bad("json", f"each line must be one JSON object, got {type(d).__name__}")
    surrogate = _lone_surrogate(d, "")
    if surrogate is not None:
        raise bad(surrogate[0], f"holds the lone surrogate {surrogate[1]}, which is not a character (a broken "
                                "\\u escape, or text that was not UTF-8); fix the text")
    if "source" in d:
        raise bad("source", "a task file's tasks have source 'jsonl' (the source decides how they are laid out and "
                            "scored); remove the field (keep provenance in `meta`)")
    unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise bad(unknown[0], f"unknown field; valid fields: {', '.join(_REQUIRED + _OPTIONAL)}")
    for key in _REQUIRED:
        if key not in d:
            raise bad(key, "missing (required fields: task_id, question, gold, hops)")
    for key in ("task_id", "question"):
        if not _is_text(d[key]):
            raise bad(key, f"must be a non-empty string, got {d[key]!r}")
    if "topic" in d and not isinstance(d["topic"], str):
        raise bad("topic", f"must be a string, got {d['topic']!r}")
    if d.get("condition") is not None:  # null: absent
        if not _is_text(d["condition"]):
            raise bad("condition", f"must be a non-empty string, got {d['condition']!r}")
        if not d.get("segments"):
            raise bad("condition", "only a task with its own `segments` names its condition; the ICE builder "
                                   "makes the conditions of a task given by its hops")
    return Task(
        task_id=d["task_id"],
        source="jsonl",
        question=d["question"],
        gold=_check_gold(d["gold"], bad),
        hops=_check_hops(d["hops"], bad),
        topic=d.get("topic", ""),
        meta=_check_meta(d["meta"], bad) if "meta" in d else {},
        segments=_check_segments(d["segments"], bad) if "segments" in d else (),
        condition=d.get("condition"),
    )


def load_jsonl_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    """Read and validate a task file; return its first ``n`` tasks in file order (all when ``n`` is None).

    Args:
        path: the ``.jsonl`` file.
        n: how many tasks to return; the whole file is validated either way.

    Raises:
        TaskFormatError: a missing or empty file, a bad line (``file:line: field: what is wrong``), or a
            duplicate ``task_id`` (naming both lines).
    """
    p = Path(path)
    if not p.is_file():
        raise TaskFormatError(f"{p}: no such task file (set tasks.path to a .jsonl file)")
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    offset = 0
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (some editors write one)
                raw, start = raw[3:], start + 3
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TaskFormatError(
                    f"{p}:{lineno}: not UTF-8 text: byte 0x{raw[e.start]:02x} at column {e.start + 1} (byte offset "
                    f"{start + e.start} in the file) {e.reason}; save the file as UTF-8 (is it Latin-1?)"
                ) from None
            if not text.strip():
                continue
            task = parse_task_line(text, p, lineno)
            if task.task_id in first_line:
                raise TaskFormatError(
                    f"{p}:{lineno}: task_id: {task.task_id!r} duplicates the task on line {first_line[task.task_id]}; "
                    "task ids must be unique"
                )
            first_line[task.task_id] = lineno
            tasks.append(task)
    if not tasks:
        raise TaskFormatError(f"{p}: the file holds no tasks (one JSON object per line expected)")
    if n is not None and n < len(tasks):
        log.info("%s: using the first %d of %d tasks (tasks.n)", p, n, len(tasks))
        return tasks[:n]
    return tasks
