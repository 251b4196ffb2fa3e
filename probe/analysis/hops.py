"""Hop tracking: where the model's output names each hop's answer, and which prompt segment it read while writing it.
Specified in docs/probes.md#hop-tracking."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from probe.analysis.hop_tests import HopMassTest, hop_mass_tests
from probe.analysis.inference import proportion_ci
from probe.attention.answer import AnswerAttention
from probe.codec import OMIT, Grid
from probe.errors import ProbeError
from probe.scoring.answers import mention_spans
from probe.records import TrialRecord
from probe.types import Gold, Hop, Prompt, Task

HopLabel = Literal["read_right_fact", "read_distractor", "other", "not_named"]
HOP_LABELS: tuple[str, ...] = ("read_right_fact", "read_distractor", "other", "not_named")
# where a mention's attention went, by role of the key segment (the columns of HopRow.mass and of the arrays)
CATEGORIES: tuple[str, ...] = ("hop", "other_germane", "extraneous", "filler", "question", "instruction", "sink",
                               "answer")
CONTENT_KINDS: tuple[str, ...] = ("germane", "extraneous", "filler")
Target = Literal["hop_answer", "wrong_answer"]


class HopTrackingError(ProbeError):
    """A trial's answer tokens, output and segments do not fit together (names the trial and what differs)."""


class HopLabelError(HopTrackingError):
    """A prompt has no germane segment labelled for some hop (laid out by its task, not by the ICE builder)."""


# ------------------------------------------------------------------------------------------------ mentions


@dataclass(frozen=True)
class Mention:
    """The first mention of an entity in an output.

    Attributes:
        char_start, char_end: its characters in the output.
        token_start, token_end: the generated tokens that overlap them (``[start, end)``).
        n_mentions: how many mentions the output holds.
    """

    char_start: int
    char_end: int
    token_start: int
    token_end: int
    n_mentions: int


def first_mention(text: str, entity: str, char_spans: np.ndarray) -> Mention | None:
    """The first mention of ``entity`` in ``text`` and its token span, or None when the output never names it.

    Args:
        text: the output.
        entity: the entity (a hop's answer, the gold, a wrong answer).
        char_spans: ``(T, 2)`` token character spans (:func:`token_char_spans`).
    """
    spans = mention_spans(text, entity)
    if not spans:
        return None
    a, b = spans[0]
    starts, ends = char_spans[:, 0], char_spans[:, 1]
    hit = np.flatnonzero((starts < b) & (ends > a) & (ends > starts))
    if hit.size == 0:
        return None
    return Mention(a, b, int(hit[0]), int(hit[-1]) + 1, len(spans))


# -------------------------------------------------------------------------------------------- masses, labels


def hop_segments(segment_kinds: Sequence[str], segment_labels: Sequence[str]) -> dict[int, int]:
    """Hop index -> index of the germane segment stating it (the builder labels hop ``i``'s fact ``hop<i>``)."""
    out: dict[int, int] = {}
    for s, (kind, label) in enumerate(zip(segment_kinds, segment_labels)):
        m = re.fullmatch(r"hop(\d+)", label)
        if kind == "germane" and m:
            out[int(m.group(1))] = s
    return out


def category_masses(mass: np.ndarray, kinds: Sequence[str], hop_segment: int) -> np.ndarray:
    """``(..., C)`` mass per :data:`CATEGORIES` from ``(..., S + 1)`` segment masses (last column: the answer)."""
    s = len(kinds)
    if mass.shape[-1] != s + 1:
        raise ValueError(f"mass has {mass.shape[-1]} columns; expected {s + 1} (segments and the answer)")
    kinds_arr = np.asarray(kinds)
    cols: list[np.ndarray] = []
    for cat in CATEGORIES:
        if cat == "hop":
            sel = np.zeros(s, dtype=bool)
            sel[hop_segment] = True
        elif cat == "other_germane":
            sel = kinds_arr == "germane"
            sel[hop_segment] = False
        elif cat == "answer":
            cols.append(mass[..., s])
            continue
        else:
            sel = kinds_arr == cat
        cols.append(mass[..., :s][..., sel].sum(axis=-1))
    return np.stack(cols, axis=-1)


