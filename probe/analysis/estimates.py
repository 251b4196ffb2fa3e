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
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.proportion import proportion_confint

from probe.types import CONDITIONS


def finite(x: float | np.floating | None) -> float | None:
    """A finite float, or None (NaN/inf become None, so that a missing estimate is null, never NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class MeanCI:
    """A mean with its CI clustered by question (:func:`clustered_mean_ci`).

    Attributes:
        mean: the mean; None without observations.
        sem: plain standard error of the mean over observations (``scipy.stats.sem``).
        se: the standard error behind the CI.
        ci_low, ci_high: the (1 − alpha) interval.
        n: observations; n_clusters: distinct clusters.
        ci_method: how the CI was made (see the module docstring), None without a CI.
        reason: why there is no estimate, else None.
    """

    mean: float | None
    sem: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    n_clusters: int
    ci_method: str | None
    reason: str | None


@dataclass(frozen=True)
class Cell:
    """EM and rates of the trials of one model × condition × load (or × knob level).

    Attributes:
        model, condition: the cell's model and condition.
        load: load in percent; None for a cell pooled over loads.
        level: the level of another variable the cell is taken at, where a family groups its trials by one (a
            knob of the task); None otherwise.
        n_trials: trials in the cell; n: scored trials; n_skipped, n_error: skipped trials and backend errors
            (never scored as wrong); n_clusters: questions among the scored trials.
        em_mean, em_sem, em_se, em_ci_low, em_ci_high, ci_method: the :class:`MeanCI` of EM.
        hop_recall_mean: mean hop recall of the scored trials.
        truncated_rate, uninterpretable_rate: shares of the trials with an output.
        s_sim_mean: mean S_sim of the cell's trials.
        em_interpretable_mean: EM of the scored trials neither truncated nor uninterpretable.
        reason: why there is no estimate, else None.
    """

    model: str
    condition: str
    load: int | None
    level: int | None
    n_trials: int
    n: int
    n_skipped: int
    n_error: int
    n_clusters: int
    em_mean: float | None
    em_sem: float | None
    em_se: float | None
    em_ci_low: float | None
    em_ci_high: float | None
    ci_method: str | None
    hop_recall_mean: float | None
    truncated_rate: float | None
    uninterpretable_rate: float | None
    s_sim_mean: float | None
    em_interpretable_mean: float | None
    reason: str | None


def clustered_mean_ci(y: np.ndarray, groups: np.ndarray, alpha: float = 0.05) -> MeanCI:
    """Mean of ``y`` with a CI clustered by ``groups`` (see the module docstring for the fallbacks).

    Args:
        y: (n,) outcomes (EM, 0/1).
        groups: (n,) cluster labels (task ids).
        alpha: 1 − confidence level.

    Returns:
        The :class:`MeanCI` (``reason`` set when no estimate could be made).
    """
    y = np.asarray(y, dtype=float)
    n = int(y.size)
    n_clusters = int(pd.Series(groups).nunique()) if n else 0
    empty = MeanCI(None, None, None, None, None, n, n_clusters, None, None)
    if n == 0:
        return replace(empty, reason="no scored trial")
    mean = finite(y.mean())
    if n == 1:
        return replace(empty, mean=mean, reason="one scored trial: no standard error")
    sem = finite(scipy.stats.sem(y))
    if np.all(y == y[0]):
        lo, hi = proportion_confint(int(round(y.sum())), n, alpha=alpha, method="wilson")
        return MeanCI(mean, sem, 0.0, finite(lo), finite(hi), n, n_clusters,
                      "wilson (EM has no variance in this cell; clustered SE would be 0)", None)
    X = np.ones((n, 1))
    if n_clusters >= 2:
        codes = pd.factorize(pd.Series(groups))[0]
        res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
        method = f"cluster-robust by task_id (G={n_clusters}, t with G-1 df)"
    else:
        res = sm.OLS(y, X).fit(use_t=True)
        method = "iid (one question: clustering impossible)"
    ci = res.conf_int(alpha=alpha)
    return MeanCI(mean, sem, finite(res.bse[0]), finite(ci[0, 0]), finite(ci[0, 1]), n, n_clusters, method, None)


def _rate(mask: pd.Series, base: pd.Series) -> float | None:
    n = int(base.sum())
    return None if n == 0 else float((mask & base).sum() / n)


def cell_summaries(df: pd.DataFrame, alpha: float = 0.05, level: bool = False) -> list[Cell]:
    """One :class:`Cell` per model × condition × load present in ``df``.

    Args:
        df: the trial table of :func:`probe.analysis.frame.trials_frame`.
        alpha: 1 − confidence level of the CI.
        level: the ``load`` column holds the level of another variable: it goes to ``Cell.level`` and
            ``Cell.load`` is None.

    Returns:
        Cells sorted by model, condition (paper order), load.
    """
    out: list[Cell] = []
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
        out.append(Cell(
            model=str(model), condition=str(condition), load=None if level else int(load),
            level=int(load) if level else None, n_trials=int(len(g)), n=est.n,
            n_skipped=int(g["skipped"].sum()), n_error=int((g["error"].notna() & ~g["skipped"]).sum()),
            n_clusters=est.n_clusters, em_mean=est.mean, em_sem=est.sem, em_se=est.se,
            em_ci_low=est.ci_low, em_ci_high=est.ci_high, ci_method=est.ci_method,
            hop_recall_mean=finite(hop.mean()) if len(hop) else None,
            truncated_rate=_rate(g["truncated"], g["has_output"]),
            uninterpretable_rate=_rate(g["uninterpretable"], g["has_output"]),
            s_sim_mean=finite(ssim.mean()) if len(ssim) else None,
            em_interpretable_mean=finite(clean["em"].mean()) if len(clean) else None,
            reason=est.reason,
        ))
    return out
