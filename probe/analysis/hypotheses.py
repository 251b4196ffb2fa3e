"""The paper's hypotheses H1–H3 (docs/method.md#hypotheses), fitted per model with the small-sample estimators of
:mod:`probe.analysis.inference`; methods in docs/statistics.md#methods."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import statsmodels.api as sm

from probe.analysis import inference as inf
from probe.analysis.estimate import Estimate
from probe.analysis.estimates import finite
from probe.analysis.glm import exp_or_none, fit_logit
from probe.analysis.inference import Correlation, PairedTest, Power
from probe.analysis.paired_ratio import DEFAULT_MARGIN, Equivalence, paired_equivalence, paired_verdict
from probe.codec import OMIT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadLogit:
    """H1's robustness line: Binomial GLM (logit) of EM on load, clustered by question (:mod:`probe.analysis.glm`).

    Attributes:
        estimate: log-odds of a right answer per percentage point of load, with its CR2 SE, CI and p on t(df)
            Bell–McCaffrey degrees of freedom (none when the fit gives coefficients only; see its ``reason``), and
            how the standard errors were computed (``method``).
        odds_ratio_per_10pp_load: exp(10 · coefficient), the odds ratio of a right answer per 10 percentage points
            of load (None where it would overflow).
    """

    estimate: Estimate
    odds_ratio_per_10pp_load: float | None


@dataclass(frozen=True)
class H1Fit:
    """H1 for one model and condition: EM per percentage point of load, Control trials as load 0.

    Attributes:
        model, condition: the fit's model and condition (``Saturation``: H1 proper; ``Residue``, ``LongControl``).
        n: scored trials in the fit; n_clusters: questions; loads: the load levels (0 = Control).
        estimate: β, EM per percentage point of load (linear probability model; given also when descriptive),
            with its CR2 SE clustered by question, CI and p on t(df) Bell–McCaffrey degrees of freedom (none when
            descriptive: below the minimum number of questions, see its ``reason``), and how the standard errors
            were computed (``method``).
        intercept: EM at load 0.
        logit: the logistic robustness fit (None where the linear fit was not made).
        power: post-hoc power and minimum detectable |β| on the same t(df) reference (None without a test).
    """

    model: str
    condition: str
    n: int
    n_clusters: int
    loads: tuple[int, ...]
    estimate: Estimate
    intercept: float | None
    logit: LoadLogit | None
    power: Power | None


@dataclass(frozen=True)
class PairedComparison:
    """One H2 comparison of one model: condition ``a`` vs ``b`` at ``load``, paired by question and replication.

    Attributes:
        model: the model; a, b: the two conditions; load: the load compared (of ``a``); note: how the pairs were
            formed where that is not plain (a LongControl level without load).
        test: the paired test (:class:`probe.analysis.inference.PairedTest`: pairs, EM of each condition, the
            per-question Δ, the sign-flip p, McNemar, power, or why there is no test).
        q: the BH q-value of ``test.p`` across the model's comparisons (the H2 family); None when descriptive.
        equivalence: the TOST of |Δ| < margin on the same per-question differences, its ``estimate.q`` the BH
            q-value across the model's comparisons (a family of its own); None without pairs.
    """

    model: str
    a: str
    b: str
    load: int
    note: str | None
    test: PairedTest
    q: float | None
    equivalence: Equivalence | None = field(default=None, metadata={OMIT: True})

    def verdict(self, alpha: float) -> str:
        """"different" (q < α), "equivalent within ±δ" (the TOST's q < α) or "neither: no difference detected, MDE
        …" (docs/statistics.md#equivalence-two-one-sided-tests-tost); "not tested" without a test."""
        if not self.test.is_test:
            return "not tested"
        margin = self.equivalence.margin if self.equivalence is not None else DEFAULT_MARGIN
        q_equivalence = self.equivalence.estimate.q if self.equivalence is not None else None
        return paired_verdict(self.q, q_equivalence, margin, self.test.power.mde if self.test.power else None, alpha)


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
        correlation: the correlation of S_sim and degradation over the questions with Control EM, Residue EM and
            S_sim (:class:`probe.analysis.inference.Correlation`: ``n`` questions; Pearson r, its Fisher-z interval,
            the p-value of the same pivot and its BH q-value across the model's H3 rows in ``estimate``; Spearman's
            ρ and its p in ``spearman``; the least-squares line for drawing), or why there is no estimate or test.
        points: one :class:`H3Point` per question (the scatter plot).
    """

    model: str
    load: int | None
    correlation: Correlation
    points: tuple[H3Point, ...]


def with_qvalues(p: list[float | None]) -> list[float | None]:
    """BH q-values of one family (:func:`probe.analysis.inference.bh_qvalues`); None where ``p`` is None."""
    q = inf.bh_qvalues(np.array([np.nan if v is None else v for v in p], dtype=float))
    return [finite(v) for v in q]


# ---------------------------------------------------------------------------------------------------- H1


def _load_logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, alpha: float) -> LoadLogit:
    fit = fit_logit(y, X, groups)
    if not fit.ok:
        return LoadLogit(Estimate.descriptive(None, fit.reason, fit.se_method), None)
    c = fit.coefficient(1, alpha)
    assert c.value is not None
    return LoadLogit(replace(c, value=finite(c.value)), odds_ratio_per_10pp_load=exp_or_none(10 * c.value))


def fit_load_trend(df: pd.DataFrame, model: str, condition: str, alpha: float = 0.05) -> H1Fit:
    """H1: change in EM per percentage point of load for one model and condition (Control as load 0).

    Args:
        df: trial table (:func:`probe.analysis.frame.trials_frame`).
        model: model name.
        condition: ``Saturation`` (H1 proper), ``Residue`` or ``LongControl``.
        alpha: 1 − confidence level and test level.

    Returns:
        The :class:`H1Fit` (``reason`` set where no fit or no test could be made).
    """
    m = df[(df["model"] == model) & df["is_scored"]]
    d = m[((m["condition"] == condition) & (m["load"] > 0)) | (m["condition"] == "Control")]
    d = d.assign(x=np.where(d["condition"] == "Control", 0, d["load"]).astype(float))
    loads = tuple(sorted(int(v) for v in d["x"].unique()))
    n_clusters = int(d["task_id"].nunique())

    def empty(reason: str) -> H1Fit:
        return H1Fit(model=model, condition=condition, n=int(len(d)), n_clusters=n_clusters, loads=loads,
                     estimate=Estimate.descriptive(None, reason), intercept=None, logit=None, power=None)

    n_cond = int((d["condition"] == condition).sum())
    if n_cond == 0:
        return empty(f"no scored {condition} trial at a load above 0")
    if not (d["condition"] == "Control").any():
        return empty("no scored Control trial (load 0)")
    if len(loads) < 2:
        return empty("fewer than two load levels")
    y = d["em"].to_numpy(dtype=float)
    if np.all(y == y[0]):
        return empty(f"EM has no variance (every scored trial has EM {y[0]:g})")
    X = sm.add_constant(d["x"].to_numpy(dtype=float), has_constant="add")
    groups = d["task_id"].to_numpy()
    fit = inf.clustered_ols(y, X, groups, term=1, alpha=alpha)
    e = fit.estimate
    out = H1Fit(model=model, condition=condition, n=int(len(d)), n_clusters=n_clusters, loads=loads,
                estimate=replace(e, value=None if e.value is None else finite(e.value)),
                intercept=finite(fit.params[0]) if fit.params else None, logit=None, power=fit.power)
    if e.value is None:
        return out
    return replace(out, logit=_load_logit(y, X, groups, alpha))


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


def paired_tests(ta: pd.DataFrame, tb: pd.DataFrame, alpha: float, seed: int,
                 margin: float = DEFAULT_MARGIN) -> tuple[PairedTest, Equivalence | None]:
    """The tests of one H2 comparison: pairs ``(task_id, replication)`` of ``ta`` and ``tb``; the sign-flip test
    (McNemar beside it) and the equivalence test (TOST against ±``margin``) on the same per-question differences.

    Args:
        ta: scored trials of the first condition (columns task_id, replication, em).
        tb: scored trials of the second condition.
        alpha: test level (for the power figure and the TOST's interval).
        seed: seed of the Monte Carlo sign flips (used above 16 questions).
        margin: δ of the equivalence test.

    Returns:
        The paired test and the equivalence test (None without pairs); their BH q-values are filled per family by
        :func:`h2_comparisons`.
    """
    merged, why = _pair(ta, tb)
    if merged is None:
        return _no_pairs(why), None
    if merged.empty:
        return _no_pairs("no pair: no (task_id, replication) scored in both conditions"), None
    em_a, em_b, questions = merged["em_a"].to_numpy(float), merged["em_b"].to_numpy(float), merged["task_id"].to_numpy()
    return (inf.paired_sign_flip(em_a, em_b, questions, alpha=alpha, seed=seed),
            paired_equivalence(em_a, em_b, questions, margin, alpha))


def _no_pairs(reason: str | None) -> PairedTest:
    return PairedTest(n_pairs=0, n_questions=0, em_a=None, em_b=None, delta=None, p=None, is_exact=False,
                      n_resamples=None, seed=None, mcnemar=None, power=None, is_test=False,
                      method="sign-flip permutation of per-question mean differences", reason=reason)


def h2_comparisons(df: pd.DataFrame, model: str, alpha: float, seed: int,
                   margin: float = DEFAULT_MARGIN) -> list[PairedComparison]:
    """All paired comparisons of one model (H2 and Residue vs Control, docs/method.md#hypotheses), one BH family.

    - LongControl vs Control at each LongControl load (Control has no load);
    - Saturation vs LongControl at equal load; where LongControl carries no load (records of other tools),
      the one LongControl level is paired with Saturation at every load, and the row says so;
    - Residue vs Control at each Residue load;
    - Residue vs Saturation at equal load (same distractors, different placement).

    Args:
        df: trial table.
        model: model name.
        alpha: test level.
        seed: the experiment's seed; comparison k (in the order above) draws its Monte Carlo sign flips (more than
            16 questions) with seed ``seed + k``.
        margin: δ of each comparison's equivalence test.

    Returns:
        One :class:`PairedComparison` per comparison and load, with BH q-values across them, of the difference
        tests and, separately, of the equivalence tests.
    """
    m = df[(df["model"] == model) & df["is_scored"]]

    def trials(cond: str, load: int | None = None) -> pd.DataFrame:
        t = m[m["condition"] == cond]
        return t if load is None else t[t["load"] == load]

    def loads(cond: str) -> list[int]:
        return sorted(int(v) for v in m.loc[m["condition"] == cond, "load"].unique())

    rows: list[PairedComparison] = []

    def add(a: str, b: str, load: int, ta: pd.DataFrame, tb: pd.DataFrame, note: str | None = None) -> None:
        test, equivalence = paired_tests(ta, tb, alpha, seed + len(rows), margin)
        rows.append(PairedComparison(model=model, a=a, b=b, load=load, note=note, test=test, q=None,
                                     equivalence=equivalence))

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
    q = with_qvalues([r.test.p if r.test.is_test else None for r in rows])
    q_eq = with_qvalues([r.equivalence.estimate.p if r.equivalence is not None else None for r in rows])
    return [replace(r, q=v, equivalence=None if r.equivalence is None else replace(
        r.equivalence, estimate=r.equivalence.estimate.with_q(w))) for r, v, w in zip(rows, q, q_eq)]


# ---------------------------------------------------------------------------------------------------- H3


def _correlate(model: str, load: int | None, x: np.ndarray, y: np.ndarray, alpha: float) -> H3Correlation:
    return H3Correlation(model=model, load=load, correlation=inf.similarity_correlation(x, y, alpha), points=())


def similarity_degradation(df: pd.DataFrame, model: str, alpha: float = 0.05) -> list[H3Correlation]:
    """H3 for one model: Pearson r between per-question S_sim and degradation EM(Control) − EM(Residue).

    The first row pools Residue over loads (``load`` None); then one row per Residue load. The rows are one BH
    family.

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
            res = _with_reason(res, "no scored Residue trial")
        elif residue["s_sim"].isna().all():
            res = _with_reason(res, "no S_sim recorded for the Residue trials (nor computable from prompts.jsonl)")
        points = tuple(H3Point(task_id=str(t), s_sim=float(v.s_sim), degradation=float(v.degradation),
                               em_control=float(v.em_control), em_residue=float(v.em_residue))
                       for t, v in per_task.iterrows())
        rows.append(replace(res, points=points))
    q = with_qvalues([r.correlation.estimate.p if r.correlation.estimate.is_test else None for r in rows])
    return [replace(r, correlation=replace(r.correlation, estimate=r.correlation.estimate.with_q(v)))
            for r, v in zip(rows, q)]


def _with_reason(h: H3Correlation, reason: str) -> H3Correlation:
    """``h`` with the reason it has no estimate (its correlation's)."""
    return replace(h, correlation=replace(h.correlation, estimate=replace(h.correlation.estimate, reason=reason)))