def layer_window(n_layers: int) -> tuple[int, int]:
    """The depth window of the label: the upper half of the layers, ``[n_layers // 2, n_layers)``."""
    return n_layers // 2, n_layers


def pooled_segment_mass(mass: np.ndarray, rows: slice, window: tuple[int, int]) -> np.ndarray:
    """``(S + 1,)`` mass per segment of ``mass[rows]`` averaged over the mention's tokens, the window's layers and
    every head."""
    lo, hi = window
    return mass[rows, lo:hi].astype(np.float64).mean(axis=(0, 1, 2))


def label_of(pooled: np.ndarray, kinds: Sequence[str], hop_segment: int, names_entity: Sequence[bool]
             ) -> tuple[HopLabel, int]:
    """The label of one mention from its pooled segment masses, and the content segment holding the most.

    Args:
        pooled: ``(S + 1,)`` or ``(S,)`` pooled mass per segment (:func:`pooled_segment_mass`).
        kinds: the segments' kinds.
        hop_segment: the germane segment stating the hop.
        names_entity: per segment, whether its text names the entity written.

    Returns:
        (label, index of the content segment with the largest mass); ties go to the earlier segment.
    """
    content = [s for s, k in enumerate(kinds) if k in CONTENT_KINDS]
    if not content:
        return "other", -1
    top = max(content, key=lambda s: (float(pooled[s]), -s))
    if top == hop_segment:
        return "read_right_fact", top
    if kinds[top] == "extraneous" and names_entity[top]:
        return "read_distractor", top
    return "other", top


@dataclass(frozen=True)
class HopRow:
    """One hop of one trial (a row of ``tables/hop_tracking_trials.csv``).

    Attributes:
        trial_id, model, task_id, condition, load: the trial.
        hop: the hop's index (0-based) and ``n_hops`` the task's hops.
        target: ``hop_answer`` (the hop's own answer was tracked) or ``wrong_answer`` (the last hop of a wrong
            trial: the extracted wrong answer was tracked).
        entity: the text tracked.
        label: the label from raw attention mass; ``label_value`` from value-weighted mass (None without it).
        top_segment, top_segment_value: the content segment holding the most mass (its label), raw and
            value-weighted; None when not named.
        entity_in_distractor: some extraneous segment names the entity.
        n_mentions: mentions in the output (0: not named); ``token_start`` / ``token_end`` the first one's tokens.
        mass: pooled raw mass per :data:`CATEGORIES` in the depth window (None when not named);
            ``vmass`` the same value-weighted.
        em: the trial's exact match (the outcome the hop-mass tests compare; None in files written before it).
    """

    trial_id: str
    model: str
    task_id: str
    condition: str
    load: int
    hop: int
    n_hops: int
    target: str
    entity: str
    label: str
    label_value: str | None
    top_segment: str | None
    top_segment_value: str | None
    entity_in_distractor: bool
    n_mentions: int
    token_start: int | None
    token_end: int | None
    mass: tuple[float, ...] | None
    vmass: tuple[float, ...] | None
    em: float | None = None


@dataclass(frozen=True)
class TrialHops:
    """Every hop of one trial: the rows and, per hop named, its ``(L, H, C)`` category masses (raw, value)."""

    rows: tuple[HopRow, ...]
    masses: tuple[np.ndarray | None, ...]
    vmasses: tuple[np.ndarray | None, ...]


def _hop_entity(hops: Sequence[Hop], i: int, gold: Gold) -> str | None:
    h = hops[i].answer
    if h is not None and h.strip():
        return h
    if i == len(hops) - 1 and isinstance(gold, str) and gold.strip():
        return gold
    return None


