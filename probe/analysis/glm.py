"""The one logistic fit of the analysis: a Binomial GLM whose standard errors use the small-sample reference of
:mod:`probe.analysis.inference`, every way it can fail turned into a status and a reason. Specified in
docs/statistics.md#logistic-fits-under-separation."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import scipy.optimize
import scipy.stats
import statsmodels.api as sm
from statsmodels.genmod.generalized_linear_model import GLMResults
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationError, PerfectSeparationWarning

from probe.analysis.estimate import Estimate
from probe.analysis.inference import (
    DEGENERATE_REASON,
    MIN_CLUSTERS,
    ClusteredFit,
    InferenceInputError,
    VarianceType,
    check_vcov,
    cluster_se,
    contrast_guard,
    descriptive_fit,
    design_arrays,
    few_clusters_reason,
    fit_method,
    sandwich_weights,
    tested_fit,
)

FitStatus = Literal["ok", "failed", "separation", "not_converged", "not_finite"]


@dataclass(frozen=True, eq=False)
class LogitFit:
    """The outcome of :func:`fit_logit`.

    Attributes:
        status: ``ok``, or why the fit is not usable (``failed``, ``separation``, ``not_converged``,
            ``not_finite``).
        reason: a sentence when ``status`` is not ``ok``; None otherwise.
        se_method: how the standard errors are computed (None when the fit failed).
        n_clusters: clusters in ``groups`` (None without groups).
        result: the statsmodels results when ``status`` is ``ok``.
        vcov: ``CR2``, ``CR1``, or None (model-based, normal reference).
        test_reason: why the fit gives coefficients only (fewer clusters than the minimum, fitted probabilities of
            0 or 1); None when :meth:`coefficient` gives standard errors.
        codes: (n,) cluster codes 0..G−1 (None without groups).
        min_clusters: the minimum-G rule, applied also to the clusters that carry a coefficient's contrast.
    """

    status: FitStatus
    reason: str | None
    se_method: str | None
    n_clusters: int | None
    result: GLMResults | None
    vcov: VarianceType | None = None
    test_reason: str | None = None
    codes: np.ndarray | None = None
    min_clusters: int = MIN_CLUSTERS

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_test(self) -> bool:
        """Whether :meth:`coefficient` gives standard errors, intervals and p-values."""
        return self.ok and self.test_reason is None

    @property
    def params(self) -> np.ndarray:
        """(p,) coefficients in the column order of the design (only when ``ok``)."""
        assert self.result is not None, "params of a failed fit"
        return np.asarray(self.result.params, dtype=float)

    @property
    def aic(self) -> float:
        assert self.result is not None, "AIC of a failed fit"
        return float(self.result.aic)

    def coefficient(self, index: int, alpha: float = 0.05) -> Estimate:
        """Coefficient ``index`` (a column of the design) with its (1 − alpha) CI and p on the fit's reference
        (log-odds scale; ``df`` None for the normal reference of a model-based fit; ``method``: the fit's
        ``se_method``)."""
        res = self.result
        assert res is not None, "coefficient of a failed fit"
        est = float(res.params[index])
        if self.test_reason is not None:
            return Estimate.descriptive(est, self.test_reason, self.se_method)
        if self.codes is not None and self.n_clusters is not None:
            few = contrast_guard(np.asarray(res.model.exog, dtype=float)[:, index],
                                 np.asarray(res.model.endog, dtype=float), self.codes, self.min_clusters,
                                 "the tested variable")
            if few is not None:
                return Estimate.descriptive(est, few, self.se_method)
        if self.vcov is None or self.vcov == "CR1":  # statsmodels' own SE: model-based (normal) or CR1 (t, G - 1)
            se = float(res.bse[index])
            df = None if self.vcov is None else float(res.df_resid_inference)
        else:
            assert self.codes is not None and self.n_clusters is not None
            X = np.asarray(res.model.exog, dtype=float)
            y = np.asarray(res.model.endog, dtype=float)
            mu = np.asarray(res.fittedvalues, dtype=float)
            sw = np.sqrt(mu * (1 - mu))  # (n,) square root of the working weights
            w, df = sandwich_weights(X * sw[:, None], self.codes, self.n_clusters, index, "CR2")
            if not math.isfinite(df):
                return Estimate.descriptive(est, DEGENERATE_REASON, self.se_method)
            se = cluster_se(w, (y - mu) / sw, self.codes, self.n_clusters)
        if not math.isfinite(se) or se <= 1e-12 * max(1.0, abs(est)):
            return Estimate.descriptive(est, "the standard error is 0 or not finite: the outcome does not vary within "
                                        "the tested contrast, so it cannot be tested", self.se_method)
        if df is None:
            crit, p = scipy.stats.norm.ppf(1 - alpha / 2), 2 * scipy.stats.norm.sf(abs(est / se))
        else:
            crit, p = scipy.stats.t.ppf(1 - alpha / 2, df), 2 * scipy.stats.t.sf(abs(est / se), df)
        return Estimate(value=est, se=se, ci_low=est - float(crit) * se, ci_high=est + float(crit) * se, df=df,
                        p=float(p), method=self.se_method, is_test=True)


MAX_STD_COEF = 12.0  # |coef * sd(x)| above this: an odds ratio of e^12 per standard deviation is separation


def separation(y: np.ndarray, X: np.ndarray, weights: np.ndarray | None = None) -> str | None:
    """Whether the 0/1 outcomes are (quasi-)completely separated by a combination of the columns of ``X``.

    Method (the linear program of Konis 2007, the check of R's ``detectseparation``): maximise Σ s_i x_i'b subject to
    s_i x_i'b ≥ 0 for every trial and −1 ≤ b ≤ 1, s_i = +1 for a 1 and −1 for a 0 (scipy ``linprog``, HiGHS, on
    columns scaled to unit maximum). A positive optimum is a direction b along which the likelihood rises for
    ever: some coefficient's maximum-likelihood estimate is infinite, and a finite coefficient that IRLS stops at,
    with its standard error, means nothing (e.g. every Control trial right and every Saturation trial wrong but a
    few at the lowest load). The optimum is 0 (b = 0) exactly when no such direction exists.

    Args:
        y: (n,) outcomes in {0, 1}.
        X: (n, p) design.
        weights: (n,) frequency weights; rows with weight 0 are left out.

    Returns:
        A sentence naming the separation (how many trials the separating combination predicts exactly), or None.
    """
    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float)
    if weights is not None:
        keep = np.asarray(weights) > 0
        y, X = y[keep], X[keep]
    if y.size == 0 or np.all(y == y[0]):
        return None
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    A = (2 * y - 1)[:, None] * (X / scale)  # (n, p): rows s_i x_i
    res = scipy.optimize.linprog(-A.sum(axis=0), A_ub=-A, b_ub=np.zeros(y.size), bounds=(-1, 1), method="highs")
    if res.status != 0 or -float(res.fun) <= 1e-7 * y.size:
        return None
    exact = int(np.sum(A @ res.x > 1e-7))
    kind = "complete" if exact == y.size else "quasi-complete"
    return (f"{kind} separation: a combination of the predictors predicts {exact} of the {y.size} outcomes exactly "
            f"(e.g. every trial right at one load), so the maximum-likelihood coefficients are infinite and the "
            f"logistic fit is descriptive only")


def fit_logit(
    y: np.ndarray,
    X: np.ndarray,
    groups: np.ndarray | None = None,
    *,
    freq_weights: np.ndarray | None = None,
    cluster_name: str = "task_id",
    vcov: VarianceType = "CR2",
    min_clusters: int = MIN_CLUSTERS,
    names: tuple[str, ...] | None = None,
) -> LogitFit:
    """Binomial GLM (logit link) of ``y`` on ``X`` (see docs/statistics.md#logistic-fits-under-separation for the standard errors).

    Args:
        y: (n,) outcomes in {0, 1}.
        X: (n, p) design, constant included where wanted.
        groups: (n,) cluster labels (question or puzzle ids), or None for model-based standard errors.
        freq_weights: (n,) frequency weights (a bootstrap replicate), or None; only without ``groups``.
        cluster_name: what a cluster is, for ``se_method``.
        vcov: ``CR2`` (default) or ``CR1`` when ``groups`` are given.
        min_clusters: fewer clusters than this: coefficients only (the minimum-G rule).
        names: the columns' names, for the reasons (else "column j").

    Returns:
        The :class:`LogitFit`; never raises for a fit that statsmodels cannot make.

    Raises:
        InferenceInputError: ``freq_weights`` together with ``groups``, or an unknown ``vcov``.
    """
    if vcov not in ("CR2", "CR1"):
        raise InferenceInputError(f"vcov: {vcov!r} is not one of 'CR2', 'CR1'")
    if groups is not None and freq_weights is not None:
        raise InferenceInputError("fit_logit: clustered standard errors with frequency weights are not defined here; "
                                  "pass one or the other")
    codes = n_clusters = None
    if groups is not None:
        codes = pd.factorize(pd.Series(np.asarray(groups)), use_na_sentinel=False)[0]  # None is a question too
        n_clusters = int(codes.max()) + 1 if codes.size else 0
    if groups is None:
        se_method = "model-based (information matrix), normal reference"
    elif vcov == "CR2":
        se_method = f"CR2 clustered by {cluster_name} (G={n_clusters}), t with Bell-McCaffrey df"
    else:
        se_method = f"CR1 clustered by {cluster_name} (G={n_clusters}), t with G-1 df"
    separated = separation(y, X, freq_weights)
    if separated is not None:
        return LogitFit("separation", f"logistic fit not usable: {separated}", None, n_clusters, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = sm.GLM(y, X, family=sm.families.Binomial(), freq_weights=freq_weights)
            if groups is not None and vcov == "CR1" and n_clusters is not None and n_clusters >= min_clusters:
                res = model.fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
            else:
                res = model.fit()
        except PerfectSeparationError as e:
            return LogitFit("separation", f"logistic fit not usable: {e}", None, n_clusters, None)
        except (np.linalg.LinAlgError, ValueError) as e:
            return LogitFit("failed", f"logistic fit failed: {e}", None, n_clusters, None)
    unusable = _unusable(res, caught, X, names)
    if unusable is not None:
        return LogitFit(unusable[0], f"logistic fit not usable: {unusable[1]}", se_method, n_clusters, None)
    if groups is None:
        return LogitFit("ok", None, se_method, None, res, vcov=None)
    test_reason = None
    if n_clusters is not None and n_clusters < min_clusters:
        test_reason = few_clusters_reason(n_clusters, min_clusters)
    elif vcov == "CR2":
        mu = np.asarray(res.fittedvalues, dtype=float)
        if np.any(np.sqrt(mu * (1 - mu)) < 1e-8):
            test_reason = "fitted probabilities of 0 or 1 (quasi-separation): no usable working weights"
    return LogitFit("ok", None, se_method, n_clusters, res, vcov=vcov, test_reason=test_reason, codes=codes,
                    min_clusters=min_clusters)


def _unusable(res: Any, caught: list[warnings.WarningMessage], X: np.ndarray,
              names: tuple[str, ...] | None) -> tuple[FitStatus, str] | None:
    """Why a fit statsmodels returned cannot be used (its status and reason), or None: a separation or convergence
    warning, IRLS not converged, a non-finite coefficient or standard error, or a coefficient implausibly large for
    its column's spread (quasi-separation that statsmodels did not flag)."""
    kinds = [w for w in caught if issubclass(w.category, (PerfectSeparationWarning, ConvergenceWarning))]
    if any(issubclass(w.category, PerfectSeparationWarning) for w in kinds):
        return "separation", str(next(w for w in kinds if issubclass(w.category, PerfectSeparationWarning)).message)
    if kinds or not res.converged:
        return "not_converged", str(kinds[0].message) if kinds else "IRLS did not converge"
    params = np.asarray(res.params, dtype=float)
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(np.asarray(res.bse, dtype=float)))):
        return "not_finite", "no finite coefficient or standard error (separation)"
    sd = np.asarray(X, dtype=float).std(axis=0)
    big = [j for j, (b, v) in enumerate(zip(params, sd)) if v > 0 and abs(b * v) > MAX_STD_COEF]
    if not big:
        return None
    j = big[0]
    name = names[j] if names is not None and j < len(names) else f"column {j}"
    return "separation", (f"quasi-separation: the {name} coefficient ({float(res.params[j]):.4g}) is implausibly "
                          f"large (|coef x sd| = {abs(float(res.params[j]) * sd[j]):.4g} > {MAX_STD_COEF:g})")


