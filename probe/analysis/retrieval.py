"""Retrieval heads, the lookback ratio and answer-time P_ext, read from the attention while the answer is written.
Specified in docs/probes.md#retrieval-heads and docs/statistics.md#retrieval-heads-per-head-tests."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import scipy.stats

from probe.analysis.attention_tests import attention_failure_tests
from probe.analysis.estimates import finite, key_int
from probe.codec import Grid
from probe.analysis.head_tests import HeadTests, fitted_head_tests, max_t_head_tests, with_max_t
from probe.attention.retrieval import TrialRetrieval, pooled_score, top_heads

log = logging.getLogger(__name__)

TOP_K = 10
N_BOOTSTRAP = 999
CONTROL = "Control"
SATURATION = "Saturation"


# ------------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class RetrievalHead:
    """One head of a ranking: its score, copied tokens and its rank (0 = best)."""

    layer: int
    head: int
    rank: int
    score: float
    copied: int


@dataclass(frozen=True)
class RetrievalCell:
    """The pooled retrieval scores of one model × condition × load (``load`` None: pooled over loads).

    Attributes:
        n_trials, n_questions: trials with an answer capture and their questions; n_tokens, n_copyable: generated
            and copyable tokens summed over them.
        chance: mean chance score (:func:`chance_score`) over the trials with a copyable token.
        score, lookback, p_ext: the (layer, head) pooled score, mean lookback ratio and mean answer-time P_ext.
        top: the top-k heads, best first.
        n_above_chance: heads whose pooled score exceeds the chance score.
    """

    condition: str
    load: int | None
    n_trials: int
    n_questions: int
    n_tokens: int
    n_copyable: int
    chance: float | None
    score: Grid
    lookback: Grid
    p_ext: Grid
    top: tuple[RetrievalHead, ...]
    n_above_chance: int


@dataclass(frozen=True)
class RankAgreement:
    """How well a cell's head scores agree with Control's: Spearman ρ over the heads and top-k overlap.

    Attributes:
        condition, load: the cell compared with Control.
        spearman, spearman_ci_low, spearman_ci_high: ρ with its question-bootstrap BCa interval.
        overlap, overlap_ci_low, overlap_ci_high: |top-k ∩ top-k of Control| / k, with its interval.
        n_questions: questions in both; reason: why there is no value or interval, else None.
    """

    condition: str
    load: int | None
    spearman: float | None
    spearman_ci_low: float | None
    spearman_ci_high: float | None
    overlap: float | None
    overlap_ci_low: float | None
    overlap_ci_high: float | None
    n_questions: int
    reason: str | None


@dataclass(frozen=True)
class DistractionLink:
    """Across heads: Control retrieval score against Saturation answer-time P_ext (``load`` None: pooled).

    Attributes:
        spearman, spearman_ci_low, spearman_ci_high: Spearman ρ over the heads, question-bootstrap BCa interval.
        pearson: Pearson r over the heads (descriptive).
        top_k_p_ext, other_p_ext: mean Saturation P_ext of Control's top-k retrieval heads and of the other heads.
        n_questions: questions with both; reason: why there is no value, else None.
    """

    load: int | None
    spearman: float | None
    spearman_ci_low: float | None
    spearman_ci_high: float | None
    pearson: float | None
    top_k_p_ext: float | None
    other_p_ext: float | None
    n_questions: int
    reason: str | None


@dataclass(frozen=True)
class RetrievalHeads:
    """Retrieval heads of one model (:func:`analyze_retrieval`; docs/probes.md#retrieval-heads).

    Attributes:
        model: the model; top_k: k of the rankings and overlaps; n_trials: trials with an answer capture.
        control: Control pooled (None without Control captures); cells: per condition × load.
        stability: each non-Control cell against Control.
        distraction: Control retrieval vs Saturation P_ext across heads, pooled over loads then per load.
        failed_vs_correct: per head, failed − correct at equal condition and load, BH and max-T over the map, one test per
            measure: the trial's retrieval score, its lookback ratio (trials of every condition) and its answer-time
            P_ext (Saturation and Residue trials).
        saturation_drop: per head, Saturation − Control retrieval score paired by question, BH and max-T.
        reason: why nothing could be estimated, else None; method: in words.
    """

    model: str
    top_k: int
    n_trials: int
    control: RetrievalCell | None
    cells: tuple[RetrievalCell, ...]
    stability: tuple[RankAgreement, ...]
    distraction: tuple[DistractionLink, ...]
    failed_vs_correct: tuple[HeadTests, ...]
    saturation_drop: HeadTests | None
    reason: str | None
    method: str


METHOD = ("Wu et al. 2024 retrieval score per head: copied / copyable generated tokens (copied: the head's top "
          "key is in a germane segment and holds the generated token's id; copyable: the token's id occurs in a "
          "germane segment), pooled as sums over trials; lookback ratio of Chuang et al. 2024 (mean weight per "
          "prompt token over that plus mean weight per answer token); stability: Spearman rho over heads and "
          "top-k overlap against Control, 95% question-bootstrap intervals (seeded; BCa for rho, scipy bootstrap; "
          "percentile for the overlap; rho of two noisy maps is attenuated, and its interval is for rho at this "
          "many questions, not for the maps' agreement: docs/statistics.md); per-head tests: "
          "failed - correct trial score (OLS on failed, load and condition, CR2 clustered by question, BH over "
          "the layer x head map), Saturation - Control per-question score (one-sample t, BH, and max-T sign-flip "
          "correction over the map)")


# ------------------------------------------------------------------------------------------------ reading


def collect(answers: Mapping[tuple[str, str], TrialRetrieval], df: pd.DataFrame
            ) -> tuple[pd.DataFrame, list[TrialRetrieval]]:
    """The scored trials whose prompt's record holds an answer capture, and their :class:`TrialRetrieval`.

    Args:
        answers: (model, prompt id) -> :func:`trial_retrieval` of its record's answer capture (read once per
            analysis: :mod:`probe.analysis.ice`).
        df: the trial table.
    """
    d = df[df["is_scored"]].drop_duplicates(["model", "prompt_id"])
    keys = [(str(m), str(p)) for m, p in zip(d["model"], d["prompt_id"])]
    keep = [k in answers for k in keys]
    return d[keep], [answers[k] for k, ok in zip(keys, keep) if ok]


# ------------------------------------------------------------------------------------------------ one model


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman ρ of each row pair of (B, m) arrays (average ranks for ties; NaN-free rows expected)."""
    ra = scipy.stats.rankdata(a, axis=-1)
    rb = scipy.stats.rankdata(b, axis=-1)
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(-1) / np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))


