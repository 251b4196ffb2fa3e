"""Attention on the needle vs hay statements of CogniLoad prompts, per layer and by rho, N and d: each group's
enrichment over its chance level and their log2 ratio. Specified in docs/cogniload.md#report-and-experiments."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import scipy.stats

from probe.analysis.frame import probe_records
from probe.attention.result import SegmentAttention
from probe.errors import ProbeError
from probe.records import TrialRecord
from probe.runfolder import RunFolder
from probe.tasks.cogniload import PuzzleParams
from probe.types import Prompt

log = logging.getLogger(__name__)

FAMILY = "cogniload"  # the task family whose trials this module analyses (probe.tasks)
GROUPS: tuple[str, ...] = ("needle", "hay")
SERIES: tuple[str, ...] = (*GROUPS, "log2_ratio")
KNOBS: tuple[str, ...] = ("rho", "N", "d")
_GROUP_KIND = {"needle": "germane", "hay": "extraneous"}


class CogniloadAttentionError(ProbeError):
    """An attention record does not match the CogniLoad layout its trial's meta describes."""


@dataclass(frozen=True)
class LayerSeries:
    """One series per layer: mean over prompts with its (1 − alpha) t-interval and the prompts counted.

    Attributes:
        mean, ci_low, ci_high: one value per layer (None where no prompt has a value, or fewer than two for the
            interval).
        n: prompts with a value, per layer.
    """

    mean: tuple[float | None, ...]
    ci_low: tuple[float | None, ...]
    ci_high: tuple[float | None, ...]
    n: tuple[int, ...]


@dataclass(frozen=True)
class ByLevel:
    """Each series' mean over the prompts at each tested level of one knob.

    Attributes:
        levels: the tested levels; n: prompts per level.
        needle, hay, log2_ratio: (layer, level) nested tuples of means (None where undefined).
        layer_mean: series name (``needle``, ``hay``, ``log2_ratio``) -> per level, the mean over layers.
    """

    levels: tuple[int, ...]
    n: tuple[int, ...]
    needle: tuple[tuple[float | None, ...], ...]
    hay: tuple[tuple[float | None, ...], ...]
    log2_ratio: tuple[tuple[float | None, ...], ...]
    layer_mean: dict[str, tuple[float | None, ...]]

    def series(self, name: str) -> tuple[tuple[float | None, ...], ...]:
        """The (layer, level) means of series ``name`` (one of :data:`SERIES`)."""
        if name not in SERIES:
            raise KeyError(f"{name!r} is not one of {SERIES}")
        return getattr(self, name)


@dataclass(frozen=True)
class NeedleHayModel:
    """One model's needle and hay enrichment (docs/cogniload.md#report-and-experiments).

    Attributes:
        n_prompts: prompts with a record; n_layers: their layers; query: the probe query sets seen.
        layer: series name (``needle``, ``hay``, ``log2_ratio``) -> :class:`LayerSeries` over all prompts.
        by_rho, by_N, by_d: :class:`ByLevel` for each knob.
        notes: records left out and other caveats.
    """

    n_prompts: int
    n_layers: int
    query: tuple[str, ...]
    layer: dict[str, LayerSeries]
    by_rho: ByLevel
    by_N: ByLevel
    by_d: ByLevel
    notes: tuple[str, ...]

    def by(self, knob: str) -> ByLevel:
        """The :class:`ByLevel` of ``knob`` (``rho``, ``N`` or ``d``)."""
        if knob not in KNOBS:
            raise KeyError(f"{knob!r} is not one of {KNOBS}")
        return getattr(self, f"by_{knob}")


@dataclass(frozen=True)
class NeedleHaySummary:
    """Needle vs hay enrichment of a run's CogniLoad prompts (:func:`summarise_enrichment`).

    Attributes:
        definition: the measure in one paragraph; alpha: 1 − confidence level of the intervals.
        models: model -> :class:`NeedleHayModel`.
    """

    definition: str
    alpha: float
    models: dict[str, NeedleHayModel]


@dataclass(frozen=True)
class PromptEnrichment:
    """Head-mean enrichment of one CogniLoad prompt (one model).

    Attributes:
        model: model name.
        prompt_id: the prompt.
        d, n_statements, rho: the puzzle's knobs (difficulty, N, needle ratio in percent).
        needle: (layer,) head-mean enrichment of the needle statements (NaN where there is none).
        hay: (layer,) head-mean enrichment of the hay statements (NaN where there is none).
        query: the probe's query set option (``question``, ``last``, ...).
    """

    model: str
    prompt_id: str
    d: int
    n_statements: int
    rho: int
    needle: np.ndarray
    hay: np.ndarray
    query: str

    @property
    def log2_ratio(self) -> np.ndarray:
        """(layer,) log2(needle / hay) enrichment; NaN where either is missing or not positive."""
        ok = np.isfinite(self.needle) & np.isfinite(self.hay) & (self.needle > 0) & (self.hay > 0)
        out = np.full(self.needle.shape, np.nan)
        out[ok] = np.log2(self.needle[ok] / self.hay[ok])
        return out


