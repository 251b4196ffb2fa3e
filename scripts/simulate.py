"""Seeded simulations behind ``docs/statistics.md``: interval coverage and null rejection rates, before and after.

Run ``python scripts/simulate.py`` (``--quick`` for a small version; ``--help`` for the sizes). Every
setting draws from its own generator, ``numpy.random.default_rng([seed, <setting numbers>])``, so a table row is
reproducible on its own and does not depend on which other rows were run. The "after" column applies
:mod:`probe.analysis.inference`; the "before" column applies the methods the analysis used until then, written
here with the same statsmodels / scipy calls: the clustered t-interval of the mean (Wilson where every outcome is
equal), the logistic GLM with a normal reference, Holm across layers, exact McNemar on (question, replication)
pairs, and the t-test p-value of Pearson's r.

Data-generating processes (all under "no effect" except the power table):

- **EM cells** (coverage): question q has success probability p_q ~ Beta(μκ, (1 − μ)κ) (mean μ, intra-question
  correlation 1/(κ + 1)); each of its R replications is Bernoulli(p_q).
- **H1** (load trend): Control at load 0 and Saturation at 20/50/80, R replications each. p_q ~ Beta(1, 1), and a
  question-specific slope with mean zero: p_q(ℓ) = p_q + ε_q·h_q·(ℓ − 40)/40, ε_q ~ U(−1, 1),
  h_q = min(p_q, 1 − p_q)/2, so E[EM | load] does not depend on load.
- **H2** (12 paired comparisons of one model): a_q ~ N(0, 1.5²); every (condition, load) cell of a question has
  p = logistic(a_q + τ z), z ~ N(0, 1) independent per cell (τ = 1): each question has its own condition effect,
  with mean zero and exchangeable conditions. τ = 1 and τ = 2 are tabulated.
- **Attention** (per layer, per head): Saturation and Residue at 20/50/80, R replications; failed ~ Bernoulli(
  1 − p_q), p_q ~ Beta(1, 1), independent of attention. Enrichment[t, l, h] = 1 + 0.3·ℓ/100 − 0.1·Residue +
  question effects (shared, per layer, per head) + trial effects (shared, per layer, per head), each N(0, 0.1²);
  the per-layer measure is its head mean.
- **H3 in attention**: Residue prompts at 20/50/80, R replications; S_sim = 0.3 + 0.1·c_q + 0.03·e (mostly
  between questions); AR_k[prompt, l] = 0.2 + 0.1·ℓ/100 + question and prompt effects, independent of S_sim.
- **H3** (behaviour): per question S_sim ~ N(0.3, 0.1²), EM(Control) the mean of 2 Bernoulli(p_q), EM(Residue) of
  6 Bernoulli(0.8·p_q), p_q ~ Beta(1, 1), independent of S_sim.
- **H1 power**: p_q ~ U(0.4, 0.9) and EM falls by β per point of load for every question (no clipping needed).
- **What the model wrote**: per question log tokens ~ N(4, 0.8²) and three shares (one sentence, restates the last
  fact, restates the first) ~ Beta(0.5, 0.5); every trial of Control and of 6 other cells draws tokens =
  round(exp(log tokens + N(0, 0.6²))) and Bernoulli indicators at the question's shares: skewed, question-clustered,
  exchangeable between conditions.
- **Equivalence** (TOST at ±δ): p_q ~ U(0.3, 0.6) under b and p_q + Δ_q under a, two replications; two prompts of
  the question drawn independently (H2's design), or one prompt with and without an edit sharing one uniform draw
  per replication, or the whole difference on three questions (``equivalence_rates``).
- **One question carries every failure** (per head): 16 trials per question at loads 20/50/80/20, half the trials
  of question 0 failed and none elsewhere; enrichment = 1 + 0.3·ℓ/100 + question and trial effects N(0, 0.1²) per
  head, independent of failure. "before" is the CR2 test as it was (the pseudo-inverse, G counted over all
  questions).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_confint

from probe.analysis import attention_tests as att
from probe.analysis import glm
from probe.analysis import inference as inf
from probe.analysis.max_t import max_t_sign_flip, question_contrasts
from probe.analysis.paired_ratio import fieller_interval, fieller_quadratic, recovered_share, sign_flip_p

log = logging.getLogger(__name__)

ALPHA = 0.05
DEFAULT_SEED = 20260
LOADS = (20, 50, 80)
H2_FAMILY = 12  # LongControl-Control, Saturation-LongControl, Residue-Control, Residue-Saturation at 3 loads
H3_RUN_FACTOR = 5  # the H3 correlation tables run five times as many data sets (they cost little)
H2_TAUS = (1.0, 2.0)  # spread of the question-specific condition effects (logit scale) in the H2 null


@dataclass(frozen=True)
class CoverageRow:
    """Coverage of the EM interval in one setting.

    Attributes:
        clusters: questions G.
        replications: trials per question R.
        em: true mean EM μ.
        kappa: Beta concentration κ (intra-question correlation 1/(κ + 1)).
        n_runs: simulated data sets.
        coverage: share of runs whose :func:`inference.proportion_ci` interval holds μ.
        width: mean width of that interval.
        coverage_before: the same for the clustered t-interval used before.
        outside_before: share of runs whose "before" interval leaves [0, 1].
    """

    clusters: int
    replications: int
    em: float
    kappa: float
    n_runs: int
    coverage: float
    width: float
    coverage_before: float
    outside_before: float


@dataclass(frozen=True)
class RejectionRow:
    """Share of no-effect data sets (or of tests in them) in which a test rejects at α = 0.05.

    Attributes:
        test: the test or family.
        clusters: questions G (n for the H3 correlation).
        n_runs: simulated data sets.
        per: ``test`` (rate over every test of every run) or ``family`` (share of runs with >= 1 rejection).
        before: rate of the method used before (None where there was none).
        cr1_t: rate with CR1 standard errors and a t(G − 1) reference (None where not applicable).
        after: rate of the method of :mod:`probe.analysis.inference`.
        note: what "before" and "after" are.
    """

    test: str
    clusters: int
    n_runs: int
    per: str
    before: float | None
    cr1_t: float | None
    after: float | None
    note: str


@dataclass(frozen=True)
class PowerRow:
    """Reported power against the actual rejection rate of H1's clustered OLS test at a planted effect.

    Attributes:
        clusters: questions G.
        beta: true change in EM per point of load.
        n_runs: simulated data sets.
        actual: share of runs in which the t(G − 1) test rejects.
        power_before: power from the normal reference at the true β and the root-mean-square fitted SE.
        power_after: power from the noncentral t(G − 1) at the same β and SE.
    """

    clusters: int
    beta: float
    n_runs: int
    actual: float
    power_before: float
    power_after: float


def _rng(seed: int, *setting: float) -> np.random.Generator:
    return np.random.default_rng([seed, *(int(round(1000 * s)) % 2**32 for s in setting)])


# ------------------------------------------------------------------------------------------ "before" methods


def before_mean_ci(y: np.ndarray, codes: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """The EM interval used before: OLS intercept, cluster-robust by question, t(G − 1); Wilson if no variance.

    Args:
        y: (n,) 0/1 outcomes.
        codes: (n,) question codes.
        alpha: 1 − confidence level.

    Returns:
        (low, high), not bounded to [0, 1].
    """
    n = y.shape[0]
    if np.all(y == y[0]):
        lo, hi = proportion_confint(int(round(y.sum())), n, alpha=alpha, method="wilson")
        return float(lo), float(hi)
    res = sm.OLS(y, np.ones((n, 1))).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    ci = res.conf_int(alpha=alpha)
    return float(ci[0, 0]), float(ci[0, 1])


def _normal_p(fit: inf.ClusteredFit) -> float:
    """The p-value of the same fit on a normal reference (how the logistic fits were tested before)."""
    assert fit.estimate.value is not None and fit.estimate.se is not None, "only tests have a standard error"
    return float(2 * scipy.stats.norm.sf(abs(fit.estimate.value / fit.estimate.se)))


def _rejects(p: float | None) -> bool:
    """A test's verdict at ALPHA; a descriptive result (p None) never rejects."""
    return p is not None and p < ALPHA


# ------------------------------------------------------------------------------------------------- coverage


def em_cell(rng: np.random.Generator, clusters: int, replications: int, em: float,
            kappa: float) -> tuple[np.ndarray, np.ndarray]:
    """One simulated cell: (y, question codes), with p_q ~ Beta(em·κ, (1 − em)·κ)."""
    p = rng.beta(em * kappa, (1 - em) * kappa, size=clusters)
    y = (rng.random((clusters, replications)) < p[:, None]).astype(float).ravel()
    return y, np.repeat(np.arange(clusters), replications)


