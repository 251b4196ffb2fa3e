"""Behavioural scoring of one generation against its task: answer, EM, hop recall, truncation (docs/method.md#scoring)."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from probe.types import Gold, Hop, Task

# the rule that decided a trial's answer: the ICE rules (docs/method.md#scoring) and CogniLoad's fallbacks
# (probe.scoring.cogniload: poi_category, poi, last)
Extraction = Literal["boxed", "answer_line", "last_line", "echo", "none", "poi_category", "poi", "last"]
EXTRACTIONS: tuple[str, ...] = get_args(Extraction)
STRICT_EXTRACTIONS = frozenset({"boxed", "answer_line"})  # the rules strict EM counts: the model marked its answer
# words an echo may hold besides the gold and the question's own words (the echo rule, docs/method.md#scoring)
ECHO_FILLER = frozenset(
    "is are was were be been being am has have had do does did of in on at by for from to with into onto about as "
    "and or but nor so then that which who whom whose this these those it its it's they their there also".split()
)

REL_TOL = 1e-4  # relative tolerance of numeric answers

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(r"^[\s*_#>\-]*(?:final\s+)?answer[\s*_]*[:：]\s*(.*)$", re.IGNORECASE)
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|emph|operatorname|mbox)\s*\{([^{}]*)\}")
_LATEX_SPACES = re.compile(r"\\[,;:! ]|~")
_SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "bn": 1e9}
_NUMBER_WORDS = {
    w: float(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_NUM = r"(?:\d+(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_IN_TEXT = re.compile(
    rf"(?<![\w.,])(?P<sign>[-−])?[$€£]?\s?(?P<num>{_NUM})(?:\s*(?P<scale>thousand|million|billion|trillion|bn))?(?![\w])",
    re.IGNORECASE,
)
_NUMERIC_GOLD = re.compile(
    rf"^\s*(?P<sign>[-−])?[$€£]?\s?(?P<num>{_NUM})\s*(?P<scale>thousand|million|billion|trillion|bn)?\s*%?"
    r"(?:\s+[A-Za-z]+){0,3}\s*\.?\s*$",
    re.IGNORECASE,
)
_ARTICLES = frozenset({"a", "an", "the"})


@dataclass(frozen=True)
class Score:
    """The behavioural score of one generation.

    Attributes:
        answer: the extracted answer (cleaned of LaTeX/markdown markup); None when uninterpretable.
        em: exact match of ``answer`` against the gold (False when uninterpretable).
        hop_recall: share of hops with a known answer recalled in the output, in [0, 1]; None if no hop has one.
        truncated: generation hit ``max_new_tokens`` without an end token (as reported by the backend).
        uninterpretable: nothing could be extracted (see docs/method.md#scoring).
        extraction: the rule that decided (docs/method.md#scoring): "boxed", "answer_line", "last_line", "echo" or
            "none" (CogniLoad: its own, :mod:`probe.scoring.cogniload`).
    """

    answer: str | None
    em: bool
    hop_recall: float | None
    truncated: bool
    uninterpretable: bool
    extraction: Extraction


def _last_complete_box(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` whose braces close, or None if there is none."""
    found: str | None = None
    for m in _BOX_OPEN.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            found = text[m.end() : i - 1]
    return found


def _clean(s: str) -> str:
    """Strip LaTeX wrappers and spacing, math delimiters and markdown emphasis from an extracted answer."""
    prev = None
    while prev != s:  # unwrap nested \text{\textbf{..}}
        prev, s = s, _LATEX_WRAPPERS.sub(r"\1", s)
    s = _LATEX_SPACES.sub(" ", s)
    s = s.replace("\\$", "$").replace("\\%", "%").replace("\\(", "").replace("\\)", "")
    s = s.replace("$", " ") if s.count("$") >= 2 else s  # $...$ math delimiters, not a currency sign
    s = re.sub(r"\*\*|__|`", "", s)
    s = re.sub(r"^\s*(?:[*\-•]|\d+\.)\s+", "", s)  # a list bullet in front of a last line
    return " ".join(s.split()).strip()


def _extract(output: str) -> tuple[str | None, Extraction]:
    box = _last_complete_box(output)
    if box is not None:
        text = _clean(box)
        return (text or None), "boxed"
    lines = output.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _ANSWER_LINE.match(lines[i])
        if m is None:
            continue
        rest = _clean(m.group(1))
        if not rest:  # a label line ("**Answer:**") with the answer in the text below it
            rest = " ".join(c for c in (_clean(ln) for ln in lines[i + 1 :]) if c)
        return (rest or None), "answer_line"
    for line in reversed(lines):
        text = _clean(line)
        if text:
            return text, "last_line"
    return None, "none"


def extract_final_answer(output: str) -> tuple[str | None, Extraction]:
    """The final answer of a generation and how it was found (the extraction :func:`score_output` applies).

    Args:
        output: the generated text (the prompt excluded).

    Returns:
        (answer, extraction): the answer cleaned of markup, or None for an empty box or ``Answer:`` slot or a
        blank output; ``extraction`` is ``boxed``, ``answer_line``, ``last_line`` or ``none``.
    """
    return _extract(output)


def extract_answer(output: str) -> str | None:
    """The final answer of a generation: last complete ``\\boxed{}``, else an ``Answer:`` line, else last line.

    Args:
        output: the generated text (the prompt excluded).

    Returns:
        The answer text cleaned of markup, or None when nothing can be extracted (blank output, empty box or
        empty ``Answer:`` slot). Truncation is not known here; :func:`score_output` applies it.
    """
    return _extract(output)[0]


def normalize_answer(s: str) -> str:
    """Lower-case, strip accents, turn punctuation and symbols into spaces, drop a/an/the, collapse spaces.

    Punctuation becomes a space rather than vanishing, so "Quellin's" keeps the token "quellin".
    """
    s = unicodedata.normalize("NFKD", s)
    s = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in s if not unicodedata.combining(c))
    return " ".join(t for t in s.lower().split() if t not in _ARTICLES)


def _to_float(num: str, scale: str | None, sign: str | None) -> float:
    value = float(num.replace(",", ""))
    if scale:
        value *= _SCALES[scale.lower()]
    return -value if sign else value


def _numbers_in(text: str) -> list[tuple[float, bool]]:
    """Every number written in ``text`` with whether it carries a scale word (digits or a word zero..twenty)."""
    values = [(_to_float(m["num"], m["scale"], m["sign"]), bool(m["scale"])) for m in _NUMBER_IN_TEXT.finditer(text)]
    values += [(_NUMBER_WORDS[w], False) for w in re.findall(r"[a-z]+", text.lower()) if w in _NUMBER_WORDS]
    return values


def _gold_number(gold: str) -> tuple[float, float | None] | None:
    """A numeric gold's value, and its value in its own scale unit when it has a scale word ("11.1 billion")."""
    m = _NUMERIC_GOLD.match(gold)
    if m is None:
        return None
    unscaled = _to_float(m["num"], None, m["sign"]) if m["scale"] else None
    return _to_float(m["num"], m["scale"], m["sign"]), unscaled


def _contains_tokens(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _matches(text: str, gold: str, rel_tol: float = REL_TOL) -> bool:
    """One gold string against a text: numerically if the gold is a number, else as a contiguous token run."""
    target = _gold_number(gold)
    if target is not None:
        value, unscaled = target
        for v, has_scale in _numbers_in(text):
            if math.isclose(v, value, rel_tol=rel_tol, abs_tol=1e-9):
                return True
            if unscaled is not None and not has_scale and math.isclose(v, unscaled, rel_tol=rel_tol, abs_tol=1e-9):
                return True
        return False
    return _contains_tokens(normalize_answer(text).split(), normalize_answer(gold).split())


def _gold_values(gold: Gold) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    if isinstance(gold, dict):
        return [str(v) for v in gold.values()]
    return [str(v) for v in gold]


def exact_match(answer: str | None, gold: Gold, rel_tol: float = REL_TOL) -> bool:
    """Normalised exact match of an extracted answer against a gold string, list or mapping.

    Args:
        answer: the extracted answer (not the whole output); None never matches.
        gold: one string; a list (every element must be matched in the answer); a mapping (every value must be).
        rel_tol: relative tolerance for numeric golds.

    Returns:
        True when every gold value is matched (see docs/method.md#scoring for the per-string rule).
    """
    if answer is None:
        return False
    values = _gold_values(gold)
    return bool(values) and all(_matches(answer, g, rel_tol) for g in values)


_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+")


def _echoes(sentence: list[str], g: list[str], asked: set[str], names: set[str]) -> bool:
    """Whether one sentence's tokens name the gold tokens ``g`` as a repeated subject (the echo rule)."""
    starts: list[int] = []
    for i in range(len(sentence) - len(g) + 1):
        if sentence[i : i + len(g)] == g and (not starts or i >= starts[-1] + len(g)):
            starts.append(i)
    if len(starts) < 2:
        return False
    frame = sentence[: starts[0]] + sentence[starts[0] + len(g) : starts[1]]  # before the first, between the two
    return all((t in asked or t in ECHO_FILLER) and t not in names for t in frame)


def is_echo(answer: str, gold: str, question: str) -> bool:
    """Whether a fallback answer names ``gold`` only as a repeated subject (the echo rule of docs/method.md#scoring).

    Args:
        answer: the extracted last line.
        gold: one gold string; a numeric gold is never an echo (numbers are matched by value, not by words).
        question: the task's question.

    Returns:
        True when every sentence of the answer that names the gold names it at least twice, and the words before
        its first occurrence and between the first two are all words of the question or in :data:`ECHO_FILLER`,
        none of them one of the question's names (its capitalised words after the first).
    """
    g = normalize_answer(gold).split()
    if not g or _gold_number(gold) is not None:
        return False
    words = question.split()
    names = set(normalize_answer(" ".join(w for w in words[1:] if w[:1].isupper())).split())
    asked = set(normalize_answer(question).split())
    naming = [toks for toks in (normalize_answer(x).split() for x in _SENTENCE_BREAK.split(answer))
              if _contains_tokens(toks, g)]
    return bool(naming) and all(_echoes(toks, g, asked, names) for toks in naming)


def hop_recall(output: str, hops: Sequence[Hop]) -> float | None:
    """Share of hops with a known intermediate answer whose answer appears in the output.

    Args:
        output: the whole generated text (reasoning included).
        hops: the task's hops; those with ``answer`` None or blank are not counted.

    Returns:
        A value in [0, 1], or None when no hop has an answer.
    """
    known = [h.answer for h in hops if h.answer is not None and normalize_answer(h.answer)]
    if not known:
        return None
    return sum(_matches(output, a) for a in known) / len(known)


def score_output(output: str | None, task: Task, truncated: bool) -> Score:
    """Score one generation: extracted answer, EM, hop recall, truncation and interpretability.

    Args:
        output: the generated text; None when the backend returned nothing.
        task: the task the prompt was built from (gold and hops).
        truncated: the backend reports that generation hit ``max_new_tokens`` without an end token.

    Returns:
        The :class:`Score`; see docs/method.md#scoring for the definition of *uninterpretable*.
    """
    text = output or ""
    answer, how = _extract(text)
    if answer is not None and truncated and how == "last_line":
        answer, how = None, "none"  # a cut-off last line is a fragment of reasoning, not an answer
    uninterpretable = answer is None
    em = exact_match(answer, task.gold)
    if em and how == "last_line" and any(is_echo(answer or "", g, task.question) for g in _gold_values(task.gold)):
        em, how = False, "echo"
    return Score(
        answer=answer,
        em=em,
        hop_recall=hop_recall(text, task.hops),
        truncated=truncated,
        uninterpretable=uninterpretable,
        extraction=how,
    )


def _normalised_words(text: str) -> list[tuple[str, int, int]]:
    """The words of :func:`probe.scoring.answers.normalize_answer` with their character spans in ``text``.

    Each character is normalised on its own (NFKD, combining marks dropped, punctuation and symbols turned into a
    space, lower-cased), so every normalised word keeps the span of the original characters it came from; articles
    are dropped as the normaliser drops them.
    """
    chars: list[tuple[str, int]] = []
    for i, c in enumerate(text):
        for d in unicodedata.normalize("NFKD", c):
            if unicodedata.combining(d):
                continue
            chars.append((" " if unicodedata.category(d)[0] in "PS" else d.lower(), i))
    words: list[tuple[str, int, int]] = []
    cur: list[str] = []
    start = end = 0
    for ch, i in chars + [(" ", len(text))]:
        if ch.isspace():
            if cur:
                words.append(("".join(cur), start, end))
                cur = []
            continue
        if not cur:
            start = i
        cur.append(ch)
        end = i + 1
    return [w for w in words if w[0] not in _ARTICLES]


def mention_spans(text: str, entity: str, rel_tol: float = REL_TOL) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every mention of ``entity`` in ``text``, in order of position.

    The rule is the one exact match and hop recall apply (:mod:`probe.scoring.answers`): a numeric entity matches
    any number written in the text with the same value (relative tolerance ``rel_tol``; a bare number also matches
    an entity with a scale word in its own unit), any other entity matches where its normalised words occur as one
    contiguous run of the text's normalised words. So ``mention_spans(text, e)`` is non-empty exactly when
    ``e`` is recalled in ``text``.
    """
    target = _gold_number(entity)
    if target is not None:
        value, unscaled = target
        spans: list[tuple[int, int]] = []
        found: list[tuple[int, int, float, bool]] = [
            (m.start() + len(m.group()) - len(m.group().lstrip()), m.end(), _to_float(m["num"], m["scale"],
                                                                                      m["sign"]), bool(m["scale"]))
            for m in _NUMBER_IN_TEXT.finditer(text)]  # the pattern may take a space before the digits: not kept
        found += [(m.start(), m.end(), _NUMBER_WORDS[m.group().lower()], False)
                  for m in re.finditer(r"[A-Za-z]+", text) if m.group().lower() in _NUMBER_WORDS]
        for a, b, v, has_scale in found:
            if math.isclose(v, value, rel_tol=rel_tol, abs_tol=1e-9) or (
                    unscaled is not None and not has_scale and math.isclose(v, unscaled, rel_tol=rel_tol,
                                                                           abs_tol=1e-9)):
                spans.append((a, b))
        return sorted(spans)
    needle = [w for w, _, _ in _normalised_words(entity)]
    if not needle:
        return []
    words = _normalised_words(text)
    n = len(needle)
    return [(words[i][1], words[i + n - 1][2]) for i in range(len(words) - n + 1)
            if [w for w, _, _ in words[i : i + n]] == needle]
