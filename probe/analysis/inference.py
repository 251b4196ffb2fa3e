"""Small-sample inference: intervals, CR2 clustered tests on Bell–McCaffrey df, permutation tests, power and FDR,
with the minimum-G rule. Specified in docs/statistics.md#methods."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.proportion import proportion_confint

from probe.analysis.estimate import Estimate
from probe.errors import ProbeError

log = logging.getLogger(__name__)

MIN_CLUSTERS = 6  # fewer questions: fits and tests are descriptive only (docs/statistics.md#the-minimum-number-of-questions)
EXACT_SIGN_FLIP_MAX = 16  # up to 2^16 = 65,536 sign assignments are enumerated exactly
N_RESAMPLES = 9_999  # Monte Carlo sign flips above EXACT_SIGN_FLIP_MAX questions
POWER_TARGET = 0.80
MIN_CORRELATION_N = 4  # the Fisher-z interval needs n − 3 > 0


class InferenceInputError(ProbeError):
    """Arrays handed to an estimator have the wrong shape, length or values."""


# ------------------------------------------------------------------------------------------------------ helpers


def as_vector(name: str, x: np.ndarray, n: int | None = None, *, finite: bool = True) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise InferenceInputError(f"{name}: expected a 1-D array, got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise InferenceInputError(f"{name}: length {a.shape[0]} does not match the {n} observations")
    if finite:
        a = a.astype(float)
        if not np.all(np.isfinite(a)):
            bad = int(np.flatnonzero(~np.isfinite(a))[0])
            raise InferenceInputError(f"{name}: value {a[bad]} at index {bad} is not finite; drop such rows first")
    return a


def cluster_codes(groups: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Integer cluster codes 0..G−1 of ``groups`` (question ids of any hashable dtype) and G."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise InferenceInputError(f"groups: expected {n} question ids, got shape {g.shape}")
    if n == 0:
        return np.zeros(0, dtype=int), 0
    _, codes = np.unique(g.astype(str) if g.dtype == object else g, return_inverse=True)
    return codes.reshape(-1), int(codes.max()) + 1


def _float(x: float | np.floating) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def few_clusters_reason(n_clusters: int, min_clusters: int) -> str:
    """The reason a fit with ``n_clusters`` questions is descriptive only (the minimum-G rule)."""
    return (f"{n_clusters} question(s), fewer than the minimum of {min_clusters}: descriptive only (with so few "
            f"clusters the clustered variance cannot be estimated reliably; see docs/statistics.md)")


def contrast_clusters(x: np.ndarray, groups: np.ndarray) -> int:
    """The number of questions that carry the contrast of a regressor (or of a 0/1 outcome).

    Which questions carry a contrast, and why the minimum-G rule counts only them:
    docs/statistics.md#the-minimum-number-of-questions.

    Args:
        x: (n,) the regressor of interest (or a 0/1 outcome).
        groups: (n,) question ids.

    Returns:
        The number of carrying questions (0..G).
    """
    x = as_vector("x", x)
    codes, n_clusters = cluster_codes(groups, x.shape[0])
    scale = max(1.0, float(np.abs(x).max())) if x.size else 1.0
    tol = 1e-9 * scale
    if x.size == 0 or np.ptp(x) <= tol:
        return n_clusters
    lo = np.full(n_clusters, np.inf)
    hi = np.full(n_clusters, -np.inf)
    np.minimum.at(lo, codes, x)
    np.maximum.at(hi, codes, x)
    flat = hi - lo <= tol
    if not flat.any():
        return n_clusters
    _, counts = np.unique(np.round(lo[flat] / tol), return_counts=True)
    common = int(counts.max())
    return n_clusters if common < 2 else n_clusters - common


def few_contrast_reason(n_carry: int, n_clusters: int, min_clusters: int, what: str) -> str:
    """The reason a test is descriptive because fewer than ``min_clusters`` questions carry its contrast."""
    verb = "carries" if n_carry == 1 else "carry"
    return (f"only {n_carry} of {n_clusters} questions {verb} the contrast ({what}), fewer than the minimum of "
            f"{min_clusters}: descriptive only (a clustered variance cannot see the spread of a contrast that so few "
            f"questions carry; see docs/statistics.md#the-minimum-number-of-questions)")


def contrast_guard(x: np.ndarray, y: np.ndarray | None, groups: np.ndarray, min_clusters: int,
                   x_name: str = "the tested regressor") -> str | None:
    """The minimum-G rule on the questions that carry a test's contrast: a reason when too few do, else None.

    Counts :func:`contrast_clusters` of the tested regressor ``x`` and, for a 0/1 outcome ``y``, of the outcome
    (the questions with a failure, or with a right answer), and applies the smaller count.

    Args:
        x: (n,) the tested column of the design.
        y: (n,) the outcome, or None (only a 0/1 outcome is counted).
        groups: (n,) question ids.
        min_clusters: the minimum-G rule.
        x_name: what ``x`` is, for the reason.
    """
    _, n_clusters = cluster_codes(groups, np.asarray(x).shape[0])
    k = contrast_clusters(x, groups)
    if k < min_clusters:
        return few_contrast_reason(k, n_clusters, min_clusters,
                                   f"the other questions hold {x_name} at one common value")
    if y is not None:
        yv = np.asarray(y, dtype=float)
        if yv.size and np.all((yv == 0) | (yv == 1)):
            ky = contrast_clusters(yv, groups)
            if ky < min_clusters:
                return few_contrast_reason(ky, n_clusters, min_clusters,
                                           "the other questions give the same 0/1 outcome in every trial")
    return None


DEGENERATE_REASON = ("one question alone identifies the tested coefficient (its leverage on it is 1), so its "
                     "residuals are orthogonal to the contrast and no clustered variance can be estimated: "
                     "descriptive only")


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg q-values within one family, tolerant of missing p-values.

    Method: statsmodels ``multipletests(method="fdr_bh")`` over the finite entries; a missing p-value (NaN, e.g.
    a fit that was descriptive only) gets a NaN q-value and does not count towards the family size.

    Args:
        p: p-values of one family, any shape (NaN where missing).

    Returns:
        q-values, same shape as ``p`` (NaN where ``p`` is NaN). A test is significant at FDR α when q < α.
    """
    arr = np.asarray(p, dtype=float)
    q = np.full(arr.shape, np.nan)
    ok = np.isfinite(arr)
    if np.any((arr[ok] < 0) | (arr[ok] > 1)):
        raise InferenceInputError(f"p-values must lie in [0, 1]; got min {arr[ok].min()}, max {arr[ok].max()}")
    if ok.any():
        q[ok] = multipletests(arr[ok], method="fdr_bh")[1]
    return q