def coverage(seed: int, clusters: int, replications: int, em: float, kappa: float, n_runs: int,
             alpha: float = ALPHA) -> CoverageRow:
    """Coverage of the 1 − alpha EM interval, after and before, in one setting (module docstring).

    Args:
        seed: base seed.
        clusters: questions G.
        replications: trials per question.
        em: true mean EM.
        kappa: Beta concentration.
        n_runs: simulated data sets.
        alpha: 1 − confidence level.

    Returns:
        The :class:`CoverageRow`.
    """
    rng = _rng(seed, 1, clusters, replications, em, kappa)
    hit = hit_before = outside = 0
    width = 0.0
    for _ in range(n_runs):
        y, codes = em_cell(rng, clusters, replications, em, kappa)
        ci = inf.proportion_ci(y, codes, alpha)
        assert ci.ci_low is not None and ci.ci_high is not None
        hit += ci.ci_low <= em <= ci.ci_high
        width += ci.ci_high - ci.ci_low
        lo, hi = before_mean_ci(y, codes, alpha)
        hit_before += lo <= em <= hi
        outside += lo < 0 or hi > 1
    return CoverageRow(clusters=clusters, replications=replications, em=em, kappa=kappa, n_runs=n_runs,
                       coverage=hit / n_runs, width=width / n_runs, coverage_before=hit_before / n_runs,
                       outside_before=outside / n_runs)


def coverage_table(seed: int, n_runs: int, clusters: Sequence[int] = (7, 10, 20, 50),
                   ems: Sequence[float] = (0.1, 0.5, 0.9), replications: Sequence[int] = (2, 1, 5),
                   kappas: Sequence[float] = (2.0,)) -> list[CoverageRow]:
    """Coverage in every combination of the settings (each with its own generator; see :func:`coverage`)."""
    rows = []
    for kappa in kappas:
        for r in replications:
            for g in clusters:
                for em in ems:
                    rows.append(coverage(seed, g, r, em, kappa, n_runs))
                    log.info("coverage G=%d R=%d em=%.1f kappa=%g: %.3f", g, r, em, kappa, rows[-1].coverage)
    return rows


# ------------------------------------------------------------------------------------------------------- H1


