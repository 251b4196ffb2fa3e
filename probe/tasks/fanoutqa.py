"""FanOutQA dev questions (Zhu et al., 2024; CC BY-SA 4.0) with their human decompositions as hops
(docs/method.md#sources)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np

from probe.errors import DataUnavailableError
from probe.types import Gold, Hop, Task

log = logging.getLogger(__name__)

DEV_FILE = "fanout-final-dev.json"
_INSTALL = "pip install --no-deps fanoutqa"

# The JSON answer of a (sub-)question: a primitive, a list of primitives or a mapping to primitives.
RawAnswer = str | int | float | bool | list | dict | None


def dev_set_path() -> Path:
    """The packaged FanOutQA dev set, found without importing the package.

    Raises:
        DataUnavailableError: the package or its data file is not installed.
    """
    spec = importlib.util.find_spec("fanoutqa")
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(f"the FanOutQA dev set comes with the fanoutqa package; install it: {_INSTALL}")
    for root in spec.submodule_search_locations:
        path = Path(root) / "data" / DEV_FILE
        if path.is_file():
            return path
    raise DataUnavailableError(
        f"the fanoutqa package is installed but holds no data/{DEV_FILE}; reinstall it ({_INSTALL}) or set "
        "tasks.path to the dev-set JSON"
    )


def _value_text(v: RawAnswer) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def _gold(answer: RawAnswer) -> Gold | None:
    """The gold in toolkit form; None when no value is left to match."""
    if isinstance(answer, dict):
        mapping = {str(k): _value_text(v) for k, v in answer.items() if _value_text(v)}
        return mapping or None
    if isinstance(answer, list):
        items = [_value_text(v) for v in answer if _value_text(v)]
        return items or None
    text = _value_text(answer)
    return text or None


def _answer_prose(answer: RawAnswer) -> str:
    """A sub-answer as running text: lists joined with commas and "and", mappings as "key: value" pairs."""
    if isinstance(answer, dict):
        parts = [f"{k}: {_value_text(v) or 'unknown'}" for k, v in answer.items()]
        return "; ".join(parts)
    if isinstance(answer, list):
        items = [_value_text(v) for v in answer if _value_text(v)]
        if not items:
            return "none"
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return _value_text(answer) or "unknown"


def render_fact(question: str, answer: RawAnswer) -> str:
    """One sub-question and its answer as a fact sentence.

    Args:
        question: the sub-question as written by the annotator.
        answer: its JSON answer.

    Returns:
        ``The answer to '<question>' is <answer>.``
    """
    prose = _answer_prose(answer).rstrip(".")
    return f"The answer to '{question.strip()}' is {prose}."


def _leaves(steps: list[dict]) -> list[dict]:
    """Leaf sub-questions of a decomposition, depth first."""
    out: list[dict] = []
    for s in steps:
        out += _leaves(s["decomposition"]) if s.get("decomposition") else [s]
    return out


def task_from_item(item: dict) -> Task | None:
    """The task of one dev-set question, or None when it has no gold value or no decomposition."""
    gold = _gold(item["answer"])
    leaves = _leaves(item.get("decomposition") or [])
    if gold is None or not leaves:
        return None
    hops = tuple(
        Hop(
            fact=render_fact(s["question"], s["answer"]),
            answer=None if isinstance(s["answer"], (list, dict)) else (_value_text(s["answer"]) or None),
        )
        for s in leaves
    )
    categories = item.get("categories") or []
    return Task(
        task_id=f"fqa-{item['id']}",
        source="fanoutqa",
        question=item["question"].strip(),
        gold=gold,
        hops=hops,
        topic=str(categories[0]) if categories else "",
        meta={"n_hops": len(hops), "categories": ", ".join(str(c) for c in categories)},
    )


def load_fanoutqa(n: int, max_hops: int, seed: int, path: str | Path | None = None) -> list[Task]:
    """``n`` FanOutQA dev questions with at most ``max_hops`` decomposition steps, chosen by ``seed``.

    The eligible questions (at most ``max_hops`` leaf steps, a non-empty gold) are shuffled with
    ``numpy.random.default_rng(seed)`` and the first ``n`` kept, then returned in file order, so the choice and
    the order are the same on every run. When fewer than ``n`` are eligible, all of them are returned (logged).

    Args:
        n: number of questions (>= 1).
        max_hops: skip questions with more decomposition steps (leaf sub-questions) than this.
        seed: which questions are chosen.
        path: a dev-set JSON to read instead of the packaged one.

    Raises:
        DataUnavailableError: the package or file is missing or unreadable, or no question has at most
            ``max_hops`` steps.
    """
    p = Path(path) if path is not None else dev_set_path()
    if not p.is_file():
        raise DataUnavailableError(f"{p}: no such FanOutQA file (tasks.path); or drop tasks.path to use {_INSTALL}")
    try:
        items = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataUnavailableError(f"{p}: not a readable FanOutQA JSON file ({e})") from None
    if not isinstance(items, list):
        raise DataUnavailableError(f"{p}: expected a JSON list of questions, got {type(items).__name__}")
    tasks = [t for t in (task_from_item(it) for it in items) if t is not None]
    eligible = [t for t in tasks if len(t.hops) <= max_hops]
    if not eligible:
        fewest = min((len(t.hops) for t in tasks), default=0)
        raise DataUnavailableError(
            f"{p}: no FanOutQA question has at most {max_hops} decomposition steps (the fewest is {fewest}); "
            f"raise tasks.max_hops to {fewest} or more"
        )
    if len(eligible) < n:
        log.warning("%s: only %d questions have at most %d steps; using all of them", p, len(eligible), max_hops)
    keep = np.sort(np.random.default_rng(seed).permutation(len(eligible))[:n])
    return [eligible[int(i)] for i in keep]
