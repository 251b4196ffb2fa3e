"""The paper's hypotheses (SPEC §6), each fitted per model with statsmodels / scipy.

- **H1** (:func:`fit_load_trend`): EM = β0 + β·load, load in percentage points, on one condition's trials at its
  loads plus the Control trials as load 0. Linear probability model by OLS with standard errors clustered by
  ``task_id`` (t with G − 1 df); a Binomial GLM (logit link, same clustering, :func:`probe.analysis.glm.fit_logit`:
  normal reference) is the robustness line, with ``odds_ratio_per_10pp_load`` = exp(10·β_logit).
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
  exact McNemar test is applied; power is the share of draws with p < α. The simulation's generator is seeded
  with the experiment's seed (``[experiment] seed`` of the run's ``config.toml``) plus the comparison's index.

Each returns a frozen dataclass (:class:`H1Fit`, :class:`PairedComparison`, :class:`H3Correlation`). Every
degenerate case (no trials, one load level, no variance, too few pairs or questions) has its estimate fields None
and a ``reason``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.power import NormalIndPower

from probe.analysis.estimates import finite
from probe.analysis.glm import exp_or_none, fit_logit

log = logging.getLogger(__name__)

POWER_TARGET = 0.80


@dataclass(frozen=True)
class LoadLogit:
    """H1's robustness line: Binomial GLM (logit) of EM on load, clustered by question (normal reference).

    Attributes:
        coef: log-odds of a right answer per percentage point of load; se, ci_low, ci_high, p: its SE, CI, p.
        odds_ratio_per_10pp_load: exp(10 · coef), the odds ratio of a right answer per 10 percentage points of
            load (None where it would overflow).
        se_method: how the standard errors were computed.
        reason: why there is no estimate (the fit is not usable), else None.
    """

    coef: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    odds_ratio_per_10pp_load: float | None
    se_method: str | None
    reason: str | None


@dataclass(frozen=True)
class WaldPower:
    """Post-hoc power of a two-sided Wald test at the fitted effect (:func:`wald_power`).

    Attributes:
        power: probability of p < alpha if the true effect equals the estimate.
        mde_80: smallest |effect| detectable with 80 % power at this standard error.
        method: one line on how.
    """

    power: float | None
    mde_80: float | None
    method: str


@dataclass(frozen=True)
class H1Fit:
    """H1 for one model and condition: EM per percentage point of load, Control trials as load 0.

    Attributes:
        model, condition: the fit's model and condition (``Saturation``: H1 proper; ``Residue``, ``LongControl``).
        n: scored trials in the fit; n_clusters: questions; loads: the load levels (0 = Control).
        beta: EM per percentage point of load (linear probability model); se, ci_low, ci_high, p: clustered by
            question (t with G − 1 df); intercept: EM at load 0.
        se_method: how the standard errors were computed.
        logit: the logistic robustness fit (None where the linear fit was not made).
        power: :class:`WaldPower` of the linear fit (None without one).
        reason: why there is no estimate, else None.
    """

    model: str
    condition: str
    n: int
    n_clusters: int
    loads: tuple[int, ...]
    beta: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    intercept: float | None
    se_method: str | None
    logit: LoadLogit | None
    power: WaldPower | None
    reason: str | None


@dataclass(frozen=True)
class McNemarPower:
    """Power of the exact McNemar test by simulation from the fitted discordant shares (:func:`mcnemar_power`).

    Attributes:
        power: share of simulated data sets with p < alpha.
        n_sim: simulated data sets.
        seed: seed of the simulation's generator.
        method: one line on how.
    """

    power: float
    n_sim: int
    seed: int
    method: str


@dataclass(frozen=True)
class PairedTest:
    """Exact McNemar test of two conditions' EM on pairs (task_id, replication) (:func:`paired_test`).

    Attributes:
        n_pairs: pairs scored in both conditions; n_a_only: first right, second wrong; n_b_only: the reverse;
            n_both, n_neither: concordant pairs.
        em_a, em_b: EM of each condition on the pairs; delta: em_a − em_b.
        statistic, p: the test's statistic and p; test: its name.
        power: :class:`McNemarPower` (None without a discordant pair).
        reason: why there is no test (or no information in it), else None.
    """

    n_pairs: int
    n_a_only: int | None
    n_b_only: int | None
    n_both: int | None
    n_neither: int | None
    em_a: float | None
    em_b: float | None
    delta: float | None
    statistic: float | None
    p: float | None
    test: str
    power: McNemarPower | None
    reason: str | None


@dataclass(frozen=True)
class PairedComparison:
    """One H2 comparison of one model: condition ``a`` vs ``b`` at ``load``, with the fields of :class:`PairedTest`.

    Attributes:
        model: the model; a, b: the two conditions; load: the load compared (of ``a``); note: how the pairs were
            formed where that is not plain (a LongControl level without load); the rest: :class:`PairedTest`.
    """

    model: str
    a: str
    b: str
    load: int
    note: str | None
    n_pairs: int
    n_a_only: int | None
    n_b_only: int | None
    n_both: int | None
    n_neither: int | None
    em_a: float | None
    em_b: float | None
    delta: float | None
    statistic: float | None
    p: float | None
    test: str
    power: McNemarPower | None
    reason: str | None


@dataclass(frozen=True)
class H3Point:
    """One question of H3: its mean S_sim over its Residue trials and its degradation EM(Control) − EM(Residue)."""

    task_id: str
    s_sim: float
    degradation: float
    em_control: float
    em_residue: float


@dataclass(frozen=True)
class H3Correlation:
    """H3 for one model (Residue pooled over loads when ``load`` is None, else at that load).

    Attributes:
        model, load: the model and the Residue load (None: pooled).
        n_tasks: questions with Control EM, Residue EM and S_sim.
        r, ci_low, ci_high, p: Pearson r of S_sim and degradation, its Fisher-z CI and p.
        spearman_rho, spearman_p: Spearman's ρ and its p (robustness).
        slope, intercept: least-squares line of degradation on S_sim (``scipy.stats.linregress``), for drawing.
        reason: why there is no estimate, else None; ci_note: why there is r but no CI (three questions).
        points: one :class:`H3Point` per question (the scatter plot).
    """

    model: str
    load: int | None
    n_tasks: int
    r: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    spearman_rho: float | None
    spearman_p: float | None
    slope: float | None
    intercept: float | None
    reason: str | None
    ci_note: str | None
    points: tuple[H3Point, ...]


# ---------------------------------------------------------------------------------------------------- H1


def _fit_ols(y: np.ndarray, X: np.ndarray, groups: np.ndarray, n_clusters: int):
    if n_clusters >= 2:
        codes = pd.factorize(pd.Series(groups))[0]
        res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
        return res, f"cluster-robust by task_id (G={n_clusters}, t with G-1 df)"
    res = sm.OLS(y, X).fit(cov_type="HC1", use_t=True)
    return res, "HC1 heteroskedasticity-robust (one question: clustering impossible)"


def _load_logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, alpha: float) -> LoadLogit:
    fit = fit_logit(y, X, groups)
    if not fit.ok:
        return LoadLogit(None, None, None, None, None, None, fit.se_method, fit.reason)
    c = fit.coefficient(1, alpha)
    return LoadLogit(coef=finite(c.estimate), se=finite(c.se), ci_low=finite(c.ci_low), ci_high=finite(c.ci_high),
                     p=finite(c.p), odds_ratio_per_10pp_load=exp_or_none(10 * c.estimate), se_method=fit.se_method,
                     reason=None)


def wald_power(estimate: float, se: float, n: int, alpha: float = 0.05) -> WaldPower:
    """Post-hoc power of a two-sided Wald test at the fitted effect, and the minimum detectable effect.

    Args:
        estimate: the fitted coefficient.
        se: its standard error (> 0).
        n: observations behind it (only scales the effect size; the noncentrality is |estimate| / se).
        alpha: test level.

    Returns:
        The :class:`WaldPower`.
    """
    analysis = NormalIndPower()
    d = abs(estimate) / se / math.sqrt(n)
    power = analysis.power(effect_size=d, nobs1=n, alpha=alpha, ratio=0, alternative="two-sided")
    d80 = analysis.solve_power(effect_size=None, nobs1=n, alpha=alpha, power=POWER_TARGET, ratio=0,
                               alternative="two-sided")
    return WaldPower(power=finite(power), mde_80=finite(float(d80) * se * math.sqrt(n)),
                     method="observed power of the two-sided Wald test (statsmodels NormalIndPower, noncentrality "
                            "|b|/SE)")


def fit_load_trend(df: pd.DataFrame, model: str, condition: str, alpha: float = 0.05) -> H1Fit:
    """H1: change in EM per percentage point of load for one model and condition (Control as load 0).

    Args:
        df: trial table (:func:`probe.analysis.frame.trials_frame`).
        model: model name.
        condition: ``Saturation`` (H1 proper), ``Residue`` or ``LongControl``.
        alpha: 1 − confidence level and test level.

    Returns:
        The :class:`H1Fit` (``reason`` set and estimates None where no fit could be made).
    """
    m = df[(df["model"] == model) & df["is_scored"]]
    d = m[((m["condition"] == condition) & (m["load"] > 0)) | (m["condition"] == "Control")]
    d = d.assign(x=np.where(d["condition"] == "Control", 0, d["load"]).astype(float))
    loads = tuple(sorted(int(v) for v in d["x"].unique()))
    n_clusters = int(d["task_id"].nunique())
    empty = H1Fit(model=model, condition=condition, n=int(len(d)), n_clusters=n_clusters, loads=loads, beta=None,
                  se=None, ci_low=None, ci_high=None, p=None, intercept=None, se_method=None, logit=None, power=None,
                  reason=None)
    n_cond = int((d["condition"] == condition).sum())
    if n_cond == 0:
        return replace(empty, reason=f"no scored {condition} trial at a load above 0")
    if not (d["condition"] == "Control").any():
        return replace(empty, reason="no scored Control trial (load 0)")
    if len(loads) < 2:
        return replace(empty, reason="fewer than two load levels")
    y = d["em"].to_numpy(dtype=float)
    if np.all(y == y[0]):
        return replace(empty, reason=f"EM has no variance (every scored trial has EM {y[0]:g})")
    X = sm.add_constant(d["x"].to_numpy(dtype=float), has_constant="add")
    groups = d["task_id"].to_numpy()
    res, method = _fit_ols(y, X, groups, n_clusters)
    se = float(res.bse[1])
    if not math.isfinite(se) or se <= 1e-12:
        return replace(empty, reason="standard error of β is 0: EM does not vary within any load level (or within "
                                     "questions), so the trend cannot be tested")
    ci = res.conf_int(alpha=alpha)
    beta, se_b = finite(res.params[1]), finite(res.bse[1])
    return replace(empty, beta=beta, se=se_b, ci_low=finite(ci[1, 0]), ci_high=finite(ci[1, 1]),
                   p=finite(res.pvalues[1]), intercept=finite(res.params[0]), se_method=method,
                   logit=_load_logit(y, X, groups, alpha),
                   power=wald_power(beta, se_b, len(y), alpha) if se_b and beta is not None else None)


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


def mcnemar_power(n_pairs: int, n_a_only: int, n_b_only: int, alpha: float, n_sim: int, seed: int) -> McNemarPower:
    """Power of the exact McNemar test by simulation from the fitted discordant shares.

    Args:
        n_pairs: pairs in the data.
        n_a_only: pairs where only the first condition is correct.
        n_b_only: pairs where only the second condition is correct.
        alpha: test level.
        n_sim: simulated data sets.
        seed: seed of the numpy Generator.

    Returns:
        The :class:`McNemarPower`.
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
    return McNemarPower(power=hits / n_sim, n_sim=n_sim, seed=seed,
                        method="simulation: multinomial redraw of the pairs at the observed discordant shares, "
                               "exact McNemar")