def h1_data(rng: np.random.Generator, clusters: int, replications: int,
            beta: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Control (load 0) and Saturation (20/50/80) trials: (em, load, question codes); see the module docstring.

    With ``beta == 0`` the null DGP (question-specific slopes with mean zero); otherwise the power DGP.
    """
    loads = np.array([0, *LOADS], dtype=float)
    x = np.tile(np.repeat(loads, replications), clusters)
    codes = np.repeat(np.arange(clusters), loads.size * replications)
    if beta == 0.0:
        p0 = rng.beta(1.0, 1.0, size=clusters)
        slope = rng.uniform(-1, 1, size=clusters) * np.minimum(p0, 1 - p0) / 2
        p = p0[codes] + slope[codes] * (x - 40) / 40
    else:
        p = rng.uniform(0.4, 0.9, size=clusters)[codes] + beta * x
    return (rng.random(x.size) < p).astype(float), x, codes


def null_h1(seed: int, clusters: int, n_runs: int, replications: int = 2,
            min_clusters: int = inf.MIN_CLUSTERS) -> list[RejectionRow]:
    """H1's OLS and logistic trend tests under no load effect (question-specific slopes with mean zero)."""
    rng = _rng(seed, 2, clusters, replications)
    counts = dict.fromkeys(["ols_cr1", "ols_cr2", "logit_z", "logit_cr1", "logit_cr2"], 0)
    n_ols = n_logit = 0
    for _ in range(n_runs):
        y, x, codes = h1_data(rng, clusters, replications)
        X = sm.add_constant(x)
        o1 = inf.clustered_ols(y, X, codes, vcov="CR1", min_clusters=min_clusters)
        o2 = inf.clustered_ols(y, X, codes, min_clusters=min_clusters)
        if o1.is_test and o2.is_test:
            n_ols += 1
            counts["ols_cr1"] += _rejects(o1.estimate.p)
            counts["ols_cr2"] += _rejects(o2.estimate.p)
        l1 = glm.clustered_logit(y, X, codes, vcov="CR1", min_clusters=min_clusters)
        l2 = glm.clustered_logit(y, X, codes, min_clusters=min_clusters)
        if l1.is_test and l2.is_test:
            n_logit += 1
            counts["logit_z"] += _normal_p(l1) < ALPHA
            counts["logit_cr1"] += _rejects(l1.estimate.p)
            counts["logit_cr2"] += _rejects(l2.estimate.p)
    n_ols, n_logit = max(n_ols, 1), max(n_logit, 1)
    return [
        RejectionRow("H1 linear probability model", clusters, n_runs, "test", counts["ols_cr1"] / n_ols,
                     counts["ols_cr1"] / n_ols, counts["ols_cr2"] / n_ols, "before CR1 t(G-1), after CR2 BM df"),
        RejectionRow("H1 logistic GLM", clusters, n_runs, "test", counts["logit_z"] / n_logit,
                     counts["logit_cr1"] / n_logit, counts["logit_cr2"] / n_logit,
                     "before CR1 normal reference, after CR2 BM df"),
    ]


def power_h1(seed: int, clusters: int, n_runs: int, beta: float = -0.004, replications: int = 2) -> PowerRow:
    """Reported power (normal vs noncentral t) against the actual rejection rate at a planted H1 effect."""
    rng = _rng(seed, 3, clusters, replications, beta)
    hits = 0
    ses: list[float] = []
    dfs: list[float] = []
    for _ in range(n_runs):
        y, x, codes = h1_data(rng, clusters, replications, beta)
        fit = inf.clustered_ols(y, sm.add_constant(x), codes)
        hits += _rejects(fit.estimate.p)
        if fit.estimate.se is not None and fit.estimate.df is not None:
            ses.append(fit.estimate.se)
            dfs.append(fit.estimate.df)
    se = float(np.sqrt(np.mean(np.square(ses))))
    n = clusters * (1 + len(LOADS)) * replications
    before = NormalIndPower().power(effect_size=abs(beta) / se / math.sqrt(n), nobs1=n, alpha=ALPHA, ratio=0)
    after = inf.t_power(beta, se, float(np.mean(dfs)), ALPHA).power
    return PowerRow(clusters=clusters, beta=beta, n_runs=n_runs, actual=hits / n_runs, power_before=float(before),
                    power_after=float(after or 0.0))


# ------------------------------------------------------------------------------------------------------- H2


def h2_cells(rng: np.random.Generator, clusters: int, replications: int,
             tau: float = 1.0) -> dict[tuple[str, int], np.ndarray]:
    """EM of every (condition, load) cell of one model: (clusters, replications) arrays, null DGP of H2."""
    a = rng.normal(0.0, 1.5, size=clusters)
    cells = [("Control", 0)] + [(c, ld) for c in ("LongControl", "Saturation", "Residue") for ld in LOADS]
    out = {}
    for cell in cells:
        p = 1 / (1 + np.exp(-(a + tau * rng.normal(size=clusters))))
        out[cell] = (rng.random((clusters, replications)) < p[:, None]).astype(float)
    return out


def h2_pairs(cells: dict[tuple[str, int], np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 12 comparisons of one model's H2 family, as (em_a, em_b) arrays of shape (clusters, replications)."""
    pairs = []
    for ld in LOADS:
        pairs.append((cells[("LongControl", ld)], cells[("Control", 0)]))
        pairs.append((cells[("Saturation", ld)], cells[("LongControl", ld)]))
        pairs.append((cells[("Residue", ld)], cells[("Control", 0)]))
        pairs.append((cells[("Residue", ld)], cells[("Saturation", ld)]))
    return pairs


def null_h2(seed: int, clusters: int, n_runs: int, replications: int = 2, tau: float = 1.0,
            n_resamples: int = 1999) -> list[RejectionRow]:
    """H2's 12 paired tests per model under exchangeable conditions with question-varying effects."""
    rng = _rng(seed, 4, clusters, replications, tau)
    before = after = fw_before = fw_after = 0
    for run in range(n_runs):
        cells = h2_cells(rng, clusters, replications, tau)
        p_mc, p_sf = [], []
        for i, (a, b) in enumerate(h2_pairs(cells)):
            codes = np.repeat(np.arange(clusters), replications)
            test = inf.paired_sign_flip(a.ravel(), b.ravel(), codes, n_resamples=n_resamples, seed=run * 100 + i)
            p_sf.append(np.nan if test.p is None else test.p)
            assert test.mcnemar is not None
            p_mc.append(test.mcnemar.p)
        p_mc_arr, p_sf_arr = np.array(p_mc), np.array(p_sf)
        before += int(np.sum(p_mc_arr < ALPHA))
        after += int(np.sum(np.nan_to_num(p_sf_arr, nan=1.0) < ALPHA))
        fw_before += bool(np.any(p_mc_arr < ALPHA))
        fw_after += bool(np.any(np.nan_to_num(inf.bh_qvalues(p_sf_arr), nan=1.0) < ALPHA))
    n_tests = n_runs * H2_FAMILY
    return [
        RejectionRow("H2 paired test", clusters, n_runs, "test", before / n_tests, None, after / n_tests,
                     f"before exact McNemar on (question, replication) pairs, after question-level sign-flip "
                     f"(tau={tau:g})"),
        RejectionRow("H2 family of 12 (any rejection)", clusters, n_runs, "family", fw_before / n_runs, None,
                     fw_after / n_runs, "before uncorrected McNemar, after BH q < 0.05 on the sign-flip tests"),
    ]


# ------------------------------------------------------------------------------------------------ attention


def attention_data(rng: np.random.Generator, clusters: int, replications: int, n_layers: int,
                   n_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Saturation and Residue trials: (enrichment (trial, layer, head), failed, load, is_residue, codes)."""
    per_q = 2 * len(LOADS) * replications
    n = clusters * per_q
    codes = np.repeat(np.arange(clusters), per_q)
    residue = np.tile(np.repeat([0.0, 1.0], len(LOADS) * replications), clusters)
    load = np.tile(np.repeat(np.array(LOADS * 2, dtype=float), replications), clusters)
    failed = rng.random(n) < (1 - rng.beta(1.0, 1.0, size=clusters))[codes]
    s = 0.1
    q_eff = (s * rng.normal(size=(clusters, 1, 1)) + s * rng.normal(size=(clusters, n_layers, 1))
             + s * rng.normal(size=(clusters, n_layers, n_heads)))[codes]
    t_eff = (s * rng.normal(size=(n, 1, 1)) + s * rng.normal(size=(n, n_layers, 1))
             + s * rng.normal(size=(n, n_layers, n_heads)))
    values = 1.0 + 0.3 * load[:, None, None] / 100 - 0.1 * residue[:, None, None] + q_eff + t_eff
    return values, failed, load, residue, codes


def null_layers(seed: int, clusters: int, n_runs: int, replications: int = 2, n_layers: int = 30,
                n_heads: int = 9, min_clusters: int = inf.MIN_CLUSTERS) -> list[RejectionRow]:
    """Per-layer attention ↔ failure tests under no link: logistic (normal, CR1 t, CR2) and the OLS difference."""
    rng = _rng(seed, 5, clusters, replications, n_layers)
    c = dict.fromkeys(["z", "t1", "t2", "za", "t1a", "t2a", "o1", "o2", "fw_before", "fw_cr1", "fw_after"], 0)
    n_logit = n_logit_adj = 0
    for _ in range(n_runs):
        values, failed, load, residue, codes = attention_data(rng, clusters, replications, n_layers, n_heads)
        layer = values.mean(axis=2)  # (trial, layer)
        y = failed.astype(float)
        p_before = []
        for li in range(n_layers):
            x = layer[:, li]
            for X, adj in ((sm.add_constant(x), ""), (np.column_stack([np.ones_like(x), x, load, residue]), "a")):
                f1 = glm.clustered_logit(y, X, codes, vcov="CR1", min_clusters=min_clusters)
                f2 = glm.clustered_logit(y, X, codes, min_clusters=min_clusters)
                if not (f1.is_test and f2.is_test):
                    continue
                if adj:
                    n_logit_adj += 1
                else:
                    n_logit += 1
                    p_before.append(_normal_p(f1))
                c["z" + adj] += _normal_p(f1) < ALPHA
                c["t1" + adj] += _rejects(f1.estimate.p)
                c["t2" + adj] += _rejects(f2.estimate.p)
        r1 = att.attention_failure_tests(layer, failed, load, codes, covariates=residue[:, None], vcov="CR1",
                                         min_clusters=min_clusters)
        r2 = att.attention_failure_tests(layer, failed, load, codes, covariates=residue[:, None],
                                         min_clusters=min_clusters)
        c["o1"] += int(np.sum(np.nan_to_num(r1.p, nan=1.0) < ALPHA))
        c["o2"] += int(np.sum(np.nan_to_num(r2.p, nan=1.0) < ALPHA))
        c["fw_before"] += bool(p_before) and bool(np.any(multipletests(p_before, alpha=ALPHA, method="holm")[0]))
        c["fw_cr1"] += r1.significant(ALPHA).shape[0] > 0
        c["fw_after"] += r2.significant(ALPHA).shape[0] > 0
    n_logit, n_logit_adj, n_ols = max(n_logit, 1), max(n_logit_adj, 1), n_runs * n_layers
    return [
        RejectionRow("per-layer logistic, failure on P_ext", clusters, n_runs, "test", c["z"] / n_logit,
                     c["t1"] / n_logit, c["t2"] / n_logit, "before CR1 normal reference, after CR2 BM df"),
        RejectionRow("per-layer logistic, adjusted for load and Residue", clusters, n_runs, "test",
                     c["za"] / n_logit_adj, c["t1a"] / n_logit_adj, c["t2a"] / n_logit_adj,
                     "before CR1 normal reference, after CR2 BM df"),
        RejectionRow("per-layer P_ext failed - correct (OLS, adjusted)", clusters, n_runs, "test", None,
                     c["o1"] / n_ols, c["o2"] / n_ols, "new: attention_failure_tests, after CR2 BM df"),
        RejectionRow(f"per-layer family of {n_layers} (any layer named)", clusters, n_runs, "family",
                     c["fw_before"] / n_runs, c["fw_cr1"] / n_runs, c["fw_after"] / n_runs,
                     "before Holm on normal-reference logistic; CR1 and after: BH q < 0.05 on "
                     "attention_failure_tests"),
    ]


def null_heads(seed: int, clusters: int, n_runs: int, replications: int = 2, n_layers: int = 30, n_heads: int = 9,
               min_clusters: int = inf.MIN_CLUSTERS) -> list[RejectionRow]:
    """The per-head failed − correct enrichment test over the layer × head grid under no link."""
    rng = _rng(seed, 6, clusters, replications, n_layers, n_heads)
    rej = dict.fromkeys(["CR1", "CR2"], 0)
    fw = dict.fromkeys(["CR1", "CR2"], 0)
    for _ in range(n_runs):
        values, failed, load, residue, codes = attention_data(rng, clusters, replications, n_layers, n_heads)
        for vcov in ("CR1", "CR2"):
            res = att.attention_failure_tests(values, failed, load, codes, covariates=residue[:, None],
                                              vcov=vcov, min_clusters=min_clusters)
            rej[vcov] += int(np.sum(np.nan_to_num(res.p, nan=1.0) < ALPHA))
            fw[vcov] += res.significant(ALPHA).shape[0] > 0
    grid = n_layers * n_heads
    return [
        RejectionRow("per-head enrichment failed - correct", clusters, n_runs, "test", None,
                     rej["CR1"] / (n_runs * grid), rej["CR2"] / (n_runs * grid),
                     "new: adjusted for load and Residue, after CR2 BM df"),
        RejectionRow(f"per-head family of {grid} (any head named)", clusters, n_runs, "family", None,
                     fw["CR1"] / n_runs, fw["CR2"] / n_runs, "new: BH q < 0.05 across the layer x head grid"),
    ]


def null_residue_similarity(seed: int, clusters: int, n_runs: int, replications: int = 2, n_layers: int = 30,
                            min_clusters: int = inf.MIN_CLUSTERS) -> list[RejectionRow]:
    """H3 in attention: per-layer slope of AR_k on S_sim under no link."""
    rng = _rng(seed, 7, clusters, replications, n_layers)
    per_q = len(LOADS) * replications
    codes = np.repeat(np.arange(clusters), per_q)
    load = np.tile(np.repeat(np.array(LOADS, dtype=float), replications), clusters)
    n = codes.size
    rej = dict.fromkeys(["CR1", "CR2"], 0)
    fw = dict.fromkeys(["CR1", "CR2"], 0)
    for _ in range(n_runs):
        s_sim = 0.3 + 0.1 * rng.normal(size=clusters)[codes] + 0.03 * rng.normal(size=n)
        ar = (0.2 + 0.1 * load[:, None] / 100 + 0.05 * rng.normal(size=(clusters, 1))[codes]
              + 0.05 * rng.normal(size=(clusters, n_layers))[codes] + 0.05 * rng.normal(size=(n, 1))
              + 0.05 * rng.normal(size=(n, n_layers)))
        for vcov in ("CR1", "CR2"):
            res = att.residue_similarity_tests(ar, s_sim, codes, load, vcov=vcov, min_clusters=min_clusters).fits
            rej[vcov] += int(np.sum(np.nan_to_num(res.p, nan=1.0) < ALPHA))
            fw[vcov] += res.significant(ALPHA).shape[0] > 0
    return [
        RejectionRow("H3 in attention: AR_k on S_sim per layer", clusters, n_runs, "test", None,
                     rej["CR1"] / (n_runs * n_layers), rej["CR2"] / (n_runs * n_layers),
                     "new: adjusted for load, after CR2 BM df"),
        RejectionRow(f"H3 in attention, family of {n_layers} layers", clusters, n_runs, "family", None,
                     fw["CR1"] / n_runs, fw["CR2"] / n_runs, "new: BH q < 0.05 across layers"),
    ]


def _before_many(values: np.ndarray, X: np.ndarray, codes: np.ndarray, n_clusters: int, term: int = 1) -> np.ndarray:
    """p-values of the per-outcome CR2 test as it was before the contrast rule: the CR2 pseudo-inverse (which drops
    a direction that one cluster alone carries) with Bell–McCaffrey df, G counted over all questions."""
    Yf = values.reshape(values.shape[0], -1)
    beta = np.linalg.lstsq(X, Yf, rcond=None)[0]
    w, dof = inf.sandwich_weights(X, codes, n_clusters, term, "CR2", on_degenerate="drop")
    resid = Yf - X @ beta
    onehot = np.zeros((n_clusters, X.shape[0]))
    onehot[codes, np.arange(X.shape[0])] = 1.0
    se = np.sqrt(np.sum((onehot @ (w[:, None] * resid)) ** 2, axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2 * scipy.stats.t.sf(np.abs(beta[term] / se), dof)


def one_question_data(rng: np.random.Generator, clusters: int, per_question: int = 16, n_layers: int = 30,
                      n_heads: int = 9) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every failure falls in question 0 (half its trials); attention is noise plus question effects, no link.

    Returns:
        (values (trial, layer, head), failed, load, codes).
    """
    codes = np.repeat(np.arange(clusters), per_question)
    n = codes.size
    failed = (codes == 0) & (np.arange(n) % 2 == 0)
    load = np.tile(np.array([20.0, 50.0, 80.0, 20.0]), n // 4)
    s = 0.1
    values = (1.0 + 0.3 * load[:, None, None] / 100 + s * rng.normal(size=(clusters, n_layers, n_heads))[codes]
              + s * rng.normal(size=(n, n_layers, n_heads)))
    return values, failed, load, codes


def null_one_question(seed: int, clusters: int, n_runs: int, n_layers: int = 30,
                      n_heads: int = 9) -> list[RejectionRow]:
    """The per-head failed − correct test when one question carries every failure (issue of false discoveries)."""
    rng = _rng(seed, 9, clusters, n_layers, n_heads)
    rej = dict.fromkeys(["before", "CR1", "CR2"], 0)
    fw = dict.fromkeys(["before", "CR1", "CR2"], 0)
    grid = n_layers * n_heads
    for _ in range(n_runs):
        values, failed, load, codes = one_question_data(rng, clusters, n_layers=n_layers, n_heads=n_heads)
        X = np.column_stack([np.ones(codes.size), failed, load])
        p_before = _before_many(values, X, codes, clusters)
        rej["before"] += int(np.sum(np.nan_to_num(p_before, nan=1.0) < ALPHA))
        fw["before"] += bool(np.any(np.nan_to_num(inf.bh_qvalues(p_before), nan=1.0) < ALPHA))
        for vcov in ("CR1", "CR2"):
            res = att.attention_failure_tests(values, failed, load, codes, vcov=vcov)
            rej[vcov] += int(np.sum(np.nan_to_num(res.p, nan=1.0) < ALPHA))
            fw[vcov] += res.significant(ALPHA).shape[0] > 0
    return [
        RejectionRow("per-head failed - correct, every failure in one question", clusters, n_runs, "test",
                     rej["before"] / (n_runs * grid), rej["CR1"] / (n_runs * grid), rej["CR2"] / (n_runs * grid),
                     "before CR2 BM df counting all questions; after: 1 question carries the contrast, descriptive"),
        RejectionRow(f"per-head family of {grid}, every failure in one question", clusters, n_runs, "family",
                     fw["before"] / n_runs, fw["CR1"] / n_runs, fw["CR2"] / n_runs,
                     "BH q < 0.05 across the grid"),
    ]


# ------------------------------------------------------------------------------------------------------- H3


def null_h3(seed: int, n_questions: int, n_runs: int, min_n: int = inf.MIN_CLUSTERS) -> list[RejectionRow]:
    """H3's correlation test under independence: Pearson t-test p (before) and Fisher-z p (after).

    Below the minimum of 6 questions the test is descriptive; ``min_n=4`` forces it (the below-minimum table)."""
    rng = _rng(seed, 8, n_questions)
    before = after = disagree = 0
    done = 0
    for _ in range(n_runs):
        s_sim = rng.normal(0.3, 0.1, size=n_questions)
        p = rng.beta(1.0, 1.0, size=n_questions)
        control = (rng.random((n_questions, 2)) < p[:, None]).mean(axis=1)
        residue = (rng.random((n_questions, 6)) < 0.8 * p[:, None]).mean(axis=1)
        res = inf.similarity_correlation(s_sim, control - residue, min_n=min_n).estimate
        if not res.is_test:
            continue
        done += 1
        p_t = float(scipy.stats.pearsonr(s_sim, control - residue).pvalue)
        before += p_t < ALPHA
        assert res.ci_low is not None and res.ci_high is not None
        after += _rejects(res.p)
        disagree += (p_t < ALPHA) != (res.ci_low > 0 or res.ci_high < 0)
    done = max(done, 1)
    return [
        RejectionRow("H3 Pearson r (S_sim vs degradation)", n_questions, n_runs, "test", before / done, None,
                     after / done,
                     f"before t-test p (disagrees with its Fisher CI in {disagree / done:.1%} of runs), "
                     f"after Fisher-z p (never disagrees)"),
    ]


# ------------------------------------------------------------------------------ intervention: recovered share


@dataclass(frozen=True)
class ShareCoverageRow:
    """Simulated coverage of the recovered share's interval at one number of questions.

    Attributes:
        n_questions: G.
        n_runs: simulated studies.
        true_share: the share the simulation plants.
        method: ``analysis`` (Fieller's t interval, widened to reach 0 where the numerator's exact sign-flip test does
            not reject 0), ``fieller`` (Fieller's t interval alone, used before) or ``delta`` (R ± t·SE on t(G − 1),
            SE = sd(num − R·den) / (√G·|mean den|), for comparison).
        coverage: among the studies where the share is defined, the share whose confidence set (bounded or not)
            holds the true share.
        bounded: among those, the share with a bounded interval (the loss distinguishable from 0).
        coverage_bounded: coverage among the bounded intervals.
        undefined: share of all studies where the share was undefined (EM_Control ≤ EM_base).
        disagree: share of the defined studies whose interval excludes 0 while the numerator's sign-flip test has
            p ≥ α.
    """

    n_questions: int
    n_runs: int
    true_share: float
    method: str
    coverage: float
    bounded: float
    coverage_bounded: float | None
    undefined: float
    disagree: float


def recovered_share_coverage(seed: int, n_questions: int, n_runs: int, replications: int = 2,
                             em_control: float = 0.8, em_base: float = 0.4, share: float = 0.5,
                             kappa: float = 2.0, alpha: float = ALPHA,
                             method: Literal["analysis", "fieller", "delta"] = "analysis") -> ShareCoverageRow:
    """Coverage of the recovered share's interval by seeded simulation.

    Data: question q has Control success probability c_q ~ Beta(μ_C κ, (1 − μ_C) κ), a loss under the distractors
    ℓ_q = c_q·(1 − em_base / em_control) (so E base = em_base), and under the intervention it gets back ``share``
    of its loss: p_int,q = c_q − (1 − share)·ℓ_q; each of its ``replications`` prompts is Bernoulli(p) at Control,
    baseline and (the same prompt) intervention, the baseline and intervened trials of a prompt sharing one uniform
    draw (a paired design, as one model answering the same prompt). The planted share is ``share`` for every
    question.

    Args:
        seed: seed (the generator is ``default_rng([seed, n_questions])``).
        n_questions: G.
        n_runs: simulated studies.
        replications: prompts per question and condition.
        em_control, em_base, share: the planted means.
        kappa: Beta concentration (intra-question correlation 1 / (κ + 1)).
        alpha: 1 − confidence level.
        method: ``analysis``, ``fieller`` or ``delta`` (see :class:`ShareCoverageRow`).
    """
    rng = np.random.default_rng([seed, n_questions])
    covered = bounded = cov_b = undefined = disagree = 0
    for _ in range(n_runs):
        c = rng.beta(em_control * kappa, (1 - em_control) * kappa, n_questions)
        loss = c * (1 - em_base / em_control)
        p_base, p_int = c - loss, c - (1 - share) * loss
        u = rng.random((n_questions, replications))
        yb, yi = (u < p_base[:, None]).mean(1), (u < p_int[:, None]).mean(1)
        yc = (rng.random((n_questions, replications)) < c[:, None]).mean(1)
        r = recovered_share(yi, yb, yc, alpha, seed=seed)
        est = r.estimate.value
        if est is None:
            undefined += 1
            continue
        num, den = yi - yb, yc - yb
        ci: tuple[float, float] | None
        if method == "analysis":
            ci = None if r.estimate.ci_low is None else (r.estimate.ci_low, r.estimate.ci_high or 0.0)
            qa, qb, qc = fieller_quadratic(num, den, alpha)
            widened = ci is not None and ci[0] <= share <= ci[1]
            hit = widened or qa * share**2 + qb * share + qc <= 0  # Fieller's set, bounded or not, and the widening
        elif method == "fieller":
            qa, qb, qc = fieller_quadratic(num, den, alpha)
            hit = qa * share**2 + qb * share + qc <= 0  # the truth is in Fieller's set, bounded or not
            ci = fieller_interval(num, den, alpha)
        else:
            z = num - est * den
            half = float(scipy.stats.t.ppf(1 - alpha / 2, n_questions - 1)) * float(np.std(z, ddof=1)) / (
                math.sqrt(n_questions) * abs(r.denominator or 0.0))
            hit = abs(est - share) <= half
            ci = (est - half, est + half)
        covered += hit
        if ci is not None:
            bounded += 1
            cov_b += ci[0] <= share <= ci[1]
            disagree += bool((ci[0] > 0 or ci[1] < 0) and sign_flip_p(num, seed) >= alpha)
    defined = n_runs - undefined
    return ShareCoverageRow(n_questions=n_questions, n_runs=n_runs, true_share=share, method=method,
                            coverage=covered / defined if defined else float("nan"),
                            bounded=bounded / defined if defined else float("nan"),
                            coverage_bounded=cov_b / bounded if bounded else None,
                            undefined=undefined / n_runs, disagree=disagree / defined if defined else float("nan"))


# ----------------------------------------------------------------------- intervention: the paired difference


@dataclass(frozen=True)
class CarrierCoverageRow:
    """The paired difference's interval (and the recovered share's) when a few questions carry the change.

    Attributes:
        n_questions: G.
        n_carriers: questions whose EM changes under the intervention (the others answer alike under both).
        n_runs: simulated studies.
        before: coverage of the CR2 t interval of the mean per-question difference, given in every study.
        after_given: share of studies in which the analysis gives the interval (6 or more questions with a
            non-zero mean difference).
        after: coverage among those.
        disagree_before: share of studies whose interval (before) excludes 0 while the sign-flip p ≥ α.
        disagree_after: the same for the interval the analysis gives (over all studies).
        share_disagree_before, share_disagree_after: the same for the recovered share's interval against the
            numerator's sign-flip p (before: Fieller's t interval; after: the sign-flip interval the analysis gives).
    """

    n_questions: int
    n_carriers: int
    n_runs: int
    before: float
    after_given: float
    after: float | None
    disagree_before: float
    disagree_after: float
    share_disagree_before: float
    share_disagree_after: float


def carrier_coverage(seed: int, n_questions: int, n_carriers: int, n_runs: int, replications: int = 2,
                     alpha: float = ALPHA) -> CarrierCoverageRow:
    """Coverage of the paired difference's interval when ``n_carriers`` of ``n_questions`` questions carry it.

    Data: each question's baseline probability p_q ~ U(0.2, 0.6); a carrier's intervention raises it by
    δ_q ~ U(0.2, 0.4), the others' not at all; each of its ``replications`` prompts is one uniform draw u, correct
    under the baseline when u < p_q and under the intervention when u < p_q + δ_q (one model answering one prompt
    twice, as in a run), and correct under Control with probability p_q + 0.4. The true difference is
    ``n_carriers`` / G × 0.3 (questions that do not carry it contribute exact zeros).
    """
    from probe.analysis.paired_ratio import paired_difference

    rng = np.random.default_rng([seed, n_questions, n_carriers])
    truth = n_carriers / n_questions * 0.3
    hit_before = given = hit_after = dis_before = dis_after = share_before = share_after = 0
    ids = np.repeat(np.arange(n_questions), replications)
    for _ in range(n_runs):
        p = rng.uniform(0.2, 0.6, n_questions)
        delta = np.zeros(n_questions)
        delta[:n_carriers] = rng.uniform(0.2, 0.4, n_carriers)
        u = rng.random((n_questions, replications))
        base, inter = (u < p[:, None]).astype(float), (u < (p + delta)[:, None]).astype(float)
        control = (rng.random((n_questions, replications)) < (p + 0.4)[:, None]).astype(float)
        r = paired_difference(inter.ravel(), base.ravel(), ids, alpha=alpha, seed=seed)
        d = inter.mean(1) - base.mean(1)
        fit = inf.clustered_ols(d, np.ones((n_questions, 1)), np.arange(n_questions), term=0, alpha=alpha).estimate
        given_before = fit.ci_low is not None and fit.ci_high is not None
        lo, hi = (max(-1.0, fit.ci_low or 0.0), min(1.0, fit.ci_high or 0.0)) if given_before else (0.0, 0.0)
        hit_before += lo <= truth <= hi
        no_test = r.estimate.p is None or r.estimate.p >= alpha
        dis_before += bool(given_before and (lo > 0 or hi < 0) and no_test)
        e = r.estimate
        if e.ci_low is not None and e.ci_high is not None:
            given += 1
            hit_after += e.ci_low <= truth <= e.ci_high
            dis_after += bool((e.ci_low > 0 or e.ci_high < 0) and no_test)
        yi, yb, yc = inter.mean(1), base.mean(1), control.mean(1)
        after = recovered_share(yi, yb, yc, alpha, seed=seed)
        ci = None if after.denominator is None or after.denominator <= 0 else \
            fieller_interval(yi - yb, yc - yb, alpha)
        share_before += bool(ci is not None and (ci[0] > 0 or ci[1] < 0) and no_test)
        lo_s, hi_s = after.estimate.ci_low, after.estimate.ci_high
        share_after += bool(lo_s is not None and hi_s is not None and (lo_s > 0 or hi_s < 0) and no_test)
    return CarrierCoverageRow(n_questions=n_questions, n_carriers=n_carriers, n_runs=n_runs,
                              before=hit_before / n_runs, after_given=given / n_runs,
                              after=hit_after / given if given else None, disagree_before=dis_before / n_runs,
                              disagree_after=dis_after / n_runs, share_disagree_before=share_before / n_runs,
                              share_disagree_after=share_after / n_runs)


@dataclass(frozen=True)
class EquivalenceRow:
    """How often the TOST declares equivalence within ±margin in one design."""

    n_questions: int
    design: str
    margin: float
    truth: float
    n_runs: int
    equivalent: float  # share of runs with TOST p < alpha
    no_test: float  # share of runs where the TOST is not run (too few questions carry a difference)


EQUIVALENCE_DESIGNS = ("other prompts, at +δ", "same prompt, at +δ", "3 questions carry +δ",
                       "other prompts, no difference")


def equivalence_rates(seed: int, n_questions: int, design: str, n_runs: int, margin: float = 0.10,
                      replications: int = 2, alpha: float = ALPHA) -> EquivalenceRow:
    """The TOST of :func:`probe.analysis.paired_ratio.paired_equivalence` in one design (docs/statistics.md).

    Data: each question's EM probability under ``b`` is p_q ~ U(0.3, 0.6); under ``a`` it is p_q + Δ_q, with mean
    Δ over questions the row's truth (δ, or 0). "Other prompts": a and b are different prompts of the question (two
    conditions), each replication an independent Bernoulli draw. "Same prompt": a and b are one prompt with and
    without an intervention: one uniform u per replication, correct under b when u < p_q and under a when
    u < p_q + Δ_q, so a question differs only where u falls between. "3 questions carry +δ": Δ_q = δ·G/3 on three
    questions (p_q ~ U(0, 1 − δ·G/3) there), 0 elsewhere, other prompts. At Δ = δ the rate of declared equivalence is
    the TOST's error rate, which must stay at or below α; at Δ = 0 it is its power.
    """
    from probe.analysis.paired_ratio import paired_equivalence

    rng = np.random.default_rng([seed, n_questions, EQUIVALENCE_DESIGNS.index(design), round(margin * 100)])
    truth = 0.0 if design == "other prompts, no difference" else margin
    ids = np.repeat(np.arange(n_questions), replications)
    eq = none = 0
    for _ in range(n_runs):
        p = rng.uniform(0.3, 0.6, n_questions)
        delta = np.full(n_questions, truth)
        if design == "3 questions carry +δ":
            lift = min(margin * n_questions / 3, 1.0)
            p[:3] = rng.uniform(0.0, 1.0 - lift, 3)
            delta[:] = 0.0
            delta[:3] = lift
        pa = p + delta
        if design == "same prompt, at +δ":
            u = rng.random((n_questions, replications))
            a, b = (u < pa[:, None]).astype(float), (u < p[:, None]).astype(float)
        else:
            a = (rng.random((n_questions, replications)) < pa[:, None]).astype(float)
            b = (rng.random((n_questions, replications)) < p[:, None]).astype(float)
        e = paired_equivalence(a.ravel(), b.ravel(), ids, margin, alpha)
        eq += e.holds(alpha)
        none += e.estimate.p is None
    return EquivalenceRow(n_questions, design, margin, truth, n_runs, eq / n_runs, none / n_runs)


def equivalence_table(seed: int, n_runs: int, clusters: Sequence[int] = (7, 10, 20, 50, 100),
                      margins: Sequence[float] = (0.10, 0.25)) -> str:
    """The TOST's error rate at the margin and its power, per margin, G and design (docs/statistics.md)."""
    lines = ["| δ | G | design | true Δ | equivalent declared | no TOST (< 6 questions differ) |",
             "|---|---|---|---|---|---|"]
    for m in margins:
        for g in clusters:
            for design in EQUIVALENCE_DESIGNS:
                if design == "3 questions carry +δ" and m * g / 3 > 1:
                    continue  # three questions cannot carry a mean of δ
                r = equivalence_rates(seed, g, design, n_runs, margin=m)
                lines.append(f"| {m:.2f} | {g} | {design} | {r.truth:+.2f} | {r.equivalent:.3f} | {r.no_test:.3f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class StudyDesignRow:
    """The paired comparison of a study with one replication (d_q in {-1, 0, 1}): how often each verdict comes."""

    n_questions: int
    discordance: float  # the share of questions whose two prompts are scored differently
    margin: float
    truth: float
    n_runs: int
    equivalent: float  # TOST rejects: equivalent within ±margin
    different: float  # the sign-flip difference test rejects
    no_test: float  # fewer than 6 questions differ: no TOST


def study_design_rates(seed: int, n_questions: int, discordance: float, margin: float, truth: float, n_runs: int,
                       alpha: float = ALPHA) -> StudyDesignRow:
    """Verdicts of a paired comparison in the design a confirmatory study runs (docs/statistics.md): one prompt per
    question and condition, so d_q = EM_a − EM_b is −1, 0 or +1. Each question is discordant with probability
    ``discordance``; a discordant one is +1 with probability 1/2 + truth / (2 · discordance), so the mean of d_q is
    ``truth``. Per data set: the TOST of :func:`probe.analysis.paired_ratio.paired_equivalence` (for one 0/1 pair
    per question the paired-proportions score TOST, no gate) and H2's sign-flip test, whose exact p for d_q in {−1, 0, 1} is the two-sided binomial
    test of the discordant questions' signs (:func:`probe.analysis.inference.paired_sign_flip` reaches it by
    enumeration up to 16 questions and by Monte Carlo flips above)."""
    from probe.analysis.paired_ratio import paired_equivalence

    rng = np.random.default_rng([seed, n_questions, round(discordance * 100), round(margin * 100),
                                 round(truth * 100) + 100])
    up = 0.5 + truth / (2 * discordance)
    ids = np.arange(n_questions)
    eq = diff = none = 0
    for _ in range(n_runs):
        split = rng.random(n_questions) < discordance
        plus = rng.random(n_questions) < up
        a = np.where(split & plus, 1.0, 0.0)  # discordant +1: a right, b wrong; -1: the reverse
        b = np.where(split & ~plus, 1.0, 0.0)
        concordant_right = ~split & (rng.random(n_questions) < 0.5)  # concordant pairs: both right or both wrong
        a[concordant_right] = b[concordant_right] = 1.0
        e = paired_equivalence(a, b, ids, margin, alpha)
        eq += e.holds(alpha)
        none += e.estimate.p is None
        d = a - b
        k = int(np.count_nonzero(d))
        diff += k > 0 and scipy.stats.binomtest(int(np.sum(d > 0)), k, 0.5).pvalue < alpha
    return StudyDesignRow(n_questions, discordance, margin, truth, n_runs, eq / n_runs, diff / n_runs, none / n_runs)


def study_design_table(seed: int, n_runs: int, clusters: Sequence[int] = (20, 47, 70, 140),
                       discordances: Sequence[float] = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4),
                       margins: Sequence[float] = (0.10, 0.11, 0.12, 0.125, 0.15, 0.20)) -> str:
    """Power of the TOST (true Δ = 0) and its error rate at the margin (true Δ = +δ), with the difference test's
    rejection rate beside them, in the one-replication design (docs/statistics.md)."""
    lines = ["| G | discordant share | δ | true Δ | equivalent declared | different declared | no TOST |",
             "|---|---|---|---|---|---|---|"]
    for g in clusters:
        for f in discordances:
            for m in margins:
                for truth in (0.0, m):
                    if truth / f > 1:
                        continue
                    r = study_design_rates(seed, g, f, m, truth, n_runs)
                    lines.append(f"| {g} | {f:.2g} | {m:.3g} | {truth:+.3g} | {r.equivalent:.3f} | {r.different:.3f} "
                                 f"| {r.no_test:.3f} |")
    return "\n".join(lines)


def null_writing(seed: int, clusters: int, n_runs: int, replications: int = 2, n_cells: int = 6,
                 n_resamples: int = 1999) -> list[RejectionRow]:
    """What the model wrote: the four writing measures of ``n_cells`` cells against Control, under exchangeable
    conditions (module docstring), per test and as the model's BH family."""
    rng = _rng(seed, 9, clusters, replications, n_cells)
    measures = ("tokens", "one_sentence", "restates_last", "restates_first")
    rejected = {m: 0 for m in measures}
    family = 0
    codes = np.repeat(np.arange(clusters), replications)
    for run in range(n_runs):
        base = rng.normal(4.0, 0.8, clusters)  # log tokens of each question
        share = rng.beta(0.5, 0.5, (3, clusters))  # one-sentence, restates-last, restates-first per question
        def draw() -> dict[str, np.ndarray]:
            tokens = np.exp(base[codes] + rng.normal(0.0, 0.6, codes.size))
            return {"tokens": np.round(tokens), **{m: (rng.random(codes.size) < share[i][codes]).astype(float)
                                                   for i, m in enumerate(measures[1:])}}
        control = draw()
        ps = []
        for c in range(n_cells):
            cell = draw()
            for m in measures:
                t = inf.paired_sign_flip(cell[m], control[m], codes, n_resamples=n_resamples, seed=run * 100 + c)
                p = np.nan if t.p is None else t.p
                ps.append(p)
                rejected[m] += c == 0 and _rejects(t.p)
        family += bool(np.any(np.nan_to_num(inf.bh_qvalues(np.array(ps)), nan=1.0) < ALPHA))
    rows = [RejectionRow(f"writing: {m}", clusters, n_runs, "test", None, None, rejected[m] / n_runs,
                         "sign-flip test of the per-question mean difference, one cell against Control")
            for m in measures]
    rows.append(RejectionRow(f"writing family of {n_cells * len(measures)} (any rejection)", clusters, n_runs,
                             "family", None, None, family / n_runs, f"BH q < 0.05 over {n_cells} cells x 4 measures"))
    return rows


# ---------------------------------------------------------------------------------------------------- tables


def rejection_tables(seed: int, n_runs: int, clusters: Sequence[int] = (7, 30),
                     h3_sizes: Sequence[int] = (7, 30)) -> list[RejectionRow]:
    """Every null rejection table at each G (each setting with its own generator).

    The H3 correlation rows are cheap and use ``H3_RUN_FACTOR`` times as many runs.
    """
    rows: list[RejectionRow] = []
    for g in clusters:
        t0 = time.perf_counter()
        rows += null_h1(seed, g, n_runs)
        for tau in H2_TAUS:
            rows += null_h2(seed, g, n_runs, tau=tau)
        for fn in (null_layers, null_heads, null_residue_similarity):
            rows += fn(seed, g, n_runs)
        log.info("null tables G=%d: %.0f s", g, time.perf_counter() - t0)
    for n in h3_sizes:
        rows += null_h3(seed, n, H3_RUN_FACTOR * n_runs)
    return rows


def below_minimum_tables(seed: int, n_runs: int, clusters: Sequence[int] = (4, 5, 6)) -> list[RejectionRow]:
    """The clustered tests below and at the minimum G, computed anyway (``min_clusters=2``): why the rule is 6."""
    rows: list[RejectionRow] = []
    for g in clusters:
        rows += null_h1(seed, g, n_runs, min_clusters=2)
        rows += [r for r in null_heads(seed, g, n_runs, n_layers=10, min_clusters=2) if r.per == "test"]
    for g in clusters:
        if g < inf.MIN_CLUSTERS:
            rows += null_h3(seed, g, H3_RUN_FACTOR * n_runs, min_n=inf.MIN_CORRELATION_N)
    return rows


# ------------------------------------------------------------------------------- max-T over a map of heads


def simulate_null(n_sims: int = 200, n_questions: int = 10, grid: tuple[int, int] = (8, 8), rho: float = 0.5,
                  alpha: float = 0.05, n_resamples: int = 499, seed: int = 0) -> dict[str, float]:
    """Family-wise rejection rates under the global null, for max-T and for uncorrected / BH per-cell tests.

    Each simulated study has ``n_questions`` question contrasts on a ``grid`` of heads; heads share a question
    effect with correlation ``rho`` (a common factor) and the contrasts are t(5)-distributed (heavier tails than
    normal), symmetric about 0: no head has an effect. A study rejects when any head's adjusted p (or q) < alpha.

    Returns:
        ``{"max_t": rate, "bh": rate, "uncorrected": rate, "n_sims": n_sims}``.
    """
    rng = np.random.default_rng(seed)
    m = int(np.prod(grid))
    hits = {"max_t": 0, "bh": 0, "uncorrected": 0}
    for i in range(n_sims):
        common = rng.standard_t(5, size=(n_questions, 1))
        own = rng.standard_t(5, size=(n_questions, m))
        D = (math.sqrt(rho) * common + math.sqrt(1 - rho) * own).reshape(n_questions, *grid)
        r = max_t_sign_flip(D, n_resamples=n_resamples, seed=seed + i + 1)
        hits["max_t"] += bool(np.nanmin(r.p_max_t) < alpha)
        hits["bh"] += bool(np.nanmin(r.q) < alpha)
        hits["uncorrected"] += bool(np.nanmin(r.p) < alpha)
    return {**{k: v / n_sims for k, v in hits.items()}, "n_sims": float(n_sims)}


def _failed_study(rng: np.random.Generator, n_questions: int, grid: tuple[int, int], rho: float, effect: float,
                  planted: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One simulated study of trial-hops: (values, failed, load, groups, covariates) (:func:`simulate_failed_null`)."""
    m = int(np.prod(grid))
    vals, failed, load, groups, cov = [], [], [], [], []
    for q in range(n_questions):
        difficulty = rng.normal()
        q_effect = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
        for cond in (0.0, 1.0):  # Saturation, Residue
            for ld in (20.0, 80.0):
                high = ld == 80.0
                fail = rng.random() < 1 / (1 + math.exp(-(-0.8 + difficulty + 1.6 * high)))
                trial = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
                for hop in (0.0, 1.0):
                    own = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
                    v = 0.5 * q_effect + 0.3 * trial + 0.5 * own + 0.8 * high + 0.3 * hop + 0.2 * cond
                    if fail and effect:
                        v = v.reshape(grid)
                        v[planted] += effect
                        v = v.reshape(-1)
                    vals.append(v)
                    failed.append(float(fail))
                    load.append(ld)
                    groups.append(q)
                    cov.append((cond, hop))
    return (np.array(vals).reshape(-1, *grid), np.array(failed), np.array(load), np.array(groups),
            np.array(cov))


def simulate_failed_null(n_sims: int = 200, n_questions: int = 10, grid: tuple[int, int] = (8, 8),
                         rho: float = 0.5, alpha: float = 0.05, n_resamples: int = 499, seed: int = 0,
                         effect: float = 0.0, planted: tuple[int, int] = (0, 0),
                         clustered: bool = True) -> dict[str, float]:
    """Family-wise rejection rates of the failed − correct map, max-T on :func:`probe.analysis.max_t.question_contrasts` vs per-head tests.

    Each simulated study has ``n_questions`` questions with one trial at each of two placements (Saturation,
    Residue) and two loads (20, 80 %), two hops per trial: 8 trial-hops per question, as in a study with one
    replication. A trial fails with a probability that rises with the question's difficulty and with load; every
    head's value rises with load too (and with the hop and the placement), and carries question, trial and
    trial-hop terms shared by the heads with correlation ``rho``, all t(5)-distributed. With ``effect = 0`` no head
    depends on failure given load: failed trials still attend more, through load alone, the confounding the
    nuisance regression has to remove. With ``effect`` > 0 the ``planted`` head gains that much in failed trials.

    Per study: the max-T sign flip (:func:`probe.analysis.max_t.max_t_sign_flip`) on the per-question failed − correct contrast of
    residuals on [1, load, Residue, hop] (``max_t``) and of raw values (``max_t_raw``: without the adjustment); and,
    with ``clustered``, the clustered per-head test of the attention ↔ behaviour analysis with BH over the map
    (:func:`probe.analysis.attention_tests.attention_failure_tests`, ``bh_clustered``). A study rejects when any
    head other than the planted one (any head under no effect) has p_max_t (q) < alpha; ``found`` is the share of
    studies whose max-T p of the planted head is < alpha (with ``effect`` > 0).

    Returns:
        ``{"max_t", "max_t_raw", "bh_clustered", "found", "found_bh", "questions_used", "n_sims"}`` (rates and the
        mean number of questions that had failed and correct trials).
    """
    from probe.analysis.attention_tests import attention_failure_tests

    rng = np.random.default_rng(seed)
    hits = {"max_t": 0, "max_t_raw": 0, "bh_clustered": 0, "found": 0, "found_bh": 0}
    used = 0.0
    others = np.ones(grid, dtype=bool)
    if effect:
        others[planted] = False
    for i in range(n_sims):
        Y, failed, load, groups, cov = _failed_study(rng, n_questions, grid, rho, effect, planted)
        N = np.column_stack([np.ones(len(load)), load, cov])
        adj = question_contrasts(Y, failed, groups, N)
        raw = question_contrasts(Y, failed, groups)
        used += len(adj.questions)
        r = max_t_sign_flip(adj.D, n_resamples=n_resamples, seed=seed + i + 1)
        rr = max_t_sign_flip(raw.D, n_resamples=n_resamples, seed=seed + i + 1)
        if r.is_test:
            pm = np.nan_to_num(r.p_max_t, nan=1.0)
            hits["max_t"] += bool((pm[others] < alpha).any())
            hits["found"] += bool(effect and pm[planted] < alpha)
        if rr.is_test:
            hits["max_t_raw"] += bool((np.nan_to_num(rr.p_max_t, nan=1.0)[others] < alpha).any())
        if clustered:
            fits = attention_failure_tests(Y, failed, load, groups, cov, alpha)
            if fits.is_test:
                qv = np.nan_to_num(fits.q, nan=1.0)
                hits["bh_clustered"] += bool((qv[others] < alpha).any())
                hits["found_bh"] += bool(effect and qv[planted] < alpha)
    return {**{k: v / n_sims for k, v in hits.items()}, "questions_used": used / n_sims, "n_sims": float(n_sims)}



def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def format_coverage(rows: Sequence[CoverageRow]) -> str:
    """Markdown table of coverage rows."""
    lines = ["| κ (ICC) | R | G | true EM | runs | coverage | mean width | before: coverage | before: outside [0, 1] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.kappa:g} ({1 / (r.kappa + 1):.2f}) | {r.replications} | {r.clusters} | {r.em:g} | "
                     f"{r.n_runs} | {r.coverage:.3f} | {r.width:.3f} | {r.coverage_before:.3f} | "
                     f"{_pct(r.outside_before)} |")
    return "\n".join(lines)


def format_rejections(rows: Sequence[RejectionRow]) -> str:
    """Markdown table of null rejection rows (α = 0.05; MC SE = sqrt(0.05·0.95/runs))."""
    lines = ["| test | G (n) | runs | rate over | before | CR1, t(G-1) | after | MC SE | what |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.test} | {r.clusters} | {r.n_runs} | {r.per} | {_pct(r.before)} | {_pct(r.cr1_t)} | "
                     f"{_pct(r.after)} | "
                     f"{100 * math.sqrt(ALPHA * (1 - ALPHA) / r.n_runs):.1f} % | {r.note} |")
    return "\n".join(lines)


def format_power(rows: Sequence[PowerRow]) -> str:
    """Markdown table of power rows."""
    lines = ["| G | β per pp | runs | actual rejection (CR2, BM df) | before: normal power | after: noncentral t |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.clusters} | {r.beta:g} | {r.n_runs} | {r.actual:.3f} | {r.power_before:.3f} | "
                     f"{r.power_after:.3f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- retrieval heads: the rank correlation


@dataclass(frozen=True)
class RhoCoverageRow:
    """Coverage of the question-bootstrap interval of a Spearman ρ between two head maps, against the known ρ.

    Attributes:
        n_questions: G.
        true_rho: Spearman ρ between the two maps of copy probabilities the data are drawn from.
        n_runs: simulated studies.
        mean_estimate: mean ρ̂ (below the true ρ: both maps are estimated with noise).
        percentile, bca: coverage of the percentile interval (before) and of the BCa interval (the analysis').
        percentile_at_top: share of studies whose percentile interval ends within 0.02 above the estimate.
    """

    n_questions: int
    true_rho: float
    n_runs: int
    mean_estimate: float
    percentile: float
    bca: float
    percentile_at_top: float


def rho_coverage(seed: int, n_questions: int, n_runs: int, target: float = 0.6, n_layers: int = 12,
                 n_heads: int = 8, tokens: float = 20.0, n_boot: int = 999, alpha: float = ALPHA) -> RhoCoverageRow:
    """Question-bootstrap intervals of the retrieval-head stability ρ (Control against another cell) by simulation.

    Data: two (layers × heads) maps of copy probabilities, p_C = logistic(z) and p_O = logistic(c·z + e) with
    z ~ N(−2, 1) and e ~ N(0, 1) per head (c chosen so that the maps' Spearman ρ is near ``target``; the true ρ is
    computed from the drawn maps, fixed for the setting). Each question has Poisson(``tokens``) copyable tokens in
    each cell and each head copies each of them with its probability, times a question effect (Gamma, mean 1,
    shape 4). The estimate is the Spearman ρ of the pooled scores (:func:`probe.attention.retrieval.pooled_score`),
    as the analysis computes it; "percentile" is the interval it gave before, "bca" the one it gives now
    (:func:`probe.analysis.retrieval.rho_interval`).
    """
    from probe.analysis.retrieval import _spearman_rows, rho_interval
    from probe.attention.retrieval import pooled_score

    rng = np.random.default_rng([seed, n_questions, int(round(target * 100))])
    z = rng.normal(-2.0, 1.0, (n_layers, n_heads))
    c = target / math.sqrt(max(1e-9, 1 - target**2))
    p_c, p_o = 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(-(c * z + rng.normal(0, 1, z.shape))))
    truth = float(scipy.stats.spearmanr(p_c.ravel(), p_o.ravel()).statistic)
    est_sum = pct_hit = bca_hit = at_top = 0.0
    for _ in range(n_runs):
        def cell(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            n = rng.poisson(tokens, n_questions).astype(float)
            q = rng.gamma(4.0, 0.25, n_questions)
            copied = rng.binomial(n.astype(int)[:, None, None], np.clip(p[None] * q[:, None, None], 0, 1))
            return copied.astype(float), n

        cc, cn = cell(p_c)
        oc, on = cell(p_o)

        def rho_of(w: np.ndarray) -> np.ndarray:
            x, y = pooled_score(cc, cn, w), pooled_score(oc, on, w)
            return _spearman_rows(x.reshape(len(w), -1), y.reshape(len(w), -1))

        est = float(rho_of(np.ones((1, n_questions)))[0])
        est_sum += est
        w = rng.multinomial(n_questions, np.full(n_questions, 1 / n_questions), size=n_boot).astype(float)
        lo, hi = np.quantile(rho_of(w), [alpha / 2, 1 - alpha / 2])
        pct_hit += lo <= truth <= hi
        at_top += hi <= est + 0.02
        b_lo, b_hi = rho_interval(rho_of, n_questions, alpha, n_boot, rng)
        bca_hit += b_lo is not None and b_hi is not None and b_lo <= truth <= b_hi
    return RhoCoverageRow(n_questions=n_questions, true_rho=truth, n_runs=n_runs, mean_estimate=est_sum / n_runs,
                          percentile=pct_hit / n_runs, bca=bca_hit / n_runs, percentile_at_top=at_top / n_runs)


def rho_table(seed: int, n_runs: int, clusters: Sequence[int] = (7, 10, 20, 50),
              targets: Sequence[float] = (0.3, 0.6, 0.9)) -> str:
    """The retrieval-head ρ coverage table of docs/statistics.md."""
    lines = ["| G | true ρ | mean ρ̂ | percentile coverage (before) | percentile interval ends at ρ̂ | "
             "BCa coverage |", "|---|---|---|---|---|---|"]
    for g in clusters:
        for t in targets:
            r = rho_coverage(seed, g, n_runs, target=t)
            lines.append(f"| {g} | {r.true_rho:.2f} | {r.mean_estimate:.2f} | {r.percentile:.3f} | "
                         f"{r.percentile_at_top:.3f} | {r.bca:.3f} |")
    return "\n".join(lines)


SHARE_SETTINGS = ((0.4, 0.25), (0.4, 0.5), (0.4, 1.0), (0.6, 0.5))  # (EM_base, true share) per G
CARRIER_SETTINGS = ((12, 2), (12, 3), (12, 8), (20, 2), (20, 3), (20, 8), (20, 14), (50, 3), (50, 20))


def share_table(seed: int, n_runs: int, clusters: Sequence[int] = (7, 10, 20, 30, 50)) -> str:
    """The recovered share's coverage table of docs/statistics.md: the sign-flip interval, Fieller's t interval
    (before) and the delta method, per G, EM_base and true share."""
    lines = ["| G | EM_base | true share | coverage | bounded | coverage when bounded | excludes 0, test p ≥ 0.05 | "
             "Fieller (t) coverage | Fieller: excludes 0, test p ≥ 0.05 | delta-method coverage | undefined |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in clusters:
        for base, share in SHARE_SETTINGS:
            r = {m: recovered_share_coverage(seed, g, n_runs, em_base=base, share=share, method=m)
                 for m in ("analysis", "fieller", "delta")}
            sf, fi = r["analysis"], r["fieller"]
            cb = "–" if sf.coverage_bounded is None else f"{sf.coverage_bounded:.3f}"
            lines.append(f"| {g} | {base} | {share} | {sf.coverage:.3f} | {sf.bounded:.3f} | {cb} | "
                         f"{sf.disagree:.3f} | {fi.coverage:.3f} | {fi.disagree:.3f} | {r['delta'].coverage:.3f} | "
                         f"{sf.undefined:.3f} |")
    return "\n".join(lines)


def carrier_table(seed: int, n_runs: int) -> str:
    """The paired difference's interval when a few questions carry the change (docs/statistics.md)."""
    lines = ["| G | questions that change | CR2 coverage (before) | interval given | coverage when given | "
             "before: excludes 0, test p ≥ 0.05 | after | share (Fieller t): excludes 0, p ≥ 0.05 | share "
             "(widened) |", "|---|---|---|---|---|---|---|---|---|"]
    for g, k in CARRIER_SETTINGS:
        r = carrier_coverage(seed, g, k, n_runs)
        after = "–" if r.after is None else f"{r.after:.3f}"
        lines.append(f"| {g} | {k} | {r.before:.3f} | {r.after_given:.3f} | {after} | {r.disagree_before:.3f} | "
                     f"{r.disagree_after:.3f} | {r.share_disagree_before:.3f} | {r.share_disagree_after:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulations and print the Markdown tables (the entry of ``python scripts/simulate.py``)."""
    ap = argparse.ArgumentParser(prog="python scripts/simulate.py", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--coverage-runs", type=int, default=2000, help="simulated data sets per coverage setting")
    ap.add_argument("--runs", type=int, default=1000, help="simulated data sets per null setting")
    ap.add_argument("--kappas", type=float, nargs="+", default=[2.0, 1.0, 4.0],
                    help="Beta concentrations of the coverage table (ICC = 1/(kappa+1))")
    ap.add_argument("--quick", action="store_true", help="a small version (200 runs, kappa 2 only)")
    tables = ["coverage", "null", "power", "minimum", "one-question", "share", "carriers", "rho", "equivalence",
              "study-design", "writing"]
    ap.add_argument("--only", choices=tables, nargs="+", default=tables)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    for name, value in (("--runs", args.runs), ("--coverage-runs", args.coverage_runs)):
        if value < 1:
            ap.error(f"{name} must be at least 1, got {value}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.quick:
        args.runs, args.coverage_runs, args.kappas = 200, 200, [2.0]
    out = sys.stdout
    out.write(f"Seed {args.seed}; alpha = {ALPHA}.\n\n")
    def section(title: str, n_runs: int, make: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        table = make()
        out.write(f"## {title} ({n_runs} runs per setting, {time.perf_counter() - t0:.0f} s)\n\n{table}\n\n")

    if "coverage" in args.only:
        section("Coverage of the 95 % EM interval", args.coverage_runs,
                lambda: format_coverage(coverage_table(args.seed, args.coverage_runs, kappas=args.kappas)))
    if "null" in args.only:
        section("Rejection rates under no effect", args.runs,
                lambda: format_rejections(rejection_tables(args.seed, args.runs)))
    if "minimum" in args.only:
        rows_m = below_minimum_tables(args.seed, args.runs)
        out.write(f"## Below the minimum G ({args.runs} runs per setting, tests forced)\n\n"
                  f"{format_rejections(rows_m)}\n\n")
    if "one-question" in args.only:
        section("Every failure in one question", args.runs, lambda: format_rejections(
            [r for g in (7, 20) for r in null_one_question(args.seed, g, args.runs)]))
    if "share" in args.only:
        section("The recovered share's interval", args.coverage_runs,
                lambda: share_table(args.seed, args.coverage_runs))
    if "carriers" in args.only:
        section("The paired difference when few questions carry it", args.runs,
                lambda: carrier_table(args.seed, args.runs))
    if "rho" in args.only:
        section("The retrieval heads' rank correlation", args.runs, lambda: rho_table(args.seed, args.runs))
    if "equivalence" in args.only:
        section("Equivalence (TOST)", args.runs, lambda: equivalence_table(args.seed, args.runs))
    if "study-design" in args.only:
        section("Equivalence and difference in the one-replication study design", args.runs,
                lambda: study_design_table(args.seed, args.runs))
    if "writing" in args.only:
        section("What the model wrote against Control", args.runs, lambda: format_rejections(
            [r for g in (7, 10, 20, 50) for r in null_writing(args.seed, g, args.runs)]))
    if "power" in args.only:
        rows_p = [power_h1(args.seed, g, args.runs) for g in (7, 20, 30)]
        out.write(f"## H1 power at a planted effect ({args.runs} runs per setting)\n\n{format_power(rows_p)}\n")
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
