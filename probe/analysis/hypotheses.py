"""The paper's hypotheses (SPEC §6), each fitted per model with statsmodels / scipy.

- **H1** (:func:`fit_load_trend`): EM = β0 + β·load, load in percentage points, on one condition's trials at its
  loads plus the Control trials as load 0. Linear probability model by OLS with standard errors clustered by
  ``task_id`` (t with G − 1 df); a Binomial GLM (logit link, same clustering) is the robustness line.
- **H2** (:func:`paired_test`): two conditions paired by ``(task_id, replication)`` (and equal load where both
  carry one), exact McNemar test (``statsmodels.stats.contingency_tables.mcnemar(exact=True)``) on the
  discordant pairs.
- **H3** (:func:`similarity_degradation`): per question, degradation = EM(Control) − EM(Residue) (means over
  replications, and loads); Pearson r with the question's mean S_sim over its Residue trials, Fisher-z CI from
  ``scipy.stats.pearsonr(...).confidence_interval``, Spearman ρ as robustness.
- **Power** (post hoc): for H1 the observed power of the two-sided Wald test at the fitted effect,
  ``statsmodels.stats.power.NormalIndPower`` (one-sample, effect size |β|/SE/√n so that the noncentrality is
  |β|/SE), plus the smallest |β| detectable with 80 % power at the fitted SE. For H2 a simulation from the fitted
  effect: pairs are redrawn as multinomial(n_pairs; observed shares of the two discordant cells) and the same
  exact McNemar test is applied; power is the share of draws with p < α.

Every degenerate case (no trials, one load level, no variance, too few pairs or questions) returns the estimate
fields as None with a ``reason``.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pandas as pd
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.power import NormalIndPower
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

from probe.analysis.estimates import _exp_or_none, _num

log = logging.getLogger(__name__)

POWER_TARGET = 0.80


# ---------------------------------------------------------------------------------------------------- H1


def _fit_ols(y: np.ndarray, X: np.ndarray, groups: np.ndarray, n_clusters: int):
    if n_clusters >= 2:
        codes = pd.factorize(pd.Series(groups))[0]
        res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
        return res, f"cluster-robust by task_id (G={n_clusters}, t with G-1 df)"
    res = sm.OLS(y, X).fit(cov_type="HC1", use_t=True)
    return res, "HC1 heteroskedasticity-robust (one question: clustering impossible)"


def _fit_logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, n_clusters: int, alpha: float) -> dict:
    out: dict = {"coef": None, "se": None, "ci_low": None, "ci_high": None, "p": None, "odds_ratio_per_10pp": None,
                 "se_method": None, "reason": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = sm.GLM(y, X, family=sm.families.Binomial())
            if n_clusters >= 2:
                codes = pd.factorize(pd.Series(groups))[0]
                res = model.fit(cov_type="cluster", cov_kwds={"groups": codes})
                out["se_method"] = f"cluster-robust by task_id (G={n_clusters}, normal)"
            else:
                res = model.fit(cov_type="HC1")
                out["se_method"] = "HC1 (one question: clustering impossible)"
        except (np.linalg.LinAlgError, ValueError) as e:
            out["reason"] = f"logistic fit failed: {e}"
            return out
    bad = [w for w in caught if issubclass(w.category, (PerfectSeparationWarning, ConvergenceWarning))]
    if bad:
        out["reason"] = f"logistic fit not usable: {bad[0].message}"
        return out
    ci = res.conf_int(alpha=alpha)
    coef = float(res.params[1])
    if not math.isfinite(float(res.bse[1])):
        out["reason"] = "logistic fit gave no finite standard error (separation)"
        return out
    out.update(coef=_num(coef), se=_num(res.bse[1]), ci_low=_num(ci[1, 0]), ci_high=_num(ci[1, 1]),
               p=_num(res.pvalues[1]), odds_ratio_per_10pp=_exp_or_none(10 * coef))
    return out


def wald_power(estimate: float, se: float, n: int, alpha: float = 0.05) -> dict:
    """Post-hoc power of a two-sided Wald test at the fitted effect, and the minimum detectable effect.

    Args:
        estimate: the fitted coefficient.
        se: its standard error (> 0).
        n: observations behind it (only scales the effect size; the noncentrality is |estimate| / se).
        alpha: test level.

    Returns:
        Dict with ``power`` (probability of p < alpha if the true effect equals the estimate), ``mde_80``
        (smallest |effect| with 80 % power at this SE) and ``method``.
    """
    analysis = NormalIndPower()
    d = abs(estimate) / se / math.sqrt(n)
    power = analysis.power(effect_size=d, nobs1=n, alpha=alpha, ratio=0, alternative="two-sided")
    d80 = analysis.solve_power(effect_size=None, nobs1=n, alpha=alpha, power=POWER_TARGET, ratio=0,
                               alternative="two-sided")
    return {"power": _num(power), "mde_80": _num(float(d80) * se * math.sqrt(n)),
            "method": "observed power of the two-sided Wald test (statsmodels NormalIndPower, noncentrality |b|/SE)"}


def fit_load_trend(df: pd.DataFrame, model: str, condition: str, alpha: float = 0.05) -> dict:
    """H1: change in EM per percentage point of load for one model and condition (Control as load 0).

    Args:
        df: trial table (:func:`probe.analysis.frame.trials_frame`).
        model: model name.
        condition: ``Saturation`` (H1 proper), ``Residue`` or ``LongControl``.
        alpha: 1 − confidence level and test level.

    Returns:
        Dict with ``beta`` (EM per percentage point), ``se``, ``ci_low``, ``ci_high``, ``p``, ``intercept``,
        ``n``, ``n_clusters``, ``loads``, ``se_method``, ``logit`` (robustness fit), ``power`` and ``reason``.
    """
    m = df[(df["model"] == model) & df["is_scored"]]
    d = m[((m["condition"] == condition) & (m["load"] > 0)) | (m["condition"] == "Control")]
    d = d.assign(x=np.where(d["condition"] == "Control", 0, d["load"]).astype(float))
    loads = sorted(int(v) for v in d["x"].unique())
    n_clusters = int(d["task_id"].nunique())
    out: dict = {"model": model, "condition": condition, "n": int(len(d)), "n_clusters": n_clusters,
                 "loads": loads, "beta": None, "se": None, "ci_low": None, "ci_high": None, "p": None,
                 "intercept": None, "se_method": None, "logit": None, "power": None, "reason": None}
    n_cond = int((d["condition"] == condition).sum())
    if n_cond == 0:
        out["reason"] = f"no scored {condition} trial at a load above 0"
        return out
    if not (d["condition"] == "Control").any():
        out["reason"] = "no scored Control trial (load 0)"
        return out
    if len(loads) < 2:
        out["reason"] = "fewer than two load levels"
        return out
    y = d["em"].to_numpy(dtype=float)
    if np.all(y == y[0]):
        out["reason"] = f"EM has no variance (every scored trial has EM {y[0]:g})"
        return out
    X = sm.add_constant(d["x"].to_numpy(dtype=float), has_constant="add")
    groups = d["task_id"].to_numpy()
    res, method = _fit_ols(y, X, groups, n_clusters)
    se = float(res.bse[1])
    if not math.isfinite(se) or se <= 1e-12:
        out["reason"] = ("standard error of β is 0: EM does not vary within any load level (or within questions), "
                         "so the trend cannot be tested")
        return out
    ci = res.conf_int(alpha=alpha)
    out.update(beta=_num(res.params[1]), se=_num(res.bse[1]), ci_low=_num(ci[1, 0]), ci_high=_num(ci[1, 1]),
               p=_num(res.pvalues[1]), intercept=_num(res.params[0]), se_method=method)
    out["logit"] = _fit_logit(y, X, groups, n_clusters, alpha)
    if out["se"]:
        out["power"] = wald_power(out["beta"], out["se"], len(y), alpha)
    return out


# ---------------------------------------------------------------------------------------------------- H2


def _pair(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame | None, str | None]:
    key = ["task_id", "replication"]
    for name, part in (("first", a), ("second", b)):
        dup = part.duplicated(key, keep=False)
        if dup.any():
            ex = part.loc[dup, key].iloc[0].tolist()
            return None, (f"{int(dup.sum())} {name}-condition trials share a (task_id, replication) key, e.g. "
                          f"{ex}: pairs are ambiguous (map a run/batch column so replications are unique)")
    merged = a[key + ["em"]].merge(b[key + ["em"]], on=key, suffixes=("_a", "_b"))
    return merged, None


def mcnemar_power(n_pairs: int, n_a_only: int, n_b_only: int, alpha: float, n_sim: int, seed: int) -> dict:
    """Power of the exact McNemar test by simulation from the fitted discordant shares.

    Args:
        n_pairs: pairs in the data.
        n_a_only: pairs where only the first condition is correct.
        n_b_only: pairs where only the second condition is correct.
        alpha: test level.
        n_sim: simulated data sets.
        seed: seed of the numpy Generator.

    Returns:
        Dict with ``power`` (share of simulated sets with p < alpha), ``n_sim`` and ``method``.
    """
    rng = np.random.default_rng(seed)
    probs = np.array([n_a_only, n_b_only, n_pairs - n_a_only - n_b_only], dtype=float) / n_pairs
    draws = rng.multinomial(n_pairs, probs, size=n_sim)
    p_cache: dict[tuple[int, int], float] = {}
    hits = 0
    for b, c, _ in draws:
        k = (int(b), int(c))
        if k not in p_cache:
            p_cache[k] = float(mcnemar([[0, k[0]], [k[1], 0]], exact=True).pvalue)
        hits += p_cache[k] < alpha
    return {"power": hits / n_sim, "n_sim": n_sim,
            "method": "simulation: multinomial redraw of the pairs at the observed discordant shares, exact McNemar"}


def paired_test(
    a: pd.DataFrame, b: pd.DataFrame, alpha: float = 0.05, n_sim: int = 500, seed: int = 0
) -> dict:
    """Exact McNemar test of two conditions' EM, paired by ``(task_id, replication)``.

    Args:
        a: scored trials of the first condition (one model, one load), columns task_id, replication, em.
        b: scored trials of the second condition, paired with ``a``.
        alpha: test level (for the power simulation).
        n_sim: simulated data sets for the power estimate.
        seed: seed of the power simulation.

    Returns:
        Dict with ``n_pairs``, ``n_a_only`` (first right, second wrong), ``n_b_only``, ``n_both``,
        ``n_neither``, ``em_a``, ``em_b``, ``delta`` (em_a − em_b on the pairs), ``statistic``, ``p``, ``test``,
        ``power`` and ``reason``.
    """
    out: dict = {"n_pairs": 0, "n_a_only": None, "n_b_only": None, "n_both": None, "n_neither": None,
                 "em_a": None, "em_b": None, "delta": None, "statistic": None, "p": None,
                 "test": "exact McNemar (binomial on discordant pairs)", "power": None, "reason": None}
    merged, why = _pair(a, b)
    if merged is None:
        out["reason"] = why
        return out
    n = int(len(merged))
    out["n_pairs"] = n
    if n == 0:
        out["reason"] = "no pair: no (task_id, replication) scored in both conditions"
        return out
    ya = merged["em_a"].to_numpy() >= 0.5
    yb = merged["em_b"].to_numpy() >= 0.5
    n_a_only, n_b_only = int((ya & ~yb).sum()), int((~ya & yb).sum())
    table = [[int((ya & yb).sum()), n_a_only], [n_b_only, int((~ya & ~yb).sum())]]
    res = mcnemar(table, exact=True)
    out.update(n_a_only=n_a_only, n_b_only=n_b_only, n_both=table[0][0], n_neither=table[1][1],
               em_a=_num(merged["em_a"].mean()), em_b=_num(merged["em_b"].mean()),
               delta=_num(merged["em_a"].mean() - merged["em_b"].mean()),
               statistic=_num(res.statistic), p=_num(res.pvalue))
    if n_a_only + n_b_only == 0:
        out["reason"] = "no discordant pair: the test has no information (p = 1)"
    else:
        out["power"] = mcnemar_power(n, n_a_only, n_b_only, alpha, n_sim, seed)
    return out


def h2_comparisons(df: pd.DataFrame, model: str, alpha: float = 0.05, n_sim: int = 500, seed: int = 0) -> list[dict]:
    """All paired comparisons of one model (SPEC §6 H2 and Residue vs Control).

    - LongControl vs Control at each LongControl load (Control has no load);
    - Saturation vs LongControl at equal load; where LongControl carries no load (records of other tools),
      the one LongControl level is paired with Saturation at every load, and the row says so;
    - Residue vs Control at each Residue load;
    - Residue vs Saturation at equal load (same distractors, different placement).

    Returns:
        One dict per comparison and load: ``model``, ``a``, ``b``, ``load``, ``note`` and the fields of
        :func:`paired_test`.
    """
    m = df[(df["model"] == model) & df["is_scored"]]

    def trials(cond: str, load: int | None = None) -> pd.DataFrame:
        t = m[m["condition"] == cond]
        return t if load is None else t[t["load"] == load]

    def loads(cond: str) -> list[int]:
        return sorted(int(v) for v in m.loc[m["condition"] == cond, "load"].unique())

    rows: list[dict] = []

    def add(a: str, b: str, load: int, ta: pd.DataFrame, tb: pd.DataFrame, note: str | None = None) -> None:
        seed_k = seed + len(rows)
        res = paired_test(ta, tb, alpha, n_sim, seed_k)
        rows.append({"model": model, "a": a, "b": b, "load": load, "note": note, **res})

    control = trials("Control")
    for ld in loads("LongControl"):
        add("LongControl", "Control", ld, trials("LongControl", ld), control)
    lc_loads = loads("LongControl")
    for ld in loads("Saturation"):
        if ld in lc_loads:
            add("Saturation", "LongControl", ld, trials("Saturation", ld), trials("LongControl", ld))
        elif lc_loads == [0]:
            add("Saturation", "LongControl", ld, trials("Saturation", ld), trials("LongControl", 0),
                "LongControl records carry no load: its one level is paired with Saturation at every load")
        elif lc_loads:
            add("Saturation", "LongControl", ld, trials("Saturation", ld), trials("LongControl", -1),
                f"no LongControl trial at load {ld}")
    for ld in loads("Residue"):
        add("Residue", "Control", ld, trials("Residue", ld), control)
    sat_loads = loads("Saturation")
    for ld in loads("Residue"):
        if ld in sat_loads:
            add("Residue", "Saturation", ld, trials("Residue", ld), trials("Saturation", ld))
    return rows


# ---------------------------------------------------------------------------------------------------- H3


def _correlate(x: np.ndarray, y: np.ndarray, alpha: float) -> dict:
    out: dict = {"n_tasks": int(len(x)), "r": None, "ci_low": None, "ci_high": None, "p": None,
                 "spearman_rho": None, "spearman_p": None, "slope": None, "intercept": None, "reason": None}
    if len(x) < 3:
        out["reason"] = f"{len(x)} question(s) with both Control/Residue EM and S_sim; need at least 3"
        return out
    if np.all(x == x[0]):
        out["reason"] = "S_sim is the same for every question"
        return out
    if np.all(y == y[0]):
        out["reason"] = f"degradation is the same ({y[0]:g}) for every question"
        return out
    res = scipy.stats.pearsonr(x, y)
    line = scipy.stats.linregress(x, y)
    out.update(r=_num(res.statistic), p=_num(res.pvalue), slope=_num(line.slope), intercept=_num(line.intercept))
    if len(x) > 3:
        ci = res.confidence_interval(confidence_level=1 - alpha)
        out.update(ci_low=_num(ci.low), ci_high=_num(ci.high))
    else:
        out["ci_note"] = "3 questions: the Fisher-z CI needs at least 4"
    sp = scipy.stats.spearmanr(x, y)
    out.update(spearman_rho=_num(sp.statistic), spearman_p=_num(sp.pvalue))
    return out


def similarity_degradation(df: pd.DataFrame, model: str, alpha: float = 0.05) -> list[dict]:
    """H3 for one model: Pearson r between per-question S_sim and degradation EM(Control) − EM(Residue).

    The first row pools Residue over loads (``load`` None); then one row per Residue load.

    Returns:
        Dicts with ``model``, ``load``, ``n_tasks``, ``r``, ``ci_low``, ``ci_high`` (Fisher z), ``p``,
        ``spearman_rho``, ``spearman_p``, ``slope`` and ``intercept`` (least-squares line of degradation on S_sim,
        ``scipy.stats.linregress``, for drawing), ``reason`` and ``points`` (task_id, s_sim, degradation, em_control,
        em_residue per question, for the scatter plot).
    """
    m = df[(df["model"] == model) & df["is_scored"]]
    control = m[m["condition"] == "Control"].groupby("task_id")["em"].mean()
    residue = m[m["condition"] == "Residue"]
    rows: list[dict] = []
    levels: list[int | None] = [None, *sorted(int(v) for v in residue["load"].unique())]
    if len(levels) == 2:
        levels = levels[:1]  # one load: the pooled row is that load
    for ld in levels:
        r = residue if ld is None else residue[residue["load"] == ld]
        per_task = r.groupby("task_id").agg(em_residue=("em", "mean"), s_sim=("s_sim", "mean"))
        per_task = per_task.join(control.rename("em_control"), how="inner").dropna()
        per_task["degradation"] = per_task["em_control"] - per_task["em_residue"]
        x = per_task["s_sim"].to_numpy(dtype=float)
        y = per_task["degradation"].to_numpy(dtype=float)
        res = _correlate(x, y, alpha)
        if residue.empty:
            res["reason"] = "no scored Residue trial"
        elif residue["s_sim"].isna().all():
            res["reason"] = "no S_sim recorded for the Residue trials (nor computable from prompts.jsonl)"
        points = [{"task_id": str(t), "s_sim": float(v.s_sim), "degradation": float(v.degradation),
                   "em_control": float(v.em_control), "em_residue": float(v.em_residue)}
                  for t, v in per_task.iterrows()]
        rows.append({"model": model, "load": ld, **res, "points": points})
    return rows
