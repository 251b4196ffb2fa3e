"""Per model × condition × load summaries: EM mean, SEM, 95 % CI clustered by question, rates (SPEC §6).

The CI of a cell's EM is the intercept CI of ``statsmodels`` OLS of EM on a constant with standard errors
clustered by ``task_id`` (t with G − 1 degrees of freedom, G = number of questions). Where that is impossible the
fallback is named in ``ci_method``:

- one question only: clustering cannot be estimated; the iid OLS CI (= mean ± t·SEM) is given instead;
- EM has no variance in the cell (all right or all wrong): every standard error is 0, so the Wilson score
  interval of the proportion (``statsmodels.stats.proportion.proportion_confint``) is given instead.

``em_sem`` is always the plain standard error of the mean over trials (``scipy.stats.sem``), as in the paper's
Table 1; ``em_se`` is the standard error behind the CI. Skipped trials and backend errors are counted in
``n_skipped`` / ``n_error`` and never scored as wrong.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.proportion import proportion_confint

from probe.types import CONDITIONS


def _num(x: float | np.floating | None) -> float | None:
    """A finite float, or None (NaN/inf become None so that JSON holds null)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _exp_or_none(x: float) -> float | None:
    """exp(x), or None where it would overflow a float."""
    return math.exp(x) if abs(x) < 700 else None


def clustered_mean_ci(y: np.ndarray, groups: np.ndarray, alpha: float = 0.05) -> dict:
    """Mean of ``y`` with a CI clustered by ``groups`` (see the module docstring for the fallbacks).

    Args:
        y: (n,) outcomes (EM, 0/1).
        groups: (n,) cluster labels (task ids).
        alpha: 1 − confidence level.

    Returns:
        Dict with ``mean``, ``sem``, ``se``, ``ci_low``, ``ci_high``, ``n``, ``n_clusters``, ``ci_method`` and
        ``reason`` (None unless no estimate could be made).
    """
    y = np.asarray(y, dtype=float)
    n = int(y.size)
    n_clusters = int(pd.Series(groups).nunique()) if n else 0
    out: dict = {"mean": None, "sem": None, "se": None, "ci_low": None, "ci_high": None, "n": n,
                 "n_clusters": n_clusters, "ci_method": None, "reason": None}
    if n == 0:
        out["reason"] = "no scored trial"
        return out
    out["mean"] = _num(y.mean())
    if n == 1:
        out["reason"] = "one scored trial: no standard error"
        return out
    out["sem"] = _num(scipy.stats.sem(y))
    if np.all(y == y[0]):
        lo, hi = proportion_confint(int(round(y.sum())), n, alpha=alpha, method="wilson")
        out.update(se=0.0, ci_low=_num(lo), ci_high=_num(hi),
                   ci_method="wilson (EM has no variance in this cell; clustered SE would be 0)")
        return out
    X = np.ones((n, 1))
    if n_clusters >= 2:
        codes = pd.factorize(pd.Series(groups))[0]
        res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
        method = f"cluster-robust by task_id (G={n_clusters}, t with G-1 df)"
    else:
        res = sm.OLS(y, X).fit(use_t=True)
        method = "iid (one question: clustering impossible)"
    ci = res.conf_int(alpha=alpha)
    out.update(se=_num(res.bse[0]), ci_low=_num(ci[0, 0]), ci_high=_num(ci[0, 1]), ci_method=method)
    return out


def _rate(mask: pd.Series, base: pd.Series) -> float | None:
    n = int(base.sum())
    return None if n == 0 else float((mask & base).sum() / n)


def cell_summaries(df: pd.DataFrame, alpha: float = 0.05) -> list[dict]:
    """One summary per model × condition × load present in ``df``.

    Args:
        df: the trial table of :func:`probe.analysis.frame.trials_frame`.
        alpha: 1 − confidence level of the CI.

    Returns:
        Dicts with ``model``, ``condition``, ``load``, ``n_trials``, ``n`` (scored), ``n_skipped``, ``n_error``,
        ``n_clusters``, ``em_mean``, ``em_sem``, ``em_se``, ``em_ci_low``, ``em_ci_high``, ``ci_method``,
        ``hop_recall_mean``, ``truncated_rate``, ``uninterpretable_rate`` (shares of trials with an output),
        ``s_sim_mean``, ``em_interpretable_mean`` (EM of trials neither truncated nor uninterpretable) and
        ``reason``. Sorted by model, condition (paper order), load.
    """
    out: list[dict] = []
    order = {c: i for i, c in enumerate(CONDITIONS)}
    keys = sorted(
        df.groupby(["model", "condition", "load"]).groups,
        key=lambda k: (str(k[0]), order.get(k[1], 99), str(k[1]), int(k[2])),
    )
    for model, condition, load in keys:
        g = df[(df["model"] == model) & (df["condition"] == condition) & (df["load"] == load)]
        scored = g[g["is_scored"]]
        est = clustered_mean_ci(scored["em"].to_numpy(), scored["task_id"].to_numpy(), alpha)
        clean = scored[~scored["truncated"] & ~scored["uninterpretable"]]
        hop = scored["hop_recall"].dropna()
        ssim = g["s_sim"].dropna()
        out.append({
            "model": str(model), "condition": str(condition), "load": int(load),
            "n_trials": int(len(g)), "n": est["n"],
            "n_skipped": int(g["skipped"].sum()), "n_error": int((g["error"].notna() & ~g["skipped"]).sum()),
            "n_clusters": est["n_clusters"],
            "em_mean": est["mean"], "em_sem": est["sem"], "em_se": est["se"],
            "em_ci_low": est["ci_low"], "em_ci_high": est["ci_high"], "ci_method": est["ci_method"],
            "hop_recall_mean": _num(hop.mean()) if len(hop) else None,
            "truncated_rate": _rate(g["truncated"], g["has_output"]),
            "uninterpretable_rate": _rate(g["uninterpretable"], g["has_output"]),
            "s_sim_mean": _num(ssim.mean()) if len(ssim) else None,
            "em_interpretable_mean": _num(clean["em"].mean()) if len(clean) else None,
            "reason": est["reason"],
        })
    return out