def track_trial(answer: AnswerAttention, trial: TrialRecord, task: Task, segment_texts: Mapping[int, str],
                window: tuple[int, int] | None = None) -> TrialHops:
    """Find, measure and label every hop of one trial (docs/probes.md#hop-tracking).

    Args:
        answer: the trial's answer attention, with the character span of each answer token (``chars``).
        trial: the trial (its output, extracted answer and exact match; its ids are copied into the rows).
        task: its task (the hops, the last one's answer the gold).
        segment_texts: segment index -> text, for the extraneous segments (whether one names the entity).
        window: layers ``[lo, hi)`` of the label; default :func:`layer_window`.

    Raises:
        HopTrackingError: the prompt has no germane segment labelled for some hop, the record holds no token
            spans, or they do not match the answer's tokens.
    """
    char_spans = answer.chars
    output, hops, em, extracted = trial.output or "", task.hops, trial.em, trial.answer
    if char_spans is None:
        raise HopTrackingError(f"{trial.trial_id}: the answer record holds no token spans")
    if len(char_spans) != len(answer.tokens):
        raise HopTrackingError(f"{trial.trial_id}: {len(char_spans)} token spans for {len(answer.tokens)} answer "
                               "tokens")
    kinds = answer.segment_kinds
    where = hop_segments(kinds, answer.segment_labels)
    missing = [i for i in range(len(hops)) if i not in where]
    if missing:
        raise HopLabelError(f"{trial.trial_id}: no germane segment labelled hop{missing[0]} in the prompt (segments "
                               f"{', '.join(answer.segment_labels)}); hop tracking needs the ICE builder's labels")
    lo, hi = window or layer_window(answer.n_layers)
    rows: list[HopRow] = []
    masses: list[np.ndarray | None] = []
    vmasses: list[np.ndarray | None] = []
    wrong = em is not None and em < 1 and extracted is not None
    for i in range(len(hops)):
        last = i == len(hops) - 1
        entity = extracted if last and wrong else _hop_entity(hops, i, task.gold)
        if entity is None:
            continue
        target: Target = "wrong_answer" if last and wrong else "hop_answer"
        seg = where[i]
        names = [kinds[s] == "extraneous" and bool(mention_spans(segment_texts.get(s, ""), entity))
                 for s in range(len(kinds))]
        mention = first_mention(output, entity, char_spans)
        base = HopRow(trial_id=trial.trial_id, model=trial.model, task_id=trial.task_id, condition=trial.condition,
                      load=int(trial.load), hop=i,
                      n_hops=len(hops), target=target, entity=entity, label="not_named",
                      label_value=None if answer.vmass is None else "not_named", top_segment=None,
                      top_segment_value=None, entity_in_distractor=any(names), n_mentions=0, token_start=None,
                      token_end=None, mass=None, vmass=None, em=None if em is None else float(em))
        if mention is None:
            rows.append(base)
            masses.append(None)
            vmasses.append(None)
            continue
        span = slice(mention.token_start, mention.token_end)
        label, top = label_of(pooled_segment_mass(answer.mass, span, (lo, hi)), kinds, seg, names)
        cat = category_masses(answer.mass[span].astype(np.float64).mean(axis=0), kinds, seg)
        vlabel: str | None = None
        vtop: int | None = None
        vcat: np.ndarray | None = None
        if answer.vmass is not None:
            vlabel, vtop = label_of(pooled_segment_mass(answer.vmass, span, (lo, hi)), kinds, seg, names)
            vcat = category_masses(answer.vmass[span].astype(np.float64).mean(axis=0), kinds, seg)
        rows.append(replace(
            base, label=label, label_value=vlabel, top_segment=answer.segment_labels[top] if top >= 0 else None,
            top_segment_value=answer.segment_labels[vtop] if vtop is not None and vtop >= 0 else None,
            n_mentions=mention.n_mentions, token_start=mention.token_start, token_end=mention.token_end,
            mass=tuple(float(x) for x in cat[lo:hi].mean(axis=(0, 1))),
            vmass=None if vcat is None else tuple(float(x) for x in vcat[lo:hi].mean(axis=(0, 1)))))
        masses.append(cat)
        vmasses.append(vcat)
    return TrialHops(tuple(rows), tuple(masses), tuple(vmasses))


# ----------------------------------------------------------------------------------------------- cells, run


@dataclass(frozen=True)
class HopShare:
    """The share of one label in a cell, with its interval clustered by question.

    Attributes:
        label: one of :data:`HOP_LABELS`.
        count: trial-hops with the label; ``share`` = count / the cell's ``n``.
        ci_low, ci_high: the 1 − alpha interval (:func:`probe.analysis.inference.proportion_ci`, clustered by
            question); None with one question.
        n_effective: the effective sample size behind it.
        reason: why no interval was given.
    """

    label: str
    count: int
    share: float | None
    ci_low: float | None
    ci_high: float | None
    n_effective: float | None
    reason: str | None