# ------------------------------------------------------------------------------------------------------ power


@dataclass(frozen=True)
class Power:
    """Post-hoc power of a two-sided t test with ``df`` degrees of freedom, and its minimum detectable effect.

    Attributes:
        power: probability of p < alpha if the true effect equals the estimate (noncentral t).
        mde: smallest |effect| detected with probability ``target`` at the fitted standard error, in the units of
            the estimate.
        target: the power the MDE refers to.
        df: degrees of freedom of the t reference.
        alpha: test level.
        method: how it was computed.
    """

    power: float | None
    mde: float | None
    target: float
    df: float
    alpha: float
    method: str


def _nct_power(nc: float, df: float, alpha: float) -> float:
    """P(|T| > t_{1−α/2}(df)) for T noncentral t(df, nc), by one-dimensional quadrature over the chi-square.

    T = (Z + nc) / √(V/df) with V ~ χ²(df), so P(T > c) = E Φ(nc − c√(V/df)) and P(T < −c) = E Φ(−nc − c√(V/df)):
    well defined where scipy's ``nct`` returns NaN (noncentralities of 10–40 at small df).
    """
    import scipy.integrate

    c = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    chi2 = scipy.stats.chi2(df)
    lo, hi = float(chi2.ppf(1e-14)), float(chi2.ppf(1 - 1e-14))

    def tails(v: float) -> float:
        s = c * math.sqrt(v / df)
        return float((scipy.stats.norm.cdf(nc - s) + scipy.stats.norm.cdf(-nc - s)) * chi2.pdf(v))

    val, _ = scipy.integrate.quad(tails, lo, hi, limit=200, points=[float(df)])
    return min(1.0, max(0.0, val))


def t_power(estimate: float, se: float, df: float, alpha: float = 0.05, target: float = POWER_TARGET) -> Power:
    """Power and minimum detectable effect of a two-sided t test, on the test's own reference.

    Method: statsmodels ``TTestPower`` with ``nobs = df + 1`` and effect size |estimate| / se / sqrt(nobs), so that
    the noncentrality is |estimate| / se and the reference is t(df) — exactly the reference of the clustered test
    it accompanies (Bell–McCaffrey df for CR2, G − 1 for CR1); where scipy's noncentral t gives NaN (large
    noncentrality) the power is the same probability by quadrature over the chi-square. Post-hoc power at the
    observed effect is a
    re-expression of the p-value, not evidence of its own; the MDE is the useful number for planning.

    Args:
        estimate: fitted effect.
        se: its standard error (> 0).
        df: degrees of freedom of the t reference (> 0; need not be an integer).
        alpha: test level.
        target: power for the minimum detectable effect.

    Returns:
        The :class:`Power`.
    """
    if not (se > 0 and math.isfinite(se)) or not df > 0:
        raise InferenceInputError(f"t_power: needs se > 0 and df > 0, got se={se}, df={df}")
    nobs = df + 1
    analysis = TTestPower()
    power = analysis.power(effect_size=abs(estimate) / se / math.sqrt(nobs), nobs=nobs, alpha=alpha,
                           alternative="two-sided")
    if not math.isfinite(float(power)):  # scipy's noncentral t gives NaN far in its tail (large noncentrality)
        power = _nct_power(abs(estimate) / se, df, alpha)
    d_target = analysis.solve_power(effect_size=None, nobs=nobs, alpha=alpha, power=target, alternative="two-sided")
    return Power(power=_float(power), mde=_float(float(d_target) * math.sqrt(nobs) * se), target=target, df=df,
                 alpha=alpha,
                 method=f"noncentral t with {df:.3g} df, noncentrality |estimate|/SE (statsmodels TTestPower)")


# ------------------------------------------------------------------------------------------------ EM interval


@dataclass(frozen=True)
class ProportionInterval:
    """A mean of 0/1 outcomes with a 95 % (1 − alpha) interval that respects clustering and stays in [0, 1].

    Attributes:
        mean: the share of successes (None without observations).
        ci_low, ci_high: interval bounds, inside [0, 1] (None when no interval can be given).
        se: CR1 cluster-robust standard error of the mean (0 when every outcome is equal).
        design_effect: estimated design effect (clustered variance / binomial variance), floored at 1.
        n_effective: effective sample size behind the interval, after the degrees-of-freedom adjustment.
        n: observations.
        n_clusters: questions.
        method: the method, in words.
        reason: why no interval was given (None otherwise).
    """

    mean: float | None
    ci_low: float | None
    ci_high: float | None
    se: float | None
    design_effect: float | None
    n_effective: float | None
    n: int
    n_clusters: int
    method: str
    reason: str | None