def paired_test(a: pd.DataFrame, b: pd.DataFrame, alpha: float, n_sim: int, seed: int) -> PairedTest:
    """Exact McNemar test of two conditions' EM, paired by ``(task_id, replication)``.

    Args:
        a: scored trials of the first condition (one model, one load), columns task_id, replication, em.
        b: scored trials of the second condition, paired with ``a``.
        alpha: test level (for the power simulation).
        n_sim: simulated data sets for the power estimate.
        seed: seed of the power simulation (the experiment's seed, offset per comparison).

    Returns:
        The :class:`PairedTest`.
    """
    out = PairedTest(n_pairs=0, n_a_only=None, n_b_only=None, n_both=None, n_neither=None, em_a=None, em_b=None,
                     delta=None, statistic=None, p=None, test="exact McNemar (binomial on discordant pairs)",
                     power=None, reason=None)
    merged, why = _pair(a, b)
    if merged is None:
        return replace(out, reason=why)
    n = int(len(merged))
    if n == 0:
        return replace(out, reason="no pair: no (task_id, replication) scored in both conditions")
    ya = merged["em_a"].to_numpy() >= 0.5
    yb = merged["em_b"].to_numpy() >= 0.5
    n_a_only, n_b_only = int((ya & ~yb).sum()), int((~ya & yb).sum())
    table = [[int((ya & yb).sum()), n_a_only], [n_b_only, int((~ya & ~yb).sum())]]
    res = mcnemar(table, exact=True)
    out = replace(out, n_pairs=n, n_a_only=n_a_only, n_b_only=n_b_only, n_both=table[0][0], n_neither=table[1][1],
                  em_a=finite(merged["em_a"].mean()), em_b=finite(merged["em_b"].mean()),
                  delta=finite(merged["em_a"].mean() - merged["em_b"].mean()),
                  statistic=finite(res.statistic), p=finite(res.pvalue))
    if n_a_only + n_b_only == 0:
        return replace(out, reason="no discordant pair: the test has no information (p = 1)")
    return replace(out, power=mcnemar_power(n, n_a_only, n_b_only, alpha, n_sim, seed))