@dataclass(frozen=True)
class HopCell:
    """Hop-tracking labels of one model × condition × load, for one measure and subset.

    Attributes:
        model, condition, load: the cell.
        measure: ``raw`` (attention weights) or ``value`` (value-weighted).
        subset: ``all`` (every hop of every trial), ``correct_named`` (the hops whose own answer the output names:
            what the model read when it wrote the right entity) or ``wrong_answer`` (the last hop of the wrong
            trials, where the tracked entity is the wrong answer); :func:`in_subset`.
        n: trial-hops; ``n_trials`` trials; ``n_questions`` questions (the clusters).
        shares: one :class:`HopShare` per label of :data:`HOP_LABELS`.
        mass: mean pooled mass per :data:`CATEGORIES` over the named trial-hops (depth window, heads pooled);
            None where none is named.
        layers: the depth window ``[lo, hi)``.
        grid: the ``(layer, head, category)`` mean over the named trial-hops (all layers); None where none is
            named.
    """

    model: str
    condition: str
    load: int
    measure: str
    subset: str
    n: int
    n_trials: int
    n_questions: int
    shares: tuple[HopShare, ...]
    mass: tuple[float, ...] | None
    layers: tuple[int, int]
    grid: Grid | None

    def share_of(self, label: str) -> HopShare:
        return next(s for s in self.shares if s.label == label)


@dataclass(frozen=True)
class HopTracking:
    """Hop tracking of a run's ICE trials (``IceResult.hop_tracking``; docs/probes.md#hop-tracking).

    Attributes:
        cells: :class:`HopCell` per model × condition × load × measure × subset.
        rows: :class:`HopRow` per trial and hop.
        categories: the mass columns (:data:`CATEGORIES`); ``labels``: :data:`HOP_LABELS`.
        window: the depth window's rule, in words; ``method``: the whole method in one line.
        n_trials: trials tracked; ``n_skipped``: trials with an answer record that could not be tracked (the
            notes say why).
        reason: why nothing was tracked (None when something was).
        tests: the question-clustered tests of the hop masses (:mod:`probe.analysis.hop_tests`: failed − correct
            and Saturation − Control, per layer and per head with BH and max-T), per model and measure; empty in
            files written before them.
    """

    cells: tuple[HopCell, ...]
    rows: tuple[HopRow, ...]
    categories: tuple[str, ...]
    labels: tuple[str, ...]
    window: str
    method: str
    n_trials: int = field(metadata={"merge": "sum"})  # several runs' counts add up (probe.report.blocks)
    n_skipped: int = field(metadata={"merge": "sum"})
    reason: str | None
    tests: tuple[HopMassTest, ...] = field(default=(), metadata={OMIT: True})


WINDOW_RULE = "upper half of the layers, [L // 2, L), heads pooled"
SUBSETS = ("all", "correct_named", "wrong_answer")


def in_subset(row: "HopRow", subset: str) -> bool:
    """Whether a trial-hop belongs to a subset: ``all``; ``correct_named``, a hop whose own answer (not a wrong final
    answer) the output names; ``wrong_answer``, the last hop of a wrong trial, tracked on the wrong answer."""
    if subset == "all":
        return True
    if subset == "wrong_answer":
        return row.target == "wrong_answer"
    return row.target != "wrong_answer" and row.token_start is not None
METHOD = ("per trial and hop, the first mention of the hop's answer in the output (the last hop of a wrong trial: of "
          "the wrong answer); its tokens' attention pooled over heads and the upper half of the layers; "
          "read_right_fact = the germane segment stating the hop holds the most mass among content segments, "
          "read_distractor = an extraneous segment naming the entity does; shares per cell with the Wilson interval "
          "at the Korn-Graubard effective size, clustered by question")