def proportion_ci(y: np.ndarray, groups: np.ndarray, alpha: float = 0.05) -> ProportionInterval:
    """Mean EM of a cell with a bounded interval clustered by question (Korn–Graubard effective-n Wilson).

    The method, its four steps and its simulated coverage at 7–50 questions:
    docs/statistics.md#em-of-a-cell-a-bounded-interval-clustered-by-question. With one question no design effect
    can be estimated and no interval is given.

    Args:
        y: (n,) outcomes in [0, 1] (EM).
        groups: (n,) question ids.
        alpha: 1 − confidence level.

    Returns:
        The :class:`ProportionInterval`.
    """
    y = as_vector("y", y)
    n = int(y.shape[0])
    if np.any((y < 0) | (y > 1)):
        raise InferenceInputError(f"y: outcomes must lie in [0, 1] (EM); got min {y.min()}, max {y.max()}")
    codes, n_clusters = cluster_codes(groups, n)
    method = ("Wilson score interval at the Korn-Graubard effective sample size (CR1 design effect by question, "
              "floored at 1, n/G where every answer is the same; df adjustment (t_{n-1}/t_{G-1})^2)")
    empty = ProportionInterval(mean=None, ci_low=None, ci_high=None, se=None, design_effect=None, n_effective=None,
                               n=n, n_clusters=n_clusters, method=method, reason="no scored trial")
    if n == 0:
        return empty
    p = float(y.mean())
    if n_clusters < 2:
        return replace(empty, mean=p, reason="one question: the design effect cannot be estimated, no interval "
                                             "clustered by question")
    if np.all(y == y[0]):
        var = 0.0
    else:
        res = sm.OLS(y, np.ones((n, 1))).fit(cov_type="cluster", cov_kwds={"groups": codes})
        var = float(res.bse[0]) ** 2
    binomial = p * (1 - p) / n
    # every answer the same: the data cannot estimate the clustering, so assume the worst, ICC 1 (each question
    # one observation, deff = n / G); floored at 1 (the independent-trials interval) it under-covered at 10
    # questions (0.89 at EM 0.1 / 0.9, docs/statistics.md)
    deff = max(1.0, var / binomial) if binomial > 0 else n / n_clusters
    q = 1 - alpha / 2
    n_star = n / deff * (scipy.stats.t.ppf(q, n - 1) / scipy.stats.t.ppf(q, n_clusters - 1)) ** 2
    lo, hi = proportion_confint(p * n_star, n_star, alpha=alpha, method="wilson")
    lo, hi = min(float(lo), p), max(float(hi), p)  # Wilson's bound is exactly p at p = 0 or 1; drop rounding
    return ProportionInterval(mean=p, ci_low=lo, ci_high=hi, se=math.sqrt(var), design_effect=deff,
                              n_effective=float(n_star), n=n, n_clusters=n_clusters, method=method, reason=None)


# ------------------------------------------------------------------------------------------- clustered fits

VarianceType = Literal["CR2", "CR1"]


def sandwich_weights(Xw: np.ndarray, codes: np.ndarray, n_clusters: int, term: int,
                     vcov: VarianceType = "CR2",
                     on_degenerate: Literal["nan", "drop"] = "nan") -> tuple[np.ndarray, float]:
    """Row weights of a cluster-robust variance for one coefficient, and the degrees of freedom of its t reference.

    With residuals e (n,), the variance of coefficient ``term`` is Σ_g (Σ_{i∈g} w_i e_i)², so one weight vector
    serves every outcome fitted on the same design.

    - ``CR2`` (Bell & McCaffrey 2002; Imbens & Kolesár 2016; Pustejovsky & Tipton 2018): the bias-reduced
      linearisation, w_g = (I − H_gg)^{−1/2} X_g (X'X)⁻¹ ℓ (H the hat matrix, H_gg its block of cluster g, the
      inverse square root taken on the positive eigenvalues), with the Bell–McCaffrey Satterthwaite degrees of
      freedom df = (tr M)² / ‖M‖²_F, M = diag(‖w_g‖²) − C'(X'X)⁻¹C, C_g = X_g'w_g (the moments of the variance
      estimator under a working model of independent, equal-variance errors). The df depend on the design only and
      fall below G − 1 where a few questions carry the contrast (a regressor that varies mainly between questions),
      which is where CR1 with t(G − 1) over-rejects. When the tested direction is identified by one cluster
      alone (a regressor non-zero in that cluster only), I − H_gg is singular in exactly that direction and the
      pseudo-inverse would drop it, leaving a variance that misses the contrast: the df are then NaN (the test is
      not estimable; ``on_degenerate="drop"`` keeps the old pseudo-inverse, for the simulations' "before").
    - ``CR1``: w = √c · X (X'X)⁻¹ ℓ, c = G/(G − 1) · (n − 1)/(n − k) (statsmodels' small-sample factor), df = G − 1.

    Args:
        Xw: (n, k) design matrix (for a GLM, scaled by the square root of the working weights).
        codes: (n,) cluster codes 0..G−1.
        n_clusters: G.
        term: index of the coefficient.
        vcov: ``CR2`` or ``CR1``.
        on_degenerate: ``nan`` (df NaN when one cluster alone identifies the term) or ``drop`` (pseudo-inverse).

    Returns:
        (w, df): (n,) weights and the degrees of freedom of the t reference (NaN: not estimable).
    """
    n, k = Xw.shape
    bread = np.linalg.inv(Xw.T @ Xw)  # (k, k)
    u = Xw @ bread[term]  # (n,) CR0 weights
    if vcov == "CR1":
        return math.sqrt(n_clusters / (n_clusters - 1) * (n - 1) / (n - k)) * u, float(n_clusters - 1)
    w = np.empty(n)
    C = np.empty((k, n_clusters))
    degenerate = False
    for g in range(n_clusters):
        idx = np.flatnonzero(codes == g)
        Xg = Xw[idx]  # (n_g, k)
        ev, vec = np.linalg.eigh(np.eye(idx.size) - Xg @ bread @ Xg.T)
        null = ev <= 1e-10
        proj = vec.T @ u[idx]
        if on_degenerate == "nan" and null.any() and np.sum(proj[null] ** 2) > 1e-12 * max(float(u @ u), 1e-300):
            degenerate = True  # the tested direction lies in cluster g alone: CR2's pseudo-inverse would drop it
        inv_sqrt = np.where(~null, 1.0 / np.sqrt(np.clip(ev, 1e-10, None)), 0.0)
        w[idx] = vec @ (inv_sqrt * proj)
        C[:, g] = Xg.T @ w[idx]
    M = -C.T @ bread @ C  # (G, G)
    M[np.diag_indices(n_clusters)] += np.bincount(codes, weights=w**2, minlength=n_clusters)
    df = float(np.trace(M) ** 2 / np.sum(M**2))
    return w, (math.nan if degenerate else df)


