"""The three ICE attention tests (failed − correct, condition contrasts, H3's AR_k slope on S_sim), built on
:mod:`probe.analysis.inference`; specified in docs/statistics.md#attention--behaviour-per-layer-and-per-head."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.stats

from probe.analysis.inference import (
    MIN_CLUSTERS,
    InferenceInputError,
    ManyFits,
    VarianceType,
    as_vector,
    clustered_ols_many,
)


def attention_failure_tests(values: np.ndarray, is_failed: np.ndarray, load: np.ndarray, groups: np.ndarray,
                            covariates: np.ndarray | None = None, alpha: float = 0.05, vcov: VarianceType = "CR2",
                            min_clusters: int = MIN_CLUSTERS) -> ManyFits:
    """Per head (or layer): does the attention measure differ between failed and correct trials, at equal load?

    Method: for every grid cell, OLS of the measure (e.g. P_ext enrichment) on [1, is_failed, load, covariates]
    over the trials, CR2 standard errors clustered by question with Bell–McCaffrey df (:func:`clustered_ols_many`);
    the estimate is the mean difference failed − correct adjusted for load and for any further ``covariates``
    (e.g. a Residue indicator when Saturation and Residue trials are pooled); a covariate that does not vary is
    left out and the method says so. BH across the whole grid is the family (the layer × head map, or the
    layers). Pass only trials whose prompt has extraneous segments (Saturation, Residue): the measure is undefined
    or 0 elsewhere. The regression is of attention on the outcome, not the reverse, so that one design matrix
    serves every head and the fit is linear (no separation, no convergence failures).

    Args:
        values: (trial, *grid) attention measure, e.g. (trial, layer, head) enrichment or (trial, layer) head-mean
            P_ext; NaN where undefined for a trial.
        is_failed: (trial,) True where the answer was wrong.
        load: (trial,) load in percentage points.
        groups: (trial,) question ids.
        covariates: (trial, c) further adjustment columns, or None.
        alpha: test level, FDR level and 1 − confidence level.
        vcov: ``CR2`` (default) or ``CR1``.
        min_clusters: the minimum-G rule (docs/statistics.md#the-minimum-number-of-questions).

    Returns:
        The :class:`ManyFits` of the failed − correct difference, arrays of shape ``grid``.
    """
    values = np.asarray(values, dtype=float)
    n = values.shape[0] if values.ndim else 0
    failed = as_vector("is_failed", np.asarray(is_failed, dtype=float), n)
    load = as_vector("load", load, n)
    extra = np.zeros((n, 0)) if covariates is None else np.asarray(covariates, dtype=float).reshape(n, -1)
    if not np.all(np.isfinite(extra)):
        raise InferenceInputError("covariates: non-finite values; drop such rows first")
    adjust = [c for c in [load, *extra.T] if np.ptp(c) > 0]
    X = np.column_stack([np.ones(n), failed, *adjust])
    res = clustered_ols_many(values, X, groups, term=1, alpha=alpha, vcov=vcov, min_clusters=min_clusters)
    if np.ptp(failed) == 0:
        reason = f"every trial is {'failed' if n and failed[0] else 'correct'}: no contrast to test"
        return replace(res, is_test=False, reason=reason)
    dropped = 1 + extra.shape[1] - len(adjust)
    what = f"failed - correct difference adjusted for {len(adjust)} covariate(s) (load first)"
    if dropped:
        what += f"; {dropped} constant covariate(s) left out"
    return replace(res, method=what + "; " + res.method)


def condition_contrast_tests(values: np.ndarray, is_treated: np.ndarray, groups: np.ndarray,
                             covariates: np.ndarray | None = None, alpha: float = 0.05, vcov: VarianceType = "CR2",
                             min_clusters: int = MIN_CLUSTERS, what: str = "treated - reference") -> ManyFits:
    """Per head (or layer): does the attention measure differ between two conditions of the same questions?

    Method: the fit of :func:`attention_failure_tests` with the condition indicator in place of failure and without
    load (one load per side: load would be the indicator): OLS of the measure on [1, is_treated, covariates] over
    the trials of both conditions, CR2 standard errors clustered by question with Bell–McCaffrey df, BH across the
    grid. A covariate that does not vary, or that the columns before it determine, is left out and the method says
    so.

    Args:
        values: (trial, *grid) attention measure.
        is_treated: (trial,) True for the condition tested (e.g. Saturation at 80 %), False for the reference.
        groups: (trial,) question ids.
        covariates: (trial, c) adjustment columns (e.g. hop position), or None.
        alpha, vcov, min_clusters: as :func:`attention_failure_tests`.
        what: the contrast in words (the method line names it).

    Returns:
        The :class:`ManyFits` of the treated − reference difference, arrays of shape ``grid``.
    """
    values = np.asarray(values, dtype=float)
    n = values.shape[0] if values.ndim else 0
    treated = as_vector("is_treated", np.asarray(is_treated, dtype=float), n)
    extra = np.zeros((n, 0)) if covariates is None else np.asarray(covariates, dtype=float).reshape(n, -1)
    if not np.all(np.isfinite(extra)):
        raise InferenceInputError("covariates: non-finite values; drop such rows first")
    cols = [np.ones(n), treated]
    for c in extra.T:
        if np.linalg.matrix_rank(np.column_stack([*cols, c])) > len(cols):
            cols.append(c)
    res = clustered_ols_many(values, np.column_stack(cols), groups, term=1, alpha=alpha, vcov=vcov,
                             min_clusters=min_clusters)
    if np.ptp(treated) == 0:
        return replace(res, is_test=False, reason="every trial is on one side of the contrast: nothing to compare")
    dropped = extra.shape[1] - (len(cols) - 2)
    how = f"{what} difference adjusted for {len(cols) - 2} covariate(s)"
    if dropped:
        how += f"; {dropped} constant or collinear covariate(s) left out"
    return replace(res, method=how + "; " + res.method)


@dataclass(frozen=True, eq=False)
class ResidueSimilarity:
    """H3 in attention: the slope of head-mean AR_k on S_sim per layer, with the pooled correlation.

    Attributes:
        fits: per layer, the slope of AR_k per unit of S_sim (:class:`ManyFits`, shape (layer,)); BH across layers.
        pearson_r: (layer,) Pearson r of AR_k with S_sim over the prompts, descriptive (ignores clustering).
        is_load_adjusted: whether load entered the fit as a covariate.
    """

    fits: ManyFits
    pearson_r: np.ndarray
    is_load_adjusted: bool


def residue_similarity_tests(ar_k: np.ndarray, s_sim: np.ndarray, groups: np.ndarray,
                             load: np.ndarray | None = None, alpha: float = 0.05, vcov: VarianceType = "CR2",
                             min_clusters: int = MIN_CLUSTERS) -> ResidueSimilarity:
    """H3 in attention: per layer, does the head-mean AR_k of a target grow with the prompt's S_sim?

    Method: per layer, OLS of AR_k on [1, S_sim] (plus load when given and varying), over the Residue prompts,
    CR2 standard errors clustered by question with Bell–McCaffrey df, BH across layers
    (:func:`clustered_ols_many`). S_sim varies mostly between questions, the case in which CR1 with t(G − 1)
    over-rejects (12 % at G = 7 in docs/statistics.md). Call it once per target (the question; the last germane
    segment): each target is its own family. Pearson r per layer is reported beside it as a descriptive effect
    size only.

    Args:
        ar_k: (prompt, layer) head-mean AR_k of one target, Residue prompts only (NaN where undefined).
        s_sim: (prompt,) S_sim of each prompt.
        groups: (prompt,) question ids.
        load: (prompt,) load in percentage points, or None.
        alpha: test level, FDR level and 1 − confidence level.
        vcov: ``CR2`` (default) or ``CR1``.
        min_clusters: the minimum-G rule (docs/statistics.md#the-minimum-number-of-questions).

    Returns:
        The :class:`ResidueSimilarity`.
    """
    ar_k = np.asarray(ar_k, dtype=float)
    if ar_k.ndim != 2:
        raise InferenceInputError(f"ar_k: expected (prompt, layer), got shape {ar_k.shape}")
    n = ar_k.shape[0]
    s = as_vector("s_sim", s_sim, n)
    cols = [np.ones(n), s]
    load_col = None if load is None else as_vector("load", load, n)
    adjusted = load_col is not None and bool(np.ptp(load_col) > 0)
    if load_col is not None and adjusted:
        cols.append(load_col)
    fits = clustered_ols_many(ar_k, np.column_stack(cols), groups, term=1, alpha=alpha, vcov=vcov,
                              min_clusters=min_clusters)
    r = np.full(ar_k.shape[1], np.nan)
    for j in range(ar_k.shape[1]):
        ok = np.isfinite(ar_k[:, j])
        if ok.sum() >= 3 and np.ptp(s[ok]) > 0 and np.ptp(ar_k[ok, j]) > 0:
            r[j] = scipy.stats.pearsonr(s[ok], ar_k[ok, j]).statistic
    return ResidueSimilarity(fits=fits, pearson_r=r, is_load_adjusted=bool(adjusted))


__all__ = ["ResidueSimilarity", "attention_failure_tests", "condition_contrast_tests", "residue_similarity_tests"]