def hop_cells(rows: Sequence[HopRow], masses: Sequence[np.ndarray | None], vmasses: Sequence[np.ndarray | None],
              windows: Mapping[str, tuple[int, int]], alpha: float = 0.05) -> list[HopCell]:
    """Label shares per model × condition × load × measure × subset, with intervals clustered by question.

    Args:
        rows: every trial-hop; ``masses`` / ``vmasses``: their ``(L, H, C)`` category masses (None: not named).
        windows: model -> its depth window.
        alpha: 1 − confidence level.

    Returns:
        The cells, each holding its ``(layer, head, category)`` mean.
    """
    cells: list[HopCell] = []
    cell_keys = sorted({(r.model, r.condition, r.load) for r in rows})
    for model, condition, load in cell_keys:
        for measure in ("raw", "value"):
            for subset in SUBSETS:
                idx = [i for i, r in enumerate(rows) if (r.model, r.condition, r.load) == (model, condition, load)
                       and in_subset(r, subset)]
                labels = [rows[i].label if measure == "raw" else rows[i].label_value for i in idx]
                if not idx or any(lab is None for lab in labels):
                    continue
                groups = np.array([rows[i].task_id for i in idx], dtype=object)
                shares = []
                for lab in HOP_LABELS:
                    y = np.array([1.0 if x == lab else 0.0 for x in labels])
                    ci = proportion_ci(y, groups, alpha)
                    shares.append(HopShare(lab, int(y.sum()), ci.mean, ci.ci_low, ci.ci_high, ci.n_effective,
                                           ci.reason))
                src = masses if measure == "raw" else vmasses
                named = [src[i] for i in idx if src[i] is not None]
                shapes = {m.shape for m in named if m is not None}
                mean_mass = held = None
                if named and len(shapes) == 1:
                    grid = np.mean(np.stack([m for m in named if m is not None]), axis=0)
                    held = Grid(grid)
                    lo, hi = windows[model]
                    mean_mass = tuple(float(x) for x in grid[lo:hi].mean(axis=(0, 1)))
                cells.append(HopCell(model=model, condition=condition, load=int(load), measure=measure, subset=subset,
                                     n=len(idx), n_trials=len({rows[i].trial_id for i in idx}),
                                     n_questions=len(set(groups.tolist())), shares=tuple(shares), mass=mean_mass,
                                     layers=windows[model], grid=held))
    return cells


def segment_texts(prompt: Prompt, answer: AnswerAttention) -> dict[int, str]:
    """Segment index of the answer record -> the prompt's text of that segment (sink segments left out), matched by
    label: what :func:`track_trial` reads to tell whether an extraneous segment names an entity."""
    by_label = {seg.label: prompt.segment_text(seg) for seg in prompt.segments}
    return {s: by_label.get(lab, "") for s, (kind, lab) in enumerate(zip(answer.segment_kinds, answer.segment_labels))
            if kind != "sink"}