def statement_groups(sa: SegmentAttention, n_people: int, n_statements: int, where: str = "") -> dict[str, list[int]]:
    """Segment indices of the needle and hay statements of a CogniLoad prompt.

    Args:
        sa: the prompt's attention record.
        n_people: initial-state sentences before the statements (trial meta ``n_people``).
        n_statements: N (trial meta ``N``).
        where: the record's name, for error messages.

    Returns:
        ``{"needle": [...], "hay": [...]}``: indices into ``sa.segment_kinds`` (germane resp. extraneous statements).

    Raises:
        CogniloadAttentionError: the record does not hold ``n_people + N`` germane/extraneous segments.
    """
    content = [i for i, k in enumerate(sa.segment_kinds) if k in ("germane", "extraneous")]
    if len(content) != n_people + n_statements:
        raise CogniloadAttentionError(
            f"{where or 'attention record'}: {len(content)} germane/extraneous segments, expected n_people + N = "
            f"{n_people} + {n_statements}; the record is not of this CogniLoad prompt (re-run the probe)"
        )
    statements = content[n_people:]
    return {g: [i for i in statements if sa.segment_kinds[i] == _GROUP_KIND[g]] for g in GROUPS}


def group_enrichment(sa: SegmentAttention, segments: list[int]) -> np.ndarray:
    """Enrichment E_G[layer, head] of the segments ``segments`` (docs/cogniload.md#report-and-experiments).

    Args:
        sa: an attention record.
        segments: indices of the group's segments (any kinds; the chance scale uses the extraneous token count).

    Returns:
        (layer, head) float64; NaN where the group is empty, the prompt has no extraneous token, or chance is
        0 or undefined.
    """
    n_layers, n_heads = sa.seg_mass_segment.shape[:2]
    width = np.array([b - a for a, b in sa.segment_spans], dtype=np.float64)  # (segment,) tokens
    kinds = np.array(sa.segment_kinds)
    n_g = float(width[segments].sum()) if segments else 0.0
    n_ext = float(width[kinds == "extraneous"].sum())
    if n_g == 0 or n_ext == 0:
        return np.full((n_layers, n_heads), np.nan)
    mass = sa.seg_mass_segment.astype(np.float64)  # (L, H, S)
    exclude_sink = bool(sa.options.get("exclude_sink", True))
    den = mass[..., kinds != "sink"].sum(axis=-1) if exclude_sink else mass.sum(axis=-1)  # (L, H)
    chance_g = sa.chance.astype(np.float64) * n_g / n_ext  # (L,)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(den > 0, mass[..., segments].sum(axis=-1) / np.where(den > 0, den, 1.0), np.nan)
        ok = np.isfinite(chance_g) & (chance_g > 0)
        return np.where(ok[:, None], share / np.where(ok, chance_g, 1.0)[:, None], np.nan)


