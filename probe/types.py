"""The value types that flow between stages: Task -> Prompt (segments) -> TokenizedPrompt (token spans).

Every stage takes the previous stage's type and returns its own; nothing here imports a later stage.
Spans are half-open ``[start, end)`` and are recorded while a prompt is built, never recovered afterwards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Union

from probe.errors import SpanError

SegmentKind = Literal["instruction", "germane", "extraneous", "filler", "question", "sink"]
SEGMENT_KINDS: tuple[str, ...] = ("instruction", "germane", "extraneous", "filler", "question", "sink")
# Kinds whose tokens count towards the load ℓ (docs/method.md#load): everything but sink, instruction and question.
LOAD_KINDS: tuple[str, ...] = ("germane", "extraneous", "filler")

Condition = Literal["Control", "LongControl", "Saturation", "Residue"]
CONDITIONS: tuple[str, ...] = ("Control", "LongControl", "Saturation", "Residue")

# A gold answer: one string, a list (every element must be matched) or a mapping (every value matched).
Gold = Union[str, list[str], dict[str, str]]


@dataclass(frozen=True)
class Hop:
    """One germane fact of a multi-hop question and, where known, its intermediate answer."""

    fact: str
    answer: str | None = None


@dataclass(frozen=True)
class Task:
    """One multi-hop question: ``Decompose(q)`` is ``hops``, in order.

    ``segments`` is optional: a task laid out natively (its source's layout, :mod:`probe.tasks`) gives its prompt
    body here as ``(kind, text)`` pairs and the builder uses them as they are (CogniLoad: initial state,
    statements; a JSONL line with ``segments``). ``condition`` names the condition such a prompt is recorded under
    when its family does not fix one (default ``Custom``; an ICE condition name puts it in that condition's
    estimates).
    """

    task_id: str
    source: str
    question: str
    gold: Gold
    hops: tuple[Hop, ...]
    topic: str = ""
    meta: dict[str, str | int | float] = field(default_factory=dict)
    segments: tuple[tuple[str, str], ...] = ()
    condition: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Task":
        return Task(
            task_id=d["task_id"],
            source=d["source"],
            question=d["question"],
            gold=d["gold"],
            hops=tuple(Hop(**h) for h in d["hops"]),
            topic=d.get("topic", ""),
            meta=dict(d.get("meta", {})),
            segments=tuple((k, t) for k, t in d.get("segments", ())),
            condition=d.get("condition"),
        )


@dataclass(frozen=True)
class Segment:
    """A contiguous piece of a prompt's text: ``text[char_start:char_end]`` is ``text`` of this segment."""

    kind: str
    char_start: int
    char_end: int
    label: str = ""  # e.g. "hop0", "d3" (distractor 3), "q"

    def __post_init__(self) -> None:
        if self.kind not in SEGMENT_KINDS:
            raise SpanError(f"segment kind {self.kind!r} is not one of {SEGMENT_KINDS}")
        if not 0 <= self.char_start < self.char_end:
            raise SpanError(f"{self.kind} segment chars [{self.char_start}, {self.char_end}) is empty or negative")


@dataclass(frozen=True)
class Prompt:
    """A built prompt: the user-message text and its segments, in order and non-overlapping.

    ``family`` is the task family (:mod:`probe.tasks`: ``ice``, ``cogniload``) that scores and analyses it.
    ``prompt_id`` follows the one grammar of :func:`probe.runfolder.make_prompt_id`
    (``<task_id>|<condition>|L<load>|r<replication>[|@<tokenizer>]``).
    """

    prompt_id: str
    task_id: str
    source: str
    condition: str
    load: int  # target load in percent (0 for Control)
    achieved_load: float  # measured in the tokenizer named by ``tokenizer``, percent
    replication: int
    text: str
    segments: tuple[Segment, ...]
    tokenizer: str = ""
    s_sim: float | None = None
    family: str = "ice"

    def __post_init__(self) -> None:
        prev_end = 0
        for seg in self.segments:
            if seg.char_start < prev_end:
                raise SpanError(
                    f"prompt {self.prompt_id}: segment {seg.label or seg.kind} starts at {seg.char_start}, "
                    f"before the previous one ends ({prev_end})"
                )
            if seg.char_end > len(self.text):
                raise SpanError(f"prompt {self.prompt_id}: segment {seg.label} ends past the text ({len(self.text)})")
            prev_end = seg.char_end

    def segment_text(self, seg: Segment) -> str:
        return self.text[seg.char_start : seg.char_end]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["segments"] = [asdict(s) for s in self.segments]
        return d

    @staticmethod
    def from_dict(d: dict) -> "Prompt":
        return Prompt(
            prompt_id=d["prompt_id"],
            task_id=d["task_id"],
            source=d.get("source", ""),
            condition=d["condition"],
            load=int(d["load"]),
            achieved_load=float(d["achieved_load"]),
            replication=int(d["replication"]),
            text=d["text"],
            segments=tuple(Segment(**s) for s in d["segments"]),
            tokenizer=d.get("tokenizer", ""),
            s_sim=d.get("s_sim"),
            family=d["family"] if "family" in d else family_of_old_record(d.get("source", "")),
        )


# Records written before they named their family came from the built-in sources only; of those, cogniload's
# trials are the cogniload family and every other source's are ice.
_OLD_RECORD_FAMILIES: dict[str, str] = {"cogniload": "cogniload"}


def family_of_old_record(source: str) -> str:
    """The family of a prompt or trial record written before records named it, from its ``source``."""
    return _OLD_RECORD_FAMILIES.get(source, "ice")


@dataclass(frozen=True)
class Span:
    """A token span ``[start, end)`` of one segment in a tokenized prompt."""

    kind: str
    start: int  # first token, inclusive
    end: int  # one past the last token
    label: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise SpanError(f"{self.kind} span [{self.start}, {self.end}) is empty or negative")

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TokenizedPrompt:
    """Token ids of the full model input (chat template applied) and a span for every token.

    ``spans`` partition ``range(len(input_ids))``: template markup and special tokens are ``sink`` spans.
    """

    input_ids: tuple[int, ...]
    spans: tuple[Span, ...]

    def __post_init__(self) -> None:
        pos = 0
        for s in self.spans:
            if s.start != pos:
                raise SpanError(f"token spans leave a gap or overlap at token {pos} (next span starts {s.start})")
            pos = s.end
        if pos != len(self.input_ids):
            raise SpanError(f"token spans cover {pos} tokens, input has {len(self.input_ids)}")

    def count(self, kind: str) -> int:
        return sum(s.n_tokens for s in self.spans if s.kind == kind)