class HopTracker:
    """Hop tracking of a run's scored ICE trials, fed one answer record at a time (docs/probes.md#hop-tracking).

    The ICE analysis reads each probe record once and hands its answer capture to :meth:`add` (one record in
    memory at a time: an answer record is tokens x layers x heads x segments); :meth:`result` gives the cells and
    tests. Everything a trial needs is in the run folder: its task (``tasks.jsonl``), its prompt's segment texts
    (``prompts.jsonl``) and the token spans the runner recorded with the answer.

    Args:
        tasks: task id -> task (the run folder's ``tasks.jsonl``; empty when the folder has none).
        prompts: prompt id -> prompt record.
    """

    def __init__(self, tasks: Mapping[str, Task], prompts: Mapping[str, Prompt]) -> None:
        self.tasks, self.prompts = tasks, prompts
        self.rows: list[HopRow] = []
        self.masses: list[np.ndarray | None] = []
        self.vmasses: list[np.ndarray | None] = []
        self.windows: dict[str, tuple[int, int]] = {}
        self.n_found = self.n_tracked = 0
        self.skipped: dict[str, int] = {}
        self.misfit: str | None = None  # the first record that did not fit its trial (the note quotes it)

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def add(self, t: TrialRecord, rec: AnswerAttention) -> None:
        """Track one trial from its answer record (trials that are not scored baseline ICE trials are ignored)."""
        if t.output is None or t.em is None or t.intervention is not None or t.family != "ice":
            return
        self.n_found += 1
        task = self.tasks.get(t.task_id)
        prompt = self.prompts.get(t.prompt_id)
        if task is None or prompt is None or not task.hops or rec.chars is None:
            self._skip("its task is not in the run's tasks.jsonl" if task is None else
                       "its prompt is not in prompts.jsonl" if prompt is None else
                       "its task has no hops" if not task.hops else
                       "its answer record holds no token spans (written before the runner recorded them; probe the "
                       "run again to track its hops)")
            return
        texts = segment_texts(prompt, rec)
        window = layer_window(rec.n_layers)
        try:
            out = track_trial(rec, t, task, texts, window=window)
        except HopLabelError:
            self._skip("its prompt's germane segments carry no hop labels (laid out by its task, not by the ICE "
                       "builder)")
            return
        except HopTrackingError as e:
            self.misfit = self.misfit or f"{t.trial_id}: {e}"
            self._skip("the answer record does not fit the trial")
            return
        self.windows[t.model] = window
        self.rows += out.rows
        self.masses += out.masses
        self.vmasses += out.vmasses
        self.n_tracked += 1

    def result(self, alpha: float, seed: int = 0, has_tasks: bool = True) -> tuple[HopTracking | None, list[str]]:
        """(result, notes): None when no trial had an answer record (nothing to track: the section says so); else
        the :class:`HopTracking` (with ``reason`` when records exist but nothing could be tracked).

        Args:
            alpha: 1 − confidence level of the cells' intervals.
            seed: seed of the hop-mass tests' Monte Carlo sign assignments (the experiment's seed).
            has_tasks: whether the run folder records its tasks (``tasks.jsonl``).
        """
        if self.n_found == 0:
            return None, []
        notes: list[str] = []

        def nothing(reason: str) -> tuple[HopTracking, list[str]]:
            return (HopTracking(cells=(), rows=(), categories=CATEGORIES, labels=HOP_LABELS, window=WINDOW_RULE,
                                method=METHOD, n_trials=0, n_skipped=self.n_found, reason=reason),
                    notes + [f"hop tracking: {reason}"])

        if not has_tasks:
            return nothing("the run folder has no tasks.jsonl (the run was recorded before runs recorded their tasks): "
                           "run `probe run` on its experiment again, which writes it without running any trial again")
        if self.misfit is not None:
            notes.append(f"hop tracking: first record that does not fit its trial: {self.misfit}")
        for why, n in sorted(self.skipped.items()):
            notes.append(f"hop tracking: {n} trial(s) skipped: {why}")
        if not self.rows:
            return nothing("no trial with an answer record could be tracked" + (
                f" ({'; '.join(sorted(self.skipped))})" if self.skipped else ""))
        rows, masses, vmasses = self.rows, self.masses, self.vmasses
        cells = hop_cells(rows, masses, vmasses, self.windows, alpha)
        tests: list[HopMassTest] = []
        for model in sorted({r.model for r in rows}):
            for measure, src in (("raw", masses), ("value", vmasses)):
                if any(v is not None for r, v in zip(rows, src) if r.model == model):
                    tests += hop_mass_tests(rows, src, model, measure, CATEGORIES, alpha, seed)
        return (HopTracking(cells=tuple(cells), rows=tuple(rows), categories=CATEGORIES, labels=HOP_LABELS,
                            window=WINDOW_RULE, method=METHOD, n_trials=self.n_tracked,
                            n_skipped=sum(self.skipped.values()), reason=None, tests=tuple(tests)),
                notes)


def analyze_hops(answers: Iterable[tuple[TrialRecord, AnswerAttention]], tasks: Mapping[str, Task],
                 prompts: Mapping[str, Prompt], alpha: float, seed: int = 0, has_tasks: bool = True
                 ) -> tuple[HopTracking | None, list[str]]:
    """Hop tracking of (trial, answer record) pairs (:class:`HopTracker`, fed in one go)."""
    tracker = HopTracker(tasks, prompts)
    for trial, rec in answers:
        tracker.add(trial, rec)
    return tracker.result(alpha, seed, has_tasks)


__all__ = ["CATEGORIES", "HOP_LABELS", "HopCell", "HopLabel", "HopLabelError", "HopRow", "HopShare", "HopTracking",
           "HopTracker", "HopTrackingError", "Mention", "TrialHops", "WINDOW_RULE", "analyze_hops", "category_masses",
           "first_mention", "hop_cells", "hop_segments", "label_of", "layer_window", "pooled_segment_mass",
           "segment_texts", "track_trial"]