def _overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    return len(set(top_heads(a, k)) & set(top_heads(b, k))) / k


def _question_sums(sub: pd.DataFrame, trials: list[TrialRetrieval], questions: list[str]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(G, L, H) copied and (G,) copyable summed per question (questions absent: zeros)."""
    shape = trials[0].copied.shape if trials else (0, 0)
    copied = np.zeros((len(questions),) + shape)
    copyable = np.zeros(len(questions))
    index = {q: i for i, q in enumerate(questions)}
    for q, t in zip(sub["task_id"].astype(str), trials):
        copied[index[q]] += t.copied
        copyable[index[q]] += t.copyable
    return copied, copyable


def _percentile(x: np.ndarray, alpha: float) -> tuple[float | None, float | None]:
    x = x[np.isfinite(x)]
    if x.size < 10:
        return None, None
    lo, hi = np.quantile(x, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def rho_interval(rho_of: Callable[[np.ndarray], np.ndarray], n_questions: int, alpha: float, n_boot: int,
                 rng: np.random.Generator) -> tuple[float | None, float | None]:
    """BCa bootstrap interval (scipy ``bootstrap``) of a rank correlation computed from question weights.

    ``rho_of((B, G) weights) -> (B,)`` gives the statistic of each resample of the questions (weight = how often a
    question is drawn). A rank correlation between two noisy maps is biased toward 0 and more so in a resample, so
    a percentile interval sits below the estimate (its upper end at the estimate); BCa corrects for that bias and
    for the statistic's skew (docs/statistics.md: coverage against a known correlation). None, None when the
    interval cannot be formed (fewer than 10 finite resamples, or a resample without a value).
    """
    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = np.reshape(idx, (-1, idx.shape[-1]))
        w = np.stack([np.bincount(row, minlength=n_questions) for row in rows]).astype(float)
        return rho_of(w).reshape(idx.shape[:-1])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resample: scipy warns, the interval is NaN (checked below)
        res = scipy.stats.bootstrap((np.arange(n_questions),), statistic, n_resamples=n_boot, vectorized=True,
                                    confidence_level=1 - alpha, method="BCa", rng=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(lo) and np.isfinite(hi)) or np.isfinite(res.bootstrap_distribution).sum() < 10:
        return None, None
    return lo, hi


def _cell(cond: str, load: int | None, sub: pd.DataFrame, trials: list[TrialRetrieval], k: int) -> RetrievalCell:
    copied = np.stack([t.copied for t in trials])
    copyable = np.array([t.copyable for t in trials])
    score = pooled_score(copied, copyable)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lookback = np.nanmean(np.stack([t.lookback for t in trials]), axis=0)
        p_ext = np.nanmean(np.stack([t.answer_p_ext for t in trials]), axis=0)
    chances = [float(t.chance.flat[0]) for t in trials if t.copyable]
    chance = float(np.average(chances, weights=[t.copyable for t in trials if t.copyable])) if chances else None
    top = tuple(RetrievalHead(layer=li, head=h, rank=r, score=float(score[li, h]), copied=int(copied[:, li, h].sum()))
                for r, (li, h) in enumerate(top_heads(score, k)))
    above = int(np.sum(np.nan_to_num(score, nan=-1.0) > chance)) if chance is not None else 0
    return RetrievalCell(condition=cond, load=load, n_trials=len(trials), n_questions=int(sub["task_id"].nunique()),
                         n_tokens=int(sum(t.n_tokens for t in trials)), n_copyable=int(copyable.sum()),
                         chance=chance, score=Grid(score), lookback=Grid(lookback), p_ext=Grid(p_ext), top=top,
                         n_above_chance=above)


def _agreement(cond: str, load: int | None, ctrl: tuple[pd.DataFrame, list[TrialRetrieval]],
               other: tuple[pd.DataFrame, list[TrialRetrieval]], k: int, alpha: float, n_boot: int,
               rng: np.random.Generator) -> RankAgreement:
    questions = sorted(set(ctrl[0]["task_id"].astype(str)) & set(other[0]["task_id"].astype(str)))
    out = RankAgreement(cond, load, None, None, None, None, None, None, len(questions), None)
    if len(questions) < 2:
        return replace(out, reason=f"{len(questions)} question(s) in both this cell and Control; need 2")
    keep_c = ctrl[0]["task_id"].astype(str).isin(questions).to_numpy()
    keep_o = other[0]["task_id"].astype(str).isin(questions).to_numpy()
    cc, cn = _question_sums(ctrl[0][keep_c], [t for t, m in zip(ctrl[1], keep_c) if m], questions)
    oc, on = _question_sums(other[0][keep_o], [t for t, m in zip(other[1], keep_o) if m], questions)
    if cn.sum() == 0 or on.sum() == 0:
        return replace(out, reason="no copyable token in this cell or in Control")
    a, b = pooled_score(cc, cn), pooled_score(oc, on)
    rho = float(_spearman_rows(a.ravel()[None], b.ravel()[None])[0])
    w = rng.multinomial(len(questions), np.full(len(questions), 1 / len(questions)), size=n_boot).astype(float)
    ab, bb = pooled_score(cc, cn, w), pooled_score(oc, on, w)  # (B, L, H)
    ok = np.isfinite(ab).all(axis=(1, 2)) & np.isfinite(bb).all(axis=(1, 2))
    overlaps = np.array([_overlap(x, y, k) for x, y in zip(ab[ok], bb[ok])])
    o_lo, o_hi = _percentile(overlaps, alpha)

    def rho_of(wb: np.ndarray) -> np.ndarray:
        x, y = pooled_score(cc, cn, wb), pooled_score(oc, on, wb)
        r = _spearman_rows(x.reshape(len(wb), -1), y.reshape(len(wb), -1))
        return np.where(np.isfinite(x).all(axis=(1, 2)) & np.isfinite(y).all(axis=(1, 2)), r, np.nan)

    s_lo, s_hi = rho_interval(rho_of, len(questions), alpha, n_boot, rng) if ok.sum() >= 10 else (None, None)
    return replace(out, spearman=finite(rho), spearman_ci_low=s_lo, spearman_ci_high=s_hi, overlap=_overlap(a, b, k),
                   overlap_ci_low=o_lo, overlap_ci_high=o_hi,
                   reason=None if s_lo is not None else "too few questions for a bootstrap interval")


def _distraction(load: int | None, ctrl: tuple[pd.DataFrame, list[TrialRetrieval]],
                 sat: tuple[pd.DataFrame, list[TrialRetrieval]], k: int, alpha: float, n_boot: int,
                 rng: np.random.Generator) -> DistractionLink:
    questions = sorted(set(ctrl[0]["task_id"].astype(str)) & set(sat[0]["task_id"].astype(str)))
    out = DistractionLink(load, None, None, None, None, None, None, len(questions), None)
    if len(questions) < 2:
        return replace(out, reason=f"{len(questions)} question(s) with Control and Saturation captures; need 2")
    keep_c = ctrl[0]["task_id"].astype(str).isin(questions).to_numpy()
    cc, cn = _question_sums(ctrl[0][keep_c], [t for t, m in zip(ctrl[1], keep_c) if m], questions)
    index = {q: i for i, q in enumerate(questions)}
    shape = cc.shape[1:]
    ps, pn = np.zeros((len(questions),) + shape), np.zeros((len(questions),) + shape)
    for q, t in zip(sat[0]["task_id"].astype(str), sat[1]):
        if q in index:
            ok = np.isfinite(t.answer_p_ext)
            ps[index[q]] += np.where(ok, t.answer_p_ext, 0.0)
            pn[index[q]] += ok
    if cn.sum() == 0:
        return replace(out, reason="no copyable token in the Control answers")

    def maps(w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        w1 = np.ones(len(questions)) if w is None else w
        with np.errstate(invalid="ignore", divide="ignore"):
            return pooled_score(cc, cn, w1), np.tensordot(w1, ps, 1) / np.tensordot(w1, pn, 1)

    r, p = maps(None)
    ok = np.isfinite(r) & np.isfinite(p)
    if ok.sum() < 3:
        return replace(out, reason="fewer than 3 heads with both a Control score and a Saturation P_ext")
    rho = float(_spearman_rows(r[ok][None], p[ok][None])[0])
    pear = float(np.corrcoef(r[ok], p[ok])[0, 1]) if np.ptp(r[ok]) > 0 and np.ptp(p[ok]) > 0 else None
    top = top_heads(r, k)
    mask = np.zeros(r.shape, dtype=bool)
    for li, h in top:
        mask[li, h] = True
    def rho_of(w: np.ndarray) -> np.ndarray:
        out = np.full(len(w), np.nan)
        for i, wb in enumerate(w):
            rb, pb = maps(wb)
            okb = np.isfinite(rb) & np.isfinite(pb)
            out[i] = _spearman_rows(rb[okb][None], pb[okb][None])[0] if okb.sum() >= 3 else np.nan
        return out

    lo, hi = rho_interval(rho_of, len(questions), alpha, n_boot, rng)
    return replace(out, spearman=finite(rho), spearman_ci_low=lo, spearman_ci_high=hi, pearson=finite(pear),
                   top_k_p_ext=finite(np.nanmean(p[mask])) if mask.any() else None,
                   other_p_ext=finite(np.nanmean(p[~mask & np.isfinite(p)])) if (~mask).any() else None,
                   reason=None if lo is not None else "too few questions for a bootstrap interval")


FAILED_TESTS = (  # (attribute of TrialRetrieval, measure, conditions: None = every condition)
    ("score", "trial retrieval score per head", None),
    ("lookback", "lookback ratio per head", None),
    ("answer_p_ext", "answer-time P_ext per head", ("Saturation", "Residue")),
)


def _failed_vs_correct(sub: pd.DataFrame, trials: list[TrialRetrieval], what: str, measure: str,
                       conditions: tuple[str, ...] | None, alpha: float, seed: int = 0) -> HeadTests:
    """Failed − correct per head at equal condition and load, CR2 clustered by question, BH over the map, and the
    max-T correction over the map (:func:`probe.analysis.head_tests.with_max_t`)."""
    values = [np.asarray(getattr(t, what), dtype=float) for t in trials]
    keep = np.array([bool(np.isfinite(v).any()) for v in values], dtype=bool)
    if conditions is not None:
        keep &= sub["condition"].isin(conditions).to_numpy()
    d = sub[keep]
    y = np.stack([v for v, m in zip(values, keep) if m]) if keep.any() else np.zeros((0, 1, 1))
    where = "Saturation and Residue trials" if conditions else "trials of every condition"
    estimand = f"failed - correct difference at equal condition and load ({where})"
    if len(d) < 3:
        return HeadTests.untested(measure, estimand, int(len(d)), int(d["task_id"].nunique()),
                                  f"{len(d)} trial(s) with a value ({where}); need 3")
    conds = sorted(set(d["condition"]))
    load = d["load"].to_numpy(dtype=float)
    cols: list[np.ndarray] = []
    for c in conds[1:]:  # a condition indicator that load already determines (one load per condition) is left out
        col = (d["condition"] == c).to_numpy(dtype=float)
        if np.linalg.matrix_rank(np.column_stack([np.ones(len(d)), load, *cols, col])) == 3 + len(cols):
            cols.append(col)
    dummies = np.column_stack(cols) if cols else None
    failed = d["em"].to_numpy() < 0.5
    groups = d["task_id"].to_numpy()
    fits = attention_failure_tests(y, failed, load, groups, dummies, alpha)
    heads = fitted_head_tests(fits, alpha, measure=measure, estimand=estimand, n=int(len(d)))
    return with_max_t(heads, fits, y, failed.astype(float), groups, np.column_stack([np.ones(len(d)), load, *cols]),
                      alpha, seed, "failed - correct contrasts of residuals on load and condition")


def _saturation_drop(ctrl: tuple[pd.DataFrame, list[TrialRetrieval]], sat: tuple[pd.DataFrame, list[TrialRetrieval]],
                     alpha: float, seed: int) -> HeadTests:
    questions = sorted(set(ctrl[0]["task_id"].astype(str)) & set(sat[0]["task_id"].astype(str)))
    measure = "retrieval score per head, Saturation vs Control"
    estimand = "per-question pooled score under Saturation (all loads) minus under Control"
    if len(questions) < 2:
        return HeadTests.untested(measure, estimand, len(questions), len(questions),
                                  f"{len(questions)} question(s) with Control and Saturation captures")
    cc, cn = _question_sums(*_restrict(ctrl, questions), questions)
    sc, sn = _question_sums(*_restrict(sat, questions), questions)
    ok = (cn > 0) & (sn > 0)
    if not ok.any():
        return HeadTests.untested(measure, estimand, 0, 0, "no question has a copyable token in both its Control and "
                                                           "its Saturation answers")
    D = (sc[ok] / sn[ok, None, None]) - (cc[ok] / cn[ok, None, None])
    return max_t_head_tests(D, alpha, seed, measure=measure, estimand=estimand)


def _restrict(part: tuple[pd.DataFrame, list[TrialRetrieval]], questions: list[str]
              ) -> tuple[pd.DataFrame, list[TrialRetrieval]]:
    keep = part[0]["task_id"].astype(str).isin(questions).to_numpy()
    return part[0][keep], [t for t, m in zip(part[1], keep) if m]


def retrieval_heads(sub: pd.DataFrame, trials: list[TrialRetrieval], model: str, k: int = TOP_K,
                    alpha: float = 0.05, seed: int = 0, n_boot: int = N_BOOTSTRAP) -> RetrievalHeads:
    """Retrieval heads of one model from its trials' :class:`TrialRetrieval` (docs/probes.md#retrieval-heads).

    Args:
        sub: the model's trials (columns task_id, condition, load, em), one row per entry of ``trials``.
        trials: their answer-capture summaries.
        model: the model.
        k: top-k of the rankings.
        alpha: test level; intervals are 1 − alpha.
        seed: seed of the bootstrap and of the Monte Carlo sign flips.
        n_boot: bootstrap resamples.

    Returns:
        The :class:`RetrievalHeads` (its arrays held in its cells and head maps).
    """
    out = RetrievalHeads(model=model, top_k=k, n_trials=len(trials), control=None, cells=(), stability=(),
                         distraction=(), failed_vs_correct=(), saturation_drop=None, reason=None, method=METHOD)
    if not trials:
        return replace(out, reason="no probe record of this model holds an answer capture")
    shapes = {t.copied.shape for t in trials}
    if len(shapes) != 1:
        return replace(out, reason=f"answer captures of different shapes {sorted(shapes)}")
    rng = np.random.default_rng(seed)
    sub = sub.reset_index(drop=True)

    def part(mask: np.ndarray) -> tuple[pd.DataFrame, list[TrialRetrieval]]:
        return sub[mask], [t for t, m in zip(trials, mask) if m]

    is_ctrl = (sub["condition"] == CONTROL).to_numpy()
    ctrl = part(is_ctrl)
    control = _cell(CONTROL, None, *ctrl, k) if is_ctrl.any() else None
    cells: list[RetrievalCell] = []
    stability: list[RankAgreement] = []
    for (cond, load), g in sub.groupby(["condition", "load"], sort=True):
        mask = sub.index.isin(g.index)
        cells.append(_cell(str(cond), key_int(load), *part(mask), k))
        if cond != CONTROL and control is not None:
            stability.append(_agreement(str(cond), key_int(load), ctrl, part(mask), k, alpha, n_boot, rng))
    distraction: list[DistractionLink] = []
    is_sat = (sub["condition"] == SATURATION).to_numpy()
    saturation_drop = None
    if control is not None and is_sat.any():
        sat = part(is_sat)
        distraction.append(_distraction(None, ctrl, sat, k, alpha, n_boot, rng))
        for load in sorted(set(sub.loc[is_sat, "load"])):
            distraction.append(_distraction(key_int(load), ctrl, part(is_sat & (sub["load"] == load).to_numpy()), k,
                                            alpha, n_boot, rng))
        saturation_drop = _saturation_drop(ctrl, sat, alpha, seed)
    fvc = tuple(_failed_vs_correct(sub, trials, what, measure, conds, alpha, seed)
                for what, measure, conds in FAILED_TESTS)
    return replace(out, control=control, cells=tuple(cells), stability=tuple(stability),
                   distraction=tuple(distraction), failed_vs_correct=fvc, saturation_drop=saturation_drop)


def analyze_retrieval(answers: Mapping[tuple[str, str], TrialRetrieval], df: pd.DataFrame, models: list[str],
                      k: int = TOP_K, alpha: float = 0.05, seed: int = 0) -> list[RetrievalHeads]:
    """Retrieval heads of every model of a run (empty when no record holds an answer capture; ``answers`` as for
    :func:`collect`)."""
    sub, trials = collect(answers, df)
    if not trials:
        return []
    out: list[RetrievalHeads] = []
    for m in models:
        mask = (sub["model"] == m).to_numpy()
        out.append(retrieval_heads(sub[mask], [t for t, keep in zip(trials, mask) if keep], m, k, alpha, seed))
    return out


__all__ = ["METHOD", "DistractionLink", "RankAgreement", "RetrievalCell", "RetrievalHead", "RetrievalHeads",
           "analyze_retrieval", "collect", "retrieval_heads"]