def prompt_enrichment(sa: SegmentAttention, trial: TrialRecord, where: str = "") -> PromptEnrichment:
    """Head-mean needle and hay enrichment per layer of one CogniLoad prompt.

    Args:
        sa: the prompt's attention record.
        trial: a CogniLoad trial of this prompt (its ``meta`` holds ``d``, ``N``, ``rho``, ``n_people``).
        where: the record's name, for error messages.

    Returns:
        The prompt's :class:`PromptEnrichment`.

    Raises:
        CogniloadAttentionError: the meta lacks a knob, or the record's segments do not match it.
    """
    params = PuzzleParams.from_meta(trial.meta, f"trial {trial.trial_id}", needs=("n_people",),
                                    error=CogniloadAttentionError)
    d, n, rho, n_people = params.d, params.n_statements, int(params.rho), params.n_people
    assert n_people is not None  # from_meta checked it is there
    groups = statement_groups(sa, n_people, n, where or trial.trial_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty group is NaN in every head
        means = {g: np.nanmean(group_enrichment(sa, idx), axis=1) for g, idx in groups.items()}  # (L,)
    return PromptEnrichment(model=trial.model, prompt_id=trial.prompt_id, d=d, n_statements=n, rho=rho,
                            needle=means["needle"], hay=means["hay"], query=str(sa.options.get("query", "")))


def _mean_ci(stack: np.ndarray, alpha: float) -> LayerSeries:
    """Per-column mean and t-interval over rows, NaN-aware. ``stack`` is (prompt, layer)."""
    n = np.isfinite(stack).sum(axis=0)  # (L,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(stack, axis=0)
        sd = np.nanstd(stack, axis=0, ddof=1)
    half = np.full(mean.shape, np.nan)
    many = n >= 2
    half[many] = scipy.stats.t.ppf(1 - alpha / 2, n[many] - 1) * sd[many] / np.sqrt(n[many])
    return LayerSeries(mean=_floats(mean), ci_low=_floats(mean - half), ci_high=_floats(mean + half),
                       n=tuple(int(v) for v in n))


def _floats(a: np.ndarray) -> tuple[float | None, ...]:
    return tuple(float(v) if math.isfinite(float(v)) else None for v in np.asarray(a, dtype=np.float64).ravel())


def _by_level(rows: list[PromptEnrichment], knob: str) -> ByLevel:
    """Mean of each series per level of ``knob``: (layer, level) nested tuples and prompts per level."""
    value = {"rho": lambda r: r.rho, "N": lambda r: r.n_statements, "d": lambda r: r.d}[knob]
    levels = sorted({value(r) for r in rows})
    series: dict[str, tuple[tuple[float | None, ...], ...]] = {}
    layer_mean: dict[str, tuple[float | None, ...]] = {}
    for g in SERIES:
        cols = []
        for v in levels:
            stack = np.stack([getattr(r, g) for r in rows if value(r) == v])  # (prompt, L)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                cols.append(np.nanmean(stack, axis=0))
        mat = np.stack(cols, axis=1)  # (L, level)
        series[g] = tuple(_floats(row) for row in mat)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            layer_mean[g] = _floats(np.nanmean(mat, axis=0))  # (level,)
    return ByLevel(levels=tuple(int(v) for v in levels), n=tuple(sum(value(r) == v for r in rows) for v in levels),
                   needle=series["needle"], hay=series["hay"], log2_ratio=series["log2_ratio"],
                   layer_mean=layer_mean)


def summarise_enrichment(rows: list[PromptEnrichment], alpha: float = 0.05) -> NeedleHaySummary:
    """Per model: layer-wise needle/hay enrichment with CIs, and its means by rho, N and d (docs/cogniload.md#report-and-experiments).

    Args:
        rows: one :class:`PromptEnrichment` per (model, prompt).
        alpha: 1 − confidence level of the per-layer intervals.

    Returns:
        The :class:`NeedleHaySummary` (missing values are None).
    """
    by_model: dict[str, list[PromptEnrichment]] = {}
    for r in rows:
        by_model.setdefault(r.model, []).append(r)
    models: dict[str, NeedleHayModel] = {}
    for model in sorted(by_model):
        rs = by_model[model]
        notes: list[str] = []
        n_layers = max({len(r.needle) for r in rs}, key=lambda k: sum(len(r.needle) == k for r in rs))
        if any(len(r.needle) != n_layers for r in rs):
            bad = [r.prompt_id for r in rs if len(r.needle) != n_layers]
            notes.append(f"{len(bad)} records with a layer count other than {n_layers} left out (e.g. {bad[0]})")
            rs = [r for r in rs if len(r.needle) == n_layers]
        queries = sorted({r.query for r in rs})
        if queries != ["question"]:
            notes.append(f"query set {', '.join(queries)}: enrichment is measured from that query set, not the "
                         "question")
        models[model] = NeedleHayModel(
            n_prompts=len(rs), n_layers=n_layers, query=tuple(queries),
            layer={g: _mean_ci(np.stack([getattr(r, g) for r in rs]), alpha) for g in SERIES},
            by_rho=_by_level(rs, "rho"), by_N=_by_level(rs, "N"), by_d=_by_level(rs, "d"), notes=tuple(notes))
    return NeedleHaySummary(definition=DEFINITION, alpha=alpha, models=models)


DEFINITION = (
    "E_G = (attention share on the statements of group G / their token count) / (chance share of the extraneous "
    "kind / extraneous token count), per layer and head from the probe's query set, sink excluded as in P_ext; "
    "needle = germane statements, hay = extraneous statements (initial-state sentences in neither); head mean per "
    "prompt, then mean over prompts (95% t-interval over prompts per layer); 1 = uniform over tokens; "
    "log2_ratio = mean over prompts of log2(E_needle / E_hay)"
)


def cogniload_attention(run: RunFolder, trials: list[TrialRecord] | tuple[TrialRecord, ...], alpha: float = 0.05,
                        prompts: Mapping[str, Prompt] | None = None) -> tuple[NeedleHaySummary | None, int]:
    """Needle vs hay enrichment of every CogniLoad prompt of a run that has an attention record.

    Records are read one at a time (only the per-layer means are kept), so memory does not grow with the run.

    Args:
        run: the run folder (records found by :meth:`probe.runfolder.RunFolder.attention_record`).
        trials: the run's trial records; CogniLoad ones (``family == "cogniload"``) select the prompts and give
            their knobs. Skipped or failed trials count too: the probe does not depend on the answer.
        alpha: 1 − confidence level.
        prompts: the run's prompt records by id, for the records' check (None: read from the folder).

    Returns:
        (:func:`summarise_enrichment` of the prompts with a record, or None when none has one; the number of
        records read).

    Raises:
        CogniloadAttentionError: a record does not match its trial's CogniLoad layout.
    """
    trial_of: dict[tuple[str, str], TrialRecord] = {}
    for t in trials:
        if t.family == FAMILY:
            trial_of.setdefault((t.model, t.prompt_id), t)
    rows = [prompt_enrichment(sa, trial_of[key], str(run.attention_record(*key)))
            for key, sa in probe_records(run, trial_of, prompts)]
    if not rows:
        return None, 0
    log.info("%s: needle/hay enrichment of %d CogniLoad prompts", run.root, len(rows))
    return summarise_enrichment(rows, alpha), len(rows)
