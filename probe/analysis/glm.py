"""The one logistic fit of the analysis: a Binomial GLM (logit link) with clustered, HC1 or model-based standard
errors, every way it can fail turned into a status and a reason.

Callers: H1's robustness line (:mod:`probe.analysis.hypotheses`), the per-layer attention ↔ behaviour fits
(:mod:`probe.analysis.attention_link`) and the CogniLoad GLMs and their bootstrap refits
(:mod:`probe.analysis.cogniload`).

Standard errors (``statsmodels`` ``GLM.fit``):

- ``groups`` given with at least two clusters: cluster-robust by group (``cov_type="cluster"``);
- ``groups`` given with one cluster: HC1 (clustering cannot be estimated);
- ``groups`` None: model-based (the information matrix).

The reference distribution is the normal (statsmodels' default for a GLM), at any number of clusters; the switch
to small-sample references (issue 10) replaces the internals of :func:`fit_logit` and :meth:`LogitFit.coefficient`.

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
import statsmodels.api as sm
from statsmodels.genmod.generalized_linear_model import GLMResults
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationError, PerfectSeparationWarning

FitStatus = Literal["ok", "failed", "separation", "not_converged", "not_finite"]


@dataclass(frozen=True)
class Coefficient:
    """One coefficient of a fit: estimate, standard error, (1 − alpha) CI and two-sided p (normal reference)."""

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p: float


@dataclass(frozen=True)
class LogitFit:
    """The outcome of :func:`fit_logit`.

    Attributes:
        status: ``ok``, or why the fit is not usable (``failed``, ``separation``, ``not_converged``,
            ``not_finite``).
        reason: a sentence when ``status`` is not ``ok``; None otherwise.
        se_method: how the standard errors were computed (None when the fit failed).
        n_clusters: clusters in ``groups`` (None without groups).
        result: the statsmodels results when ``status`` is ``ok``.
    """

    status: FitStatus
    reason: str | None
    se_method: str | None
    n_clusters: int | None
    result: GLMResults | None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

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
        """Coefficient ``index`` (a column of the design) with its (1 − alpha) CI and p."""
        assert self.result is not None, "coefficient of a failed fit"
        ci = np.asarray(self.result.conf_int(alpha=alpha))
        return Coefficient(estimate=float(self.result.params[index]), se=float(self.result.bse[index]),
                           ci_low=float(ci[index, 0]), ci_high=float(ci[index, 1]),
                           p=float(self.result.pvalues[index]))


def fit_logit(
    y: np.ndarray,
    X: np.ndarray,
    groups: np.ndarray | None = None,
    *,
    freq_weights: np.ndarray | None = None,
    cluster_name: str = "task_id",
) -> LogitFit:
    """Binomial GLM (logit link) of ``y`` on ``X`` (see the module docstring for the standard errors).

    Args:
        y: (n,) outcomes in {0, 1}.
        X: (n, p) design, constant included where wanted.
        groups: (n,) cluster labels, or None for model-based standard errors.
        freq_weights: (n,) frequency weights (a bootstrap replicate), or None.
        cluster_name: what a cluster is, for ``se_method``.

    Returns:
        The :class:`LogitFit`; never raises for a fit that statsmodels cannot make.
    """
    n_clusters = None if groups is None else int(pd.Series(groups).nunique())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = sm.GLM(y, X, family=sm.families.Binomial(), freq_weights=freq_weights)
            if groups is None:
                res = model.fit()
                se_method = "model-based"
            elif n_clusters is not None and n_clusters >= 2:
                res = model.fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(pd.Series(groups))[0]})
                se_method = f"cluster-robust by {cluster_name} (G={n_clusters}, normal)"
            else:
                res = model.fit(cov_type="HC1")
                se_method = f"HC1 (one {cluster_name}: clustering impossible)"
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
    return LogitFit("ok", None, se_method, n_clusters, res)


def exp_or_none(x: float) -> float | None:
    """exp(x), or None where it would overflow a float (an odds ratio too large to write)."""
    return math.exp(x) if abs(x) < 700 else None


__all__ = ["Coefficient", "FitStatus", "LogitFit", "exp_or_none", "fit_logit"]
