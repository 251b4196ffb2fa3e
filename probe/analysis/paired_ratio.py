"""The statistics of a causal test on paired per-question values: the paired difference (question-level sign flip,
CR2 t interval) and the recovered share with Fieller's interval for a ratio of means.

Methods and the simulated coverage of the share's interval: docs/statistics.md (interventions). The analysis that
applies them to a run's intervened trials is :mod:`probe.analysis.interventions`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.stats

from probe.analysis import inference as inf


# ------------------------------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class PairedDifference:
    """EM of ``a`` minus EM of ``b`` over prompts scored under both, question by question.

    Attributes:
        n_prompts: prompts scored under both.
        n_questions: questions (clusters) among them.
        em_a, em_b: mean EM of ``a`` and of ``b`` over the paired prompts.
        delta: mean over questions of the per-question mean difference (None without pairs).
        ci_low, ci_high: CR2 interval of ``delta``, cut to [-1, 1] (None when descriptive or the differences do
            not vary).
        se: its standard error; df: its t reference's degrees of freedom.
        p: two-sided question-level sign-flip p-value (None when descriptive).
        is_exact: the p-value enumerates every sign assignment.
        is_test: False when descriptive (see ``reason``).
        method: the methods, in words.
        reason: why there is no test or interval (None otherwise).
    """

    n_prompts: int
    n_questions: int
    em_a: float | None
    em_b: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    se: float | None
    df: float | None
    p: float | None
    is_exact: bool
    is_test: bool
    method: str
    reason: str | None


def paired_difference(em_a: np.ndarray, em_b: np.ndarray, questions: np.ndarray, alpha: float = 0.05,
                      seed: int = 0) -> PairedDifference:
    """EM_a − EM_b paired by prompt: question-level sign-flip test and CR2 interval (module docstring).

    Args:
        em_a: (n,) EM under ``a`` of each paired prompt.
        em_b: (n,) EM under ``b`` of the same prompts.
        questions: (n,) question (task) ids.
        alpha: test level and 1 − confidence level.
        seed: seed of the Monte Carlo sign flips (above 16 questions).

    Returns:
        The :class:`PairedDifference`.
    """
    a = np.asarray(em_a, dtype=float)
    b = np.asarray(em_b, dtype=float)
    g = np.asarray(questions)
    t = inf.paired_sign_flip(a, b, g, alpha=alpha, seed=seed)
    method = (f"{t.method}; interval: CR2 t interval of the mean per-question difference (Bell-McCaffrey df), "
              "cut to [-1, 1]")
    out = PairedDifference(n_prompts=t.n_pairs, n_questions=t.n_questions, em_a=t.em_a, em_b=t.em_b, delta=t.delta,
                           ci_low=None, ci_high=None, se=None, df=None, p=t.p, is_exact=t.is_exact,
                           is_test=t.is_test, method=method, reason=t.reason)
    if t.n_pairs == 0 or not t.is_test:
        return out
    qs, codes = np.unique(g.astype(str), return_inverse=True)
    d = np.bincount(codes, weights=a - b) / np.bincount(codes)  # (G,) per-question mean differences
    fit = inf.clustered_ols(d, np.ones((d.size, 1)), qs, term=0, alpha=alpha)
    e = fit.estimate
    if not e.is_test or e.ci_low is None or e.ci_high is None:
        return replace(out, reason=t.reason or f"no interval: {e.reason}")
    # a difference of two proportions lies in [-1, 1]: the t interval is cut there (its coverage can only grow)
    return replace(out, ci_low=max(-1.0, e.ci_low), ci_high=min(1.0, e.ci_high), se=e.se, df=e.df)


@dataclass(frozen=True)
class RecoveredShare:
    """(EM_int − EM_base) / (EM_Control − EM_base) with its Fieller interval, or the reason it is undefined.

    Attributes:
        estimate: the share (1: the intervention recovers the whole loss; 0: nothing); None when undefined.
        ci_low, ci_high: Fieller interval on t(G − 1); None when undefined, descriptive or unbounded.
        numerator: mean over questions of EM_int − EM_base.
        denominator: mean over questions of EM_Control − EM_base.
        n_questions: questions with an intervened, a baseline and a Control trial.
        method: the method, in words.
        reason: why the share or its interval is not given (None otherwise).
    """

    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    numerator: float | None
    denominator: float | None
    n_questions: int
    method: str
    reason: str | None


RECOVERED_METHOD = "ratio of per-question mean differences; Fieller interval on t(G-1)"


def fieller_quadratic(num: np.ndarray, den: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """Coefficients (a, b, c) of Fieller's set {R : a·R² + b·R + c ≤ 0} for mean(num) / mean(den), on t(G − 1).

    The set is the R with (N̄ − R·D̄)² ≤ t² (s_NN − 2R·s_ND + R²·s_DD) / G, the sample (co)variances s over the G
    questions: the R a t test of mean(num − R·den) = 0 does not reject.

    Args:
        num: (G,) per-question numerators.
        den: (G,) per-question denominators (G ≥ 2).
        alpha: 1 − confidence level.
    """
    n = np.asarray(num, dtype=float)
    d = np.asarray(den, dtype=float)
    G = n.size
    t2 = float(scipy.stats.t.ppf(1 - alpha / 2, G - 1)) ** 2
    cov = np.cov(np.vstack([n, d]), ddof=1)
    nm, dm = float(n.mean()), float(d.mean())
    return (dm * dm - t2 * cov[1, 1] / G, -2 * (nm * dm - t2 * cov[0, 1] / G), nm * nm - t2 * cov[0, 0] / G)


def fieller_interval(num: np.ndarray, den: np.ndarray, alpha: float = 0.05) -> tuple[float, float] | None:
    """Fieller's interval for mean(num) / mean(den) from paired per-question values (:func:`fieller_quadratic`).

    Returns:
        (low, high), or None when the set is unbounded (the whole line, or the line less an interval): the
        denominator's own t test does not reject at ``alpha`` (D̄² ≤ t² s_DD / G).
    """
    qa, qb, qc = fieller_quadratic(num, den, alpha)
    if qa <= 0:
        return None
    r = math.sqrt(max(qb * qb - 4 * qa * qc, 0.0))
    return ((-qb - r) / (2 * qa), (-qb + r) / (2 * qa))


def recovered_share(em_int: np.ndarray, em_base: np.ndarray, em_control: np.ndarray, alpha: float = 0.05,
                    min_clusters: int = inf.MIN_CLUSTERS) -> RecoveredShare:
    """The recovered share from per-question means, with Fieller's interval (module docstring).

    Args:
        em_int: (G,) per-question mean EM under the intervention.
        em_base: (G,) per-question mean EM of the same prompts' baseline trials.
        em_control: (G,) per-question mean baseline Control EM.
        alpha: 1 − confidence level.
        min_clusters: fewer questions: the share is given without an interval.

    Returns:
        The :class:`RecoveredShare`.
    """
    i, b, c = (np.asarray(x, dtype=float) for x in (em_int, em_base, em_control))
    G = int(i.size)
    out = RecoveredShare(None, None, None, None, None, G, RECOVERED_METHOD, None)
    if G == 0:
        return replace(out, reason="no question has an intervened, a baseline and a Control trial")
    num, den = i - b, c - b
    nm, dm = float(num.mean()), float(den.mean())
    out = replace(out, numerator=nm, denominator=dm)
    if dm <= 0:
        return replace(out, reason=f"EM_Control - EM_base = {dm:+.3f} <= 0: the baseline lost nothing to Control, so "
                                   "there is nothing to recover and the share is undefined")
    out = replace(out, estimate=nm / dm)
    if G < min_clusters:
        return replace(out, reason=inf.few_clusters_reason(G, min_clusters))
    resid = num - (nm / dm) * den
    if float(np.max(np.abs(resid))) <= 1e-12 * max(1.0, float(np.max(np.abs(num))), float(np.max(np.abs(den)))):
        return replace(out, reason="every question recovers the same share of its loss (EM_int - EM_base is "
                                   "proportional to EM_Control - EM_base): the questions give no spread to build an "
                                   "interval from, so the share is descriptive only")
    ci = fieller_interval(num, den, alpha)
    if ci is None:
        return replace(out, reason="the loss EM_Control - EM_base is not distinguishable from 0 at this level: "
                                   "the interval of the share is unbounded")
    return replace(out, ci_low=ci[0], ci_high=ci[1])


__all__ = ["RECOVERED_METHOD", "PairedDifference", "RecoveredShare", "fieller_interval", "fieller_quadratic",
           "paired_difference", "recovered_share"]