@dataclass(frozen=True)
class ClusteredFit:
    """One coefficient of a regression with question-clustered standard errors and a small-sample t reference.

    Attributes:
        model: ``ols`` (linear probability model for 0/1 outcomes) or ``logit`` (Binomial GLM, log-odds).
        term: index of the tested column of the design matrix.
        estimate: the tested coefficient (given also when descriptive, None when it cannot be estimated) with its
            cluster-robust standard error, interval and two-sided p-value on t(df) (Bell–McCaffrey df for CR2,
            G − 1 for CR1), the method in words, and why the fit is descriptive or missing (none for a test).
        vcov: ``CR2`` or ``CR1``.
        n: observations.
        n_clusters: questions.
        params: every coefficient of the fit, in the order of the design matrix's columns.
        power: post-hoc power and minimum detectable effect on the same t(df) reference (None when descriptive).
    """

    model: Literal["ols", "logit"]
    term: int
    estimate: Estimate
    vcov: VarianceType
    n: int
    n_clusters: int
    params: tuple[float, ...]
    power: Power | None

    @property
    def is_test(self) -> bool:
        return self.estimate.is_test


def design_arrays(y: np.ndarray, X: np.ndarray, groups: np.ndarray, term: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray, int]:
    y = as_vector("y", y)
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise InferenceInputError(f"X: expected shape ({y.shape[0]}, k), got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise InferenceInputError("X: the design matrix has non-finite values; drop such rows first")
    if not 0 <= term < X.shape[1]:
        raise InferenceInputError(f"term: column {term} is not in a design matrix with {X.shape[1]} columns")
    codes, n_clusters = cluster_codes(groups, y.shape[0])
    return y, X, codes, n_clusters


def check_vcov(vcov: str) -> None:
    if vcov not in ("CR2", "CR1"):
        raise InferenceInputError(f"vcov: {vcov!r} is not one of 'CR2', 'CR1'")


def fit_method(model: str, vcov: VarianceType, n_clusters: int) -> str:
    ref = "t with Bell-McCaffrey df" if vcov == "CR2" else f"t with G-1 = {n_clusters - 1} df"
    return f"{model}, {vcov} standard errors clustered by question, {ref}"


def descriptive_fit(model: Literal["ols", "logit"], term: int, vcov: VarianceType, n: int, n_clusters: int,
                 method: str, reason: str, params: tuple[float, ...] = ()) -> ClusteredFit:
    estimate = params[term] if params else None
    return ClusteredFit(model=model, term=term, estimate=Estimate.descriptive(estimate, reason, method), vcov=vcov,
                        n=n, n_clusters=n_clusters, params=params, power=None)


def tested_fit(model: Literal["ols", "logit"], term: int, vcov: VarianceType, params: tuple[float, ...], se: float,
          df: float, n: int, n_clusters: int, method: str, alpha: float) -> ClusteredFit:
    if not math.isfinite(df):
        return descriptive_fit(model, term, vcov, n, n_clusters, method, DEGENERATE_REASON, params)
    if not math.isfinite(se) or se <= 1e-12 * max(1.0, abs(params[term])):
        return descriptive_fit(model, term, vcov, n, n_clusters, method,
                            "the clustered standard error is 0 or not finite: the outcome does not vary within "
                            "the tested contrast, so it cannot be tested", params)
    est = params[term]
    t_crit = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    e = Estimate(value=est, se=se, ci_low=est - t_crit * se, ci_high=est + t_crit * se, df=df,
                 p=float(2 * scipy.stats.t.sf(abs(est / se), df)), method=method, is_test=True)
    return ClusteredFit(model=model, term=term, estimate=e, vcov=vcov, n=n, n_clusters=n_clusters, params=params,
                        power=t_power(est, se, df, alpha))


def cluster_se(w: np.ndarray, resid: np.ndarray, codes: np.ndarray, n_clusters: int) -> float:
    """Cluster-robust standard error sqrt(Σ_g (Σ_{i∈g} w_i e_i)²) from the weights of :func:`sandwich_weights`.

    Args:
        w: (n,) weights; resid: (n,) residuals (working residuals for a GLM); codes: (n,) cluster codes 0..G−1;
        n_clusters: G.
    """
    return float(math.sqrt(np.sum(np.bincount(codes, weights=w * resid, minlength=n_clusters) ** 2)))


def clustered_ols(y: np.ndarray, X: np.ndarray, groups: np.ndarray, term: int = 1, alpha: float = 0.05,
                  vcov: VarianceType = "CR2", min_clusters: int = MIN_CLUSTERS) -> ClusteredFit:
    """OLS (linear probability model for 0/1 outcomes), question-clustered SEs, small-sample t reference.

    Method: coefficients and residuals from statsmodels ``OLS``; the variance of the tested coefficient is CR2 with
    Bell–McCaffrey degrees of freedom (:func:`sandwich_weights`), or with ``vcov="CR1"`` statsmodels'
    ``cov_type="cluster"`` with t(G − 1). p-value and interval on that t; power and MDE from :func:`t_power` on the
    same df. Descriptive only (estimate, no SE or p) with fewer than ``min_clusters`` questions, fewer than
    ``min_clusters`` questions carrying the contrast (:func:`contrast_guard`: of the tested column, and of a 0/1
    outcome), a rank-deficient design or an outcome that does not vary. Used for H1 (EM on load, Control as load
    0) and the Residue trend.

    Args:
        y: (n,) outcome.
        X: (n, k) design matrix, constant included (``sm.add_constant``).
        groups: (n,) question ids.
        term: column of ``X`` whose coefficient is tested.
        alpha: test level and 1 − confidence level.
        vcov: ``CR2`` (default) or ``CR1``.
        min_clusters: the minimum-G rule (docs/statistics.md#the-minimum-number-of-questions).

    Returns:
        The :class:`ClusteredFit` of column ``term``.
    """
    check_vcov(vcov)
    y, X, codes, n_clusters = design_arrays(y, X, groups, term)
    n = int(y.shape[0])
    method = fit_method("OLS", vcov, n_clusters)
    if n <= X.shape[1] or np.linalg.matrix_rank(X) < X.shape[1]:
        return descriptive_fit("ols", term, vcov, n, n_clusters, method,
                            "the design matrix is rank deficient (a covariate is constant or collinear)")
    res = sm.OLS(y, X).fit()
    params = tuple(float(v) for v in res.params)
    if n_clusters < min_clusters:
        return descriptive_fit("ols", term, vcov, n, n_clusters, method, few_clusters_reason(n_clusters, min_clusters),
                            params)
    if np.all(y == y[0]):
        return descriptive_fit("ols", term, vcov, n, n_clusters, method,
                            f"the outcome has no variance (every value {y[0]:g})", params)
    few = contrast_guard(X[:, term], y, codes, min_clusters)
    if few is not None:
        return descriptive_fit("ols", term, vcov, n, n_clusters, method, few, params)
    if vcov == "CR1":
        with np.errstate(invalid="ignore"):  # a singular CR1 matrix gives a NaN SE, turned into a reason below
            cr1 = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
            se1 = float(cr1.bse[term])
        return tested_fit("ols", term, vcov, params, se1, float(cr1.df_resid_inference), n, n_clusters, method, alpha)
    w, df = sandwich_weights(X, codes, n_clusters, term, "CR2")
    return tested_fit("ols", term, vcov, params, cluster_se(w, np.asarray(res.resid), codes, n_clusters), df, n,
                 n_clusters, method, alpha)


# ------------------------------------------------------------------------- many outcomes, one design matrix


@dataclass(frozen=True, eq=False)
class ManyFits:
    """One coefficient per outcome of many OLS fits that share a design matrix (a layer or layer × head grid).

    Every array has the grid's shape (e.g. (layer,) or (layer, head)); NaN where a column could not be tested.

    Attributes:
        estimate: the tested coefficient per outcome (given also when descriptive).
        se: question-clustered standard error (CR2 or CR1).
        t: estimate / se.
        p: two-sided p-value on t(df).
        q: Benjamini–Hochberg q-value across the whole grid (one family).
        ci_low, ci_high: 1 − alpha interval on t(df).
        df: degrees of freedom per outcome (shared by the complete columns; a column with missing rows has its own).
        n: observations used per outcome.
        n_clusters: questions in the data.
        vcov: ``CR2`` or ``CR1``.
        is_test: False when the whole grid is descriptive (see ``reason``).
        method: the method, in words.
        reason: why the grid is descriptive (None for tests).
    """

    estimate: np.ndarray
    se: np.ndarray
    t: np.ndarray
    p: np.ndarray
    q: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    df: np.ndarray
    n: np.ndarray
    n_clusters: int
    vcov: VarianceType
    is_test: bool
    method: str
    reason: str | None

    def estimate_at(self, index: int | tuple[int, ...]) -> Estimate:
        """The :class:`~probe.analysis.estimate.Estimate` of one cell of the grid (NaN as None; a test where its p
        is finite; the method and any reason are the grid's, on this object)."""
        def at(a: np.ndarray) -> float | None:
            v = float(a[index])
            return v if math.isfinite(v) else None

        p = at(self.p)
        return Estimate(value=at(self.estimate), se=at(self.se), ci_low=at(self.ci_low), ci_high=at(self.ci_high),
                        df=at(self.df), p=p, q=at(self.q), is_test=p is not None)

    def significant(self, alpha: float = 0.05) -> np.ndarray:
        """Grid indices (rows of ``np.argwhere``) whose BH q-value is below ``alpha``."""
        return np.argwhere(np.nan_to_num(self.q, nan=1.0) < alpha)


def clustered_ols_many(Y: np.ndarray, X: np.ndarray, groups: np.ndarray, term: int = 1, alpha: float = 0.05,
                       vcov: VarianceType = "CR2", min_clusters: int = MIN_CLUSTERS) -> ManyFits:
    """Vectorised OLS of many outcomes on one design matrix, clustered by question, BH over the grid.

    Method: for every outcome column the estimator of :func:`clustered_ols`, for all columns at once:
    β = (X'X)⁻¹X'Y and, with the design's weights w of :func:`sandwich_weights` (CR2 with Bell–McCaffrey df by
    default; CR1 with t(G − 1) gives statsmodels' ``cov_type="cluster"`` numbers), Var = Σ_g (Σ_{i∈g} w_i e_i)²
    per column. A column with non-finite values is fitted by itself on its finite rows with :func:`clustered_ols`
    (its own G and df). BH q-values (:func:`bh_qvalues`) over the whole grid, one family. Descriptive (estimates
    only) with fewer than ``min_clusters`` questions, fewer than ``min_clusters`` questions that carry the tested
    column's contrast (:func:`contrast_clusters`), a tested direction that one question alone identifies, or a
    rank-deficient design.

    Args:
        Y: (n, *grid) outcomes, e.g. (trial, layer, head).
        X: (n, k) design matrix shared by every outcome, constant included.
        groups: (n,) question ids.
        term: column of ``X`` whose coefficient is tested.
        alpha: test level and 1 − confidence level.
        vcov: ``CR2`` (default) or ``CR1``.
        min_clusters: the minimum-G rule (docs/statistics.md#the-minimum-number-of-questions).

    Returns:
        The :class:`ManyFits`, arrays of shape ``grid``.
    """
    check_vcov(vcov)
    Y = np.asarray(Y, dtype=float)
    if Y.ndim < 2:
        raise InferenceInputError(f"Y: expected (n, *grid) outcomes, got shape {Y.shape}")
    n, grid = Y.shape[0], Y.shape[1:]
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] != n or not np.all(np.isfinite(X)):
        raise InferenceInputError(f"X: expected a finite ({n}, k) design matrix, got shape {X.shape}")
    if not 0 <= term < X.shape[1]:
        raise InferenceInputError(f"term: column {term} is not in a design matrix with {X.shape[1]} columns")
    codes, n_clusters = cluster_codes(groups, n)
    k = X.shape[1]
    Yf = Y.reshape(n, -1)  # (n, m)
    m = Yf.shape[1]
    est, se, p, lo, hi, df = (np.full(m, np.nan) for _ in range(6))
    n_used = np.zeros(m)
    ref = "Bell-McCaffrey df" if vcov == "CR2" else "G-1 df"
    method = (f"OLS per outcome on a shared design, {vcov} standard errors clustered by question, t with {ref}; "
              f"Benjamini-Hochberg across the {m} outcomes")
    reason: str | None = None

    def done(is_test: bool) -> ManyFits:
        with np.errstate(invalid="ignore", divide="ignore"):
            t = est / se
        return ManyFits(estimate=est.reshape(grid), se=se.reshape(grid), t=t.reshape(grid), p=p.reshape(grid),
                        q=bh_qvalues(p).reshape(grid), ci_low=lo.reshape(grid), ci_high=hi.reshape(grid),
                        df=df.reshape(grid), n=n_used.reshape(grid), n_clusters=n_clusters, vcov=vcov,
                        is_test=is_test, method=method, reason=reason)

    if n <= k or np.linalg.matrix_rank(X) < k:
        reason = "the design matrix is rank deficient (a covariate is constant or collinear)"
        return done(False)
    finite = np.all(np.isfinite(Yf), axis=0)
    cols = np.flatnonzero(finite)
    beta = np.linalg.solve(X.T @ X, X.T @ Yf[:, cols])  # (k, m_finite)
    est[cols] = beta[term]
    n_used[cols] = n
    few = few_clusters_reason(n_clusters, min_clusters) if n_clusters < min_clusters else \
        contrast_guard(X[:, term], None, codes, min_clusters)
    w, dof = sandwich_weights(X, codes, n_clusters, term, vcov) if few is None else (np.zeros(n), 0.0)
    if few is None and not math.isfinite(dof):
        few = DEGENERATE_REASON
    if few is not None:
        reason = few
        for j in np.flatnonzero(~finite):
            ok = np.isfinite(Yf[:, j])
            if ok.sum() > k and np.linalg.matrix_rank(X[ok]) == k:
                est[j] = sm.OLS(Yf[ok, j], X[ok]).fit().params[term]
                n_used[j] = int(ok.sum())
        return done(False)
    if cols.size:
        resid = Yf[:, cols] - X @ beta  # (n, m_finite)
        onehot = np.zeros((n_clusters, n))
        onehot[codes, np.arange(n)] = 1.0
        s = np.sqrt(np.sum((onehot @ (w[:, None] * resid)) ** 2, axis=0))  # (m_finite,)
        s[s <= 1e-12 * np.maximum(1.0, np.abs(beta[term]))] = np.nan  # an outcome with no residual variation
        t_crit = scipy.stats.t.ppf(1 - alpha / 2, dof)
        se[cols], df[cols] = s, dof
        p[cols] = 2 * scipy.stats.t.sf(np.abs(beta[term] / s), dof)
        lo[cols], hi[cols] = beta[term] - t_crit * s, beta[term] + t_crit * s
    g_arr = np.asarray(groups)
    for j in np.flatnonzero(~finite):  # columns with missing rows: one fit each, on their own rows
        ok = np.isfinite(Yf[:, j])
        if not ok.any():
            continue
        fit = clustered_ols(Yf[ok, j], X[ok], g_arr[ok], term, alpha, vcov, min_clusters)
        n_used[j] = fit.n
        e = fit.estimate
        est[j] = np.nan if e.value is None else e.value
        if fit.is_test:
            se[j], p[j], lo[j], hi[j], df[j] = e.se, e.p, e.ci_low, e.ci_high, e.df
    if (~finite).any():
        log.info("clustered_ols_many: %d of %d outcomes have missing rows and were fitted one by one",
                 int((~finite).sum()), m)
    return done(True)