def h2_comparisons(df: pd.DataFrame, model: str, alpha: float, n_sim: int, seed: int) -> list[PairedComparison]:
    """All paired comparisons of one model (SPEC §6 H2 and Residue vs Control).

    - LongControl vs Control at each LongControl load (Control has no load);
    - Saturation vs LongControl at equal load; where LongControl carries no load (records of other tools),
      the one LongControl level is paired with Saturation at every load, and the row says so;
    - Residue vs Control at each Residue load;
    - Residue vs Saturation at equal load (same distractors, different placement).

    Args:
        df: trial table.
        model: model name.
        alpha: test level.
        n_sim: simulated data sets per power estimate.
        seed: the experiment's seed; comparison k (in the order above) simulates with seed ``seed + k``.

    Returns:
        One :class:`PairedComparison` per comparison and load.
    """
    m = df[(df["model"] == model) & df["is_scored"]]

    def trials(cond: str, load: int | None = None) -> pd.DataFrame:
        t = m[m["condition"] == cond]
        return t if load is None else t[t["load"] == load]

    def loads(cond: str) -> list[int]:
        return sorted(int(v) for v in m.loc[m["condition"] == cond, "load"].unique())

    rows: list[PairedComparison] = []

    def add(a: str, b: str, load: int, ta: pd.DataFrame, tb: pd.DataFrame, note: str | None = None) -> None:
        res = paired_test(ta, tb, alpha, n_sim, seed + len(rows))
        rows.append(PairedComparison(model=model, a=a, b=b, load=load, note=note, **vars(res)))

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


