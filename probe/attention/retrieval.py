"""Retrieval counts, lookback ratio and answer-time P_ext of one trial's answer capture
(docs/probes.md#retrieval-heads)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from probe.attention.answer import AnswerAttention

SINK_KINDS = ("sink",)


@dataclass(frozen=True, eq=False)
class TrialRetrieval:
    """What one trial's answer capture says about its heads (definitions: :mod:`probe.analysis.retrieval`).

    Attributes:
        copied: (L, H) int, generated tokens the head copied from a germane segment.
        copyable: generated tokens whose id occurs in a germane segment.
        n_tokens: generated tokens.
        chance: (L, H) the score a head with a uniformly random top key would get (expected copied / copyable).
        lookback: (L, H) mean lookback ratio over rows t >= 1 (NaN with fewer than two generated tokens).
        answer_p_ext: (L, H) mean answer-time P_ext over the rows (NaN without a non-sink key).
    """

    copied: np.ndarray
    copyable: int
    n_tokens: int
    chance: np.ndarray
    lookback: np.ndarray
    answer_p_ext: np.ndarray

    @property
    def score(self) -> np.ndarray:
        """(L, H) copied / copyable, NaN without a copyable token."""
        if self.copyable == 0:
            return np.full(self.copied.shape, np.nan)
        return self.copied / self.copyable


def germane_positions(ans: AnswerAttention) -> np.ndarray:
    """Prompt positions inside germane segments."""
    spans = [range(a, b) for kind, (a, b) in zip(ans.segment_kinds, ans.segment_spans) if kind == "germane"]
    return np.array([p for r in spans for p in r], dtype=np.int64)


def copy_events(ans: AnswerAttention) -> tuple[np.ndarray, np.ndarray]:
    """(copyable (T,) bool, copied (T, L, H) bool) of one trial (docs/probes.md#retrieval-heads)."""
    germ = germane_positions(ans)
    germ_ids = np.unique(ans.prompt_ids[germ]) if germ.size else np.zeros(0, dtype=np.int64)
    copyable = np.isin(ans.tokens, germ_ids)
    is_germane = np.isin(ans.segment_of(ans.top_key), [i for i, k in enumerate(ans.segment_kinds) if k == "germane"])
    same = ans.token_at(ans.top_key) == ans.tokens[:, None, None]
    return copyable, is_germane & same & copyable[:, None, None]


def chance_score(ans: AnswerAttention) -> float:
    """The expected score of a head whose top key is uniformly random over the keys row t can see.

    Row t sees the prompt's ``N`` tokens and ``t`` answer tokens; a random key copies token t with probability
    (germane positions holding token t's id) / (N + t). The expected score is the sum of these over the copyable
    tokens, divided by their number (NaN without one).
    """
    copyable, _ = copy_events(ans)
    if not copyable.any():
        return float("nan")
    germ = germane_positions(ans)
    ids = ans.prompt_ids[germ]
    hits = np.array([(ids == tok).sum() for tok in ans.tokens], dtype=float)
    visible = ans.n_prompt + np.arange(len(ans.tokens))
    return float((hits / visible)[copyable].sum() / copyable.sum())


def trial_retrieval(ans: AnswerAttention) -> TrialRetrieval:
    """Retrieval counts, lookback ratio and answer-time P_ext of one trial's answer capture."""
    copyable, copied = copy_events(ans)
    n_t = len(ans.tokens)
    n_seg = len(ans.segment_kinds)
    mass = np.asarray(ans.mass, dtype=np.float64)  # (T, L, H, S + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        prompt_mass = mass[..., :n_seg].sum(axis=-1)
        new = mass[..., n_seg]
        t_idx = np.arange(n_t, dtype=float)[:, None, None]
        a_ctx = prompt_mass / max(ans.n_prompt, 1)
        a_new = new / t_idx
        lr = a_ctx / (a_ctx + a_new)
        lr[0] = np.nan  # row 0 sees no answer token
        content = [i for i, k in enumerate(ans.segment_kinds) if k not in SINK_KINDS]
        ext = [i for i, k in enumerate(ans.segment_kinds) if k == "extraneous"]
        non_sink = mass[..., content].sum(axis=-1) + new
        p_ext = mass[..., ext].sum(axis=-1) / non_sink
        p_ext[non_sink <= 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN heads stay NaN
        lookback = np.nanmean(lr, axis=0) if n_t > 1 else np.full(mass.shape[1:3], np.nan)
        answer_p_ext = np.nanmean(p_ext, axis=0) if n_t else np.full(mass.shape[1:3], np.nan)
    c = chance_score(ans)
    return TrialRetrieval(copied=copied.sum(axis=0).astype(np.int64), copyable=int(copyable.sum()), n_tokens=n_t,
                          chance=np.full(mass.shape[1:3], c), lookback=lookback, answer_p_ext=answer_p_ext)


def pooled_score(copied: np.ndarray, copyable: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(..., L, H) score of a set of trials: Σ copied / Σ copyable over the first axis (weights: e.g. a bootstrap)."""
    w = np.ones(len(copyable)) if weights is None else np.asarray(weights, dtype=float)
    num = np.tensordot(w, copied, axes=(-1, 0)) if w.ndim == 1 else np.einsum("bn,n...->b...", w, copied)
    den = w @ np.asarray(copyable, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / np.reshape(den, np.shape(den) + (1, 1))


def top_heads(score: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` heads with the largest finite score, best first (ties: the lower layer, then head, first)."""
    flat = np.nan_to_num(score, nan=-np.inf).ravel()
    order = np.argsort(-flat, kind="stable")
    n_heads = score.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order[:k] if np.isfinite(flat[i])]


__all__ = ["SINK_KINDS", "TrialRetrieval", "chance_score", "copy_events", "germane_positions", "pooled_score",
           "top_heads", "trial_retrieval"]