def clustered_logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, term: int = 1, alpha: float = 0.05,
                    vcov: VarianceType = "CR2", min_clusters: int = MIN_CLUSTERS) -> ClusteredFit:
    """Logistic regression (Binomial GLM), question-clustered SEs, small-sample t reference; log-odds.

    Method: the analysis' one logistic fit, :func:`fit_logit` (statsmodels
    ``GLM(family=Binomial())``); the variance of the tested coefficient is
    CR2 with Bell–McCaffrey degrees of freedom applied to the converged working regression (design scaled by
    √(μ(1 − μ)), Pearson residuals (y − μ)/√(μ(1 − μ)); the CR0 version of this is the usual GLM sandwich), or
    with ``vcov="CR1"`` statsmodels' ``cov_type="cluster"`` with t(G − 1) — never the normal reference, which
    over-rejects with few questions. Descriptive only with fewer than ``min_clusters`` questions, an outcome that
    does not vary, a rank-deficient design, or a fit that separates or does not converge (the reason names it).

    Args:
        y: (n,) 0/1 outcome.
        X: (n, k) design matrix, constant included.
        groups: (n,) question ids.
        term: column of ``X`` whose coefficient is tested.
        alpha: test level and 1 − confidence level.
        vcov: ``CR2`` (default) or ``CR1``.
        min_clusters: the minimum-G rule (docs/statistics.md#logistic-fits-under-separation).

    Returns:
        The :class:`ClusteredFit` of column ``term`` (log-odds scale).
    """
    check_vcov(vcov)
    y, X, codes, n_clusters = design_arrays(y, X, groups, term)
    n = int(y.shape[0])
    if np.any((y != 0) & (y != 1)):
        raise InferenceInputError("y: a logistic fit needs 0/1 outcomes")
    method = fit_method("Binomial GLM (logit)", vcov, n_clusters)
    if n <= X.shape[1] or np.linalg.matrix_rank(X) < X.shape[1]:
        return descriptive_fit("logit", term, vcov, n, n_clusters, method,
                            "the design matrix is rank deficient (a covariate is constant or collinear)")
    if np.all(y == y[0]):
        return descriptive_fit("logit", term, vcov, n, n_clusters, method,
                            f"the outcome has no variance (every value {y[0]:g})")
    fit = fit_logit(y, X, codes, vcov=vcov, min_clusters=min_clusters, cluster_name="question")
    if not fit.ok:
        return descriptive_fit("logit", term, vcov, n, n_clusters, method, str(fit.reason))
    params = tuple(float(v) for v in fit.params)
    if fit.test_reason is not None:
        return descriptive_fit("logit", term, vcov, n, n_clusters, method, fit.test_reason, params)
    c = fit.coefficient(term, alpha)
    if c.se is None or c.df is None:
        return descriptive_fit("logit", term, vcov, n, n_clusters, method, str(c.reason), params)
    return tested_fit("logit", term, vcov, params, c.se, c.df, n, n_clusters, method, alpha)


def exp_or_none(x: float) -> float | None:
    """exp(x), or None where it would overflow a float (an odds ratio too large to write)."""
    return math.exp(x) if abs(x) < 700 else None


__all__ = ["MAX_STD_COEF", "FitStatus", "LogitFit", "clustered_logit", "exp_or_none", "fit_logit",
           "separation"]