def _correlate(model: str, load: int | None, x: np.ndarray, y: np.ndarray, alpha: float) -> H3Correlation:
    out = H3Correlation(model=model, load=load, n_tasks=int(len(x)), r=None, ci_low=None, ci_high=None, p=None,
                        spearman_rho=None, spearman_p=None, slope=None, intercept=None, reason=None, ci_note=None,
                        points=())
    if len(x) < 3:
        return replace(out, reason=f"{len(x)} question(s) with both Control/Residue EM and S_sim; need at least 3")
    if np.all(x == x[0]):
        return replace(out, reason="S_sim is the same for every question")
    if np.all(y == y[0]):
        return replace(out, reason=f"degradation is the same ({y[0]:g}) for every question")
    res = scipy.stats.pearsonr(x, y)
    line = scipy.stats.linregress(x, y)
    out = replace(out, r=finite(res.statistic), p=finite(res.pvalue), slope=finite(line.slope),
                  intercept=finite(line.intercept))
    if len(x) > 3:
        ci = res.confidence_interval(confidence_level=1 - alpha)
        out = replace(out, ci_low=finite(ci.low), ci_high=finite(ci.high))
    else:
        out = replace(out, ci_note="3 questions: the Fisher-z CI needs at least 4")
    sp = scipy.stats.spearmanr(x, y)
    return replace(out, spearman_rho=finite(sp.statistic), spearman_p=finite(sp.pvalue))


def similarity_degradation(df: pd.DataFrame, model: str, alpha: float = 0.05) -> list[H3Correlation]:
    """H3 for one model: Pearson r between per-question S_sim and degradation EM(Control) − EM(Residue).

    The first row pools Residue over loads (``load`` None); then one row per Residue load.

    Returns:
        One :class:`H3Correlation` per row.
    """
    m = df[(df["model"] == model) & df["is_scored"]]
    control = m[m["condition"] == "Control"].groupby("task_id")["em"].mean()
    residue = m[m["condition"] == "Residue"]
    rows: list[H3Correlation] = []
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
        res = _correlate(model, ld, x, y, alpha)
        if residue.empty:
            res = replace(res, reason="no scored Residue trial")
        elif residue["s_sim"].isna().all():
            res = replace(res, reason="no S_sim recorded for the Residue trials (nor computable from prompts.jsonl)")
        points = tuple(H3Point(task_id=str(t), s_sim=float(v.s_sim), degradation=float(v.degradation),
                               em_control=float(v.em_control), em_residue=float(v.em_residue))
                       for t, v in per_task.iterrows())
        rows.append(replace(res, points=points))
    return rows
