"""The one logistic fit of the analysis: a Binomial GLM (logit link) whose standard errors use the small-sample
reference of :mod:`probe.analysis.inference`, every way it can fail turned into a status and a reason.

Callers: H1's robustness line (:mod:`probe.analysis.hypotheses`), the per-layer logistic fits of attention ↔
behaviour (:mod:`probe.analysis.attention_link`), :func:`probe.analysis.inference.clustered_logit` and the CogniLoad
GLMs and their bootstrap refits (:mod:`probe.analysis.cogniload`).

Coefficients come from ``statsmodels`` ``GLM(family=Binomial())``. Standard errors:

- ``groups`` given (clustered by question, or by puzzle): **CR2** with **Bell–McCaffrey degrees of freedom** on the
  converged working regression (design scaled by √(μ(1 − μ)), Pearson residuals), a t reference on those df
  (:func:`probe.analysis.inference.sandwich_weights`); or, with ``vcov="CR1"``, statsmodels ``cov_type="cluster"``
  with t(G − 1). Never the normal reference, which over-rejects with few clusters (docs/statistics.md). With fewer
  than ``min_clusters`` clusters (:data:`probe.analysis.inference.MIN_CLUSTERS`) the fit is descriptive: the
  coefficients are given, standard errors, intervals and p-values are not, and ``test_reason`` says why.
- ``groups`` None: model-based (the information matrix) with the normal reference. Used where every observation is
  its own cluster (CogniLoad puzzles answered once, its bootstrap refits): independent trials, many of them, the
  usual likelihood theory.

A fit is not usable (``status`` other than ``ok``) when statsmodels raises, reports perfect separation, does not
converge, or gives a non-finite coefficient or standard error; ``reason`` says which in a sentence.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import scipy.stats
import statsmodels.api as sm
from statsmodels.genmod.generalized_linear_model import GLMResults
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationError, PerfectSeparationWarning

from probe.analysis.inference import (
    MIN_CLUSTERS,
    InferenceInputError,
    VarianceType,
    cluster_se,
    few_clusters_reason,
    sandwich_weights,
)

FitStatus = Literal["ok", "failed", "separation", "not_converged", "not_finite"]


@dataclass(frozen=True)
class Coefficient:
    """One coefficient of a fit: estimate, standard error, (1 − alpha) CI and two-sided p.

    Attributes:
        estimate: the coefficient (log-odds scale).
        se, ci_low, ci_high, p: None when the fit is descriptive or the clustered SE is 0 (see ``reason``).
        df: degrees of freedom of the t reference (Bell–McCaffrey for CR2, G − 1 for CR1); None for the normal
            reference of a model-based fit.
        reason: why there is no SE, else None.
    """

    estimate: float
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    df: float | None
    reason: str | None


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
    """

    status: FitStatus
    reason: str | None
    se_method: str | None
    n_clusters: int | None
    result: GLMResults | None
    vcov: VarianceType | None = None
    test_reason: str | None = None
    codes: np.ndarray | None = None

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

    def coefficient(self, index: int, alpha: float = 0.05) -> Coefficient:
        """Coefficient ``index`` (a column of the design) with its (1 − alpha) CI and p on the fit's reference."""
        res = self.result
        assert res is not None, "coefficient of a failed fit"
        est = float(res.params[index])
        if self.test_reason is not None:
            return Coefficient(est, None, None, None, None, None, self.test_reason)
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
            se = cluster_se(w, (y - mu) / sw, self.codes, self.n_clusters)
        if not math.isfinite(se) or se <= 1e-12 * max(1.0, abs(est)):
            return Coefficient(est, None, None, None, None, None,
                               "the standard error is 0 or not finite: the outcome does not vary within the tested "
                               "contrast, so it cannot be tested")
        if df is None:
            crit, p = scipy.stats.norm.ppf(1 - alpha / 2), 2 * scipy.stats.norm.sf(abs(est / se))
        else:
            crit, p = scipy.stats.t.ppf(1 - alpha / 2, df), 2 * scipy.stats.t.sf(abs(est / se), df)
        return Coefficient(estimate=est, se=se, ci_low=est - float(crit) * se, ci_high=est + float(crit) * se,
                           p=float(p), df=df, reason=None)


def fit_logit(
    y: np.ndarray,
    X: np.ndarray,
    groups: np.ndarray | None = None,
    *,
    freq_weights: np.ndarray | None = None,
    cluster_name: str = "task_id",
    vcov: VarianceType = "CR2",
    min_clusters: int = MIN_CLUSTERS,
) -> LogitFit:
    """Binomial GLM (logit link) of ``y`` on ``X`` (see the module docstring for the standard errors).

    Args:
        y: (n,) outcomes in {0, 1}.
        X: (n, p) design, constant included where wanted.
        groups: (n,) cluster labels (question or puzzle ids), or None for model-based standard errors.
        freq_weights: (n,) frequency weights (a bootstrap replicate), or None; only without ``groups``.
        cluster_name: what a cluster is, for ``se_method``.
        vcov: ``CR2`` (default) or ``CR1`` when ``groups`` are given.
        min_clusters: fewer clusters than this: coefficients only (the minimum-G rule).

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
        codes = pd.factorize(pd.Series(np.asarray(groups)))[0]
        n_clusters = int(codes.max()) + 1 if codes.size else 0
    if groups is None:
        se_method = "model-based (information matrix), normal reference"
    elif vcov == "CR2":
        se_method = f"CR2 clustered by {cluster_name} (G={n_clusters}), t with Bell-McCaffrey df"
    else:
        se_method = f"CR1 clustered by {cluster_name} (G={n_clusters}), t with G-1 df"
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
    kinds = [w for w in caught if issubclass(w.category, (PerfectSeparationWarning, ConvergenceWarning))]
    if any(issubclass(w.category, PerfectSeparationWarning) for w in kinds):
        first = next(w for w in kinds if issubclass(w.category, PerfectSeparationWarning))
        return LogitFit("separation", f"logistic fit not usable: {first.message}", se_method, n_clusters, None)
    if kinds or not res.converged:
        why = kinds[0].message if kinds else "IRLS did not converge"
        return LogitFit("not_converged", f"logistic fit not usable: {why}", se_method, n_clusters, None)
    if not (np.all(np.isfinite(np.asarray(res.params, dtype=float)))
            and np.all(np.isfinite(np.asarray(res.bse, dtype=float)))):
        return LogitFit("not_finite", "logistic fit not usable: no finite coefficient or standard error (separation)",
                        se_method, n_clusters, None)
    if groups is None:
        return LogitFit("ok", None, se_method, None, res, vcov=None)
    test_reason = None
    if n_clusters is not None and n_clusters < min_clusters:
        test_reason = few_clusters_reason(n_clusters, min_clusters)
    elif vcov == "CR2":
        mu = np.asarray(res.fittedvalues, dtype=float)
        if np.any(np.sqrt(mu * (1 - mu)) < 1e-8):
            test_reason = "fitted probabilities of 0 or 1 (quasi-separation): no usable working weights"
    return LogitFit("ok", None, se_method, n_clusters, res, vcov=vcov, test_reason=test_reason, codes=codes)


def exp_or_none(x: float) -> float | None:
    """exp(x), or None where it would overflow a float (an odds ratio too large to write)."""
    return math.exp(x) if abs(x) < 700 else None


__all__ = ["Coefficient", "FitStatus", "LogitFit", "exp_or_none", "fit_logit"]