# ---------------------------------------------------------------------------------------------------- H2


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test on (question, replication) pairs: a secondary figure that ignores clustering.

    Attributes:
        n_pairs: pairs.
        n_a_only: pairs where only the first condition is correct.
        n_b_only: pairs where only the second condition is correct.
        statistic: the smaller discordant count (statsmodels' exact statistic).
        p: exact two-sided p-value.
    """

    n_pairs: int
    n_a_only: int
    n_b_only: int
    statistic: float
    p: float


@dataclass(frozen=True)
class PairedTest:
    """H2: two conditions compared question by question.

    Attributes:
        n_pairs: (question, replication) pairs.
        n_questions: questions.
        em_a, em_b: mean EM of the first and second condition over the pairs.
        delta: mean over questions of the per-question mean difference em_a − em_b (each question weighs the
            same; this is the tested statistic).
        p: two-sided sign-flip permutation p-value (None when descriptive).
        is_exact: the p-value enumerates all 2^G sign assignments (else Monte Carlo).
        n_resamples: sign assignments used (2^G when exact).
        seed: seed of the Monte Carlo draws (None when exact).
        mcnemar: the secondary exact McNemar test on pairs (None without pairs).
        power: power and MDE (in EM units) of the one-sample t test of the per-question differences on G − 1 df,
            the large-sample equivalent of the sign-flip test (None when descriptive or the differences do not
            vary).
        is_test: False when descriptive (see ``reason``).
        method: the method, in words.
        reason: why no test was made, or why the test has no information (None otherwise).
    """

    n_pairs: int
    n_questions: int
    em_a: float | None
    em_b: float | None
    delta: float | None
    p: float | None
    is_exact: bool
    n_resamples: int | None
    seed: int | None
    mcnemar: McNemarResult | None
    power: Power | None
    is_test: bool
    method: str
    reason: str | None


def _mean_along(x: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x, axis=axis)


def paired_sign_flip(em_a: np.ndarray, em_b: np.ndarray, groups: np.ndarray, alpha: float = 0.05,
                     exact_max: int = EXACT_SIGN_FLIP_MAX, n_resamples: int = N_RESAMPLES, seed: int = 0,
                     min_clusters: int = MIN_CLUSTERS) -> PairedTest:
    """H2's primary test: sign-flip permutation of per-question mean paired differences; McNemar beside it.

    The method: docs/statistics.md#h2-the-question-level-paired-test. Exact over all 2^G sign assignments up to
    ``exact_max`` questions, else ``n_resamples`` seeded Monte Carlo ones; descriptive below ``min_clusters``
    questions.

    Args:
        em_a: (n_pairs,) EM of the first condition.
        em_b: (n_pairs,) EM of the second condition, paired with ``em_a`` (same question and replication).
        groups: (n_pairs,) question ids.
        alpha: test level (for the power figure).
        exact_max: largest number of questions enumerated exactly.
        n_resamples: Monte Carlo sign assignments above ``exact_max``.
        seed: seed of the Monte Carlo draws.
        min_clusters: the minimum-G rule (docs/statistics.md#the-minimum-number-of-questions).

    Returns:
        The :class:`PairedTest`.
    """
    a = as_vector("em_a", em_a)
    b = as_vector("em_b", em_b, a.shape[0])
    n = int(a.shape[0])
    codes, n_q = cluster_codes(groups, n)
    method = "sign-flip permutation of per-question mean differences (scipy permutation_test)"
    base = PairedTest(n_pairs=n, n_questions=n_q, em_a=None, em_b=None, delta=None, p=None, is_exact=False,
                      n_resamples=None, seed=None, mcnemar=None, power=None, is_test=False, method=method,
                      reason="no pair: no (question, replication) scored in both conditions")
    if n == 0:
        return base
    ya, yb = a >= 0.5, b >= 0.5
    n_a_only, n_b_only = int((ya & ~yb).sum()), int((~ya & yb).sum())
    mc = mcnemar([[int((ya & yb).sum()), n_a_only], [n_b_only, int((~ya & ~yb).sum())]], exact=True)
    mcn = McNemarResult(n_pairs=n, n_a_only=n_a_only, n_b_only=n_b_only, statistic=float(mc.statistic),
                        p=float(mc.pvalue))
    d = np.bincount(codes, weights=a - b, minlength=n_q) / np.bincount(codes, minlength=n_q)  # (G,)
    base = replace(base, em_a=float(a.mean()), em_b=float(b.mean()), delta=float(d.mean()), mcnemar=mcn)
    if n_q < min_clusters:
        return replace(base, reason=few_clusters_reason(n_q, min_clusters) + f"; the smallest attainable sign-flip p is "
                                                                        f"2/2^{n_q} = {2 / 2 ** n_q:.3g}")
    if abs(float(d.mean())) <= 1e-12 * max(1.0, float(np.abs(d).max())):
        # the observed mean is 0 up to rounding: every sign assignment is at least as extreme, p = 1 exactly
        # (scipy's comparison of rounded sums would call some assignments less extreme)
        flat = bool(np.all(d == 0))
        sd0 = float(np.std(d, ddof=1))
        how0 = (f"exact, all 2^{n_q} sign assignments" if n_q <= exact_max
                else "every assignment at least as extreme as a mean of 0")
        return replace(base, p=1.0, is_test=True, is_exact=n_q <= exact_max, delta=0.0, method=f"{method}; {how0}",
                       n_resamples=2**n_q if n_q <= exact_max else None,
                       power=None if flat or sd0 == 0 else t_power(0.0, sd0 / math.sqrt(n_q), n_q - 1, alpha),
                       reason="no question has a non-zero mean difference: the test has no information (p = 1)"
                       if flat else None)
    is_exact = n_q <= exact_max
    rng = None if is_exact else np.random.default_rng(seed)
    res = scipy.stats.permutation_test((d,), _mean_along, permutation_type="samples", vectorized=True,
                                       n_resamples=np.inf if is_exact else n_resamples, alternative="two-sided",
                                       rng=rng)
    sd = float(np.std(d, ddof=1))
    power = t_power(float(d.mean()), sd / math.sqrt(n_q), n_q - 1, alpha) if sd > 0 else None
    how = f"exact, all 2^{n_q} sign assignments" if is_exact else f"Monte Carlo, {n_resamples} assignments, seed {seed}"
    return replace(base, p=min(1.0, float(res.pvalue)), is_test=True, method=f"{method}; {how}", reason=None,
                   is_exact=is_exact, n_resamples=2**n_q if is_exact else n_resamples,
                   seed=None if is_exact else seed, power=power)


# ---------------------------------------------------------------------------------------------------- H3


SPEARMAN_METHOD = "Spearman rank correlation (scipy.stats.spearmanr)"


@dataclass(frozen=True)
class Correlation:
    """H3: Pearson r of per-question S_sim with degradation, with a test and an interval that agree.

    Attributes:
        n: questions.
        estimate: Pearson r (given, descriptive, from n = 3 on; None when undefined), its Fisher-z interval (none
            for n < 4) and the two-sided p-value from the same pivot, so p < alpha exactly when the interval
            excludes 0 (no ``se``: the pivot is on the z scale); ``is_test`` False when n < 4 or a variable is
            constant, with the ``reason``; the method, in words; its ``q`` where the holder puts it in a family.
        spearman: Spearman's rank correlation and its p-value (robustness; no interval); no value without a test.
        slope, intercept: least-squares line of degradation on S_sim (for drawing).
    """

    n: int
    estimate: Estimate
    spearman: Estimate
    slope: float | None
    intercept: float | None


def similarity_correlation(s_sim: np.ndarray, degradation: np.ndarray, alpha: float = 0.05,
                           min_n: int = MIN_CLUSTERS) -> Correlation:
    """H3: Pearson r between per-question S_sim and degradation, Fisher-z interval and the p-value of that pivot.

    The method: docs/statistics.md#h3-a-correlation-whose-test-and-interval-agree. Descriptive (r only) below
    ``min_n`` questions and at |r| = 1, where the Fisher-z pivot is infinite.

    Args:
        s_sim: (n,) per-question mean S_sim.
        degradation: (n,) per-question EM(Control) − EM(Residue).
        alpha: test level and 1 − confidence level.
        min_n: fewer questions: r is descriptive only (at least :data:`MIN_CORRELATION_N`, which the Fisher-z
            interval needs).

    Returns:
        The :class:`Correlation`.
    """
    x = as_vector("s_sim", s_sim)
    y = as_vector("degradation", degradation, x.shape[0])
    n = int(x.shape[0])
    method = "Pearson r; Fisher-z interval and the p-value of the same pivot; Spearman as robustness"
    no_rank = Estimate(value=None, method=SPEARMAN_METHOD)
    none = Correlation(n=n, estimate=Estimate.descriptive(None, None, method), spearman=no_rank, slope=None,
                       intercept=None)
    x_const = n > 0 and np.ptp(x) <= 1e-12 * max(1.0, float(np.abs(x).max()))
    y_const = n > 0 and np.ptp(y) <= 1e-12 * max(1.0, float(np.abs(y).max()))  # 0.5 - 1/3 vs 1/6: rounding only
    if n < 3 or x_const or y_const:
        why = (f"{n} question(s); need at least {MIN_CORRELATION_N}" if n < 3 else
               "S_sim is the same for every question" if x_const else
               f"degradation is the same ({y[0]:g}) for every question")
        return replace(none, estimate=Estimate.descriptive(None, why, method))
    res = scipy.stats.pearsonr(x, y)
    r = float(res.statistic)
    line = scipy.stats.linregress(x, y)
    min_n = max(min_n, MIN_CORRELATION_N)
    described = replace(none, slope=float(line.slope), intercept=float(line.intercept))
    if n < min_n:
        need = ("the Fisher-z interval and its test need at least" if min_n == MIN_CORRELATION_N else
                "fewer than the minimum of")
        return replace(described, estimate=Estimate.descriptive(
            r, f"{n} questions, {need} {min_n}: r is descriptive only (see "
               f"docs/statistics.md#the-minimum-number-of-questions)", method))
    if abs(r) >= 1 - 1e-12:
        return replace(described, estimate=Estimate.descriptive(
            r, f"r = {r:+.0f}: every question lies on one line, so the Fisher-z pivot is infinite and no interval or "
               f"p-value can be given; r is descriptive only", method))
    ci = res.confidence_interval(confidence_level=1 - alpha)
    p = float(2 * scipy.stats.norm.sf(abs(math.atanh(r)) * math.sqrt(n - 3)))
    sp = scipy.stats.spearmanr(x, y)
    rank_p = _float(sp.pvalue)
    return replace(described, estimate=Estimate(value=r, ci_low=float(ci.low), ci_high=float(ci.high), p=p,
                                                method=method, is_test=True),
                   spearman=Estimate(value=_float(sp.statistic), p=rank_p, method=SPEARMAN_METHOD,
                                     is_test=rank_p is not None))
