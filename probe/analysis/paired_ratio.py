"""The statistics of a causal test on paired per-question values: the paired difference (question-level sign flip,
CR2 t interval), the recovered share with Fieller's interval, and the equivalence test beside H2
(docs/statistics.md#interventions-paired-differences-and-the-recovered-share)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.stats

from probe.analysis import inference as inf
from probe.analysis.estimate import Estimate


# ------------------------------------------------------------------------------------------------- estimates

# a per-question mean difference of EM below this is 0 (EM means are multiples of 1 / replications; this only
# absorbs rounding)
ZERO = 1e-12


def question_means(questions: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The question ids (sorted, as strings) and, for each of ``values`` ((n,) per prompt), its mean per question."""
    qs, codes = np.unique(np.asarray(questions).astype(str), return_inverse=True)
    counts = np.bincount(codes)
    return qs, [np.bincount(codes, weights=v) / counts for v in values]


@dataclass(frozen=True)
class PairedDifference:
    """EM of ``a`` minus EM of ``b`` over prompts scored under both, question by question.

    Attributes:
        n_prompts: prompts scored under both.
        n_questions: questions (clusters) among them.
        em_a, em_b: mean EM of ``a`` and of ``b`` over the paired prompts.
        estimate: the mean over questions of the per-question mean difference (no value without pairs), its CR2
            standard error, interval (cut to [-1, 1]) and t reference's degrees of freedom (none when descriptive or
            the differences do not vary), the two-sided question-level sign-flip p-value (none when descriptive,
            ``is_test`` False, with the ``reason``), and the methods, in words.
        is_exact: the p-value enumerates every sign assignment.
    """

    n_prompts: int
    n_questions: int
    em_a: float | None
    em_b: float | None
    estimate: Estimate
    is_exact: bool


def paired_difference(em_a: np.ndarray, em_b: np.ndarray, questions: np.ndarray, alpha: float = 0.05,
                      seed: int = 0) -> PairedDifference:
    """EM_a − EM_b paired by prompt: question-level sign-flip test and CR2 interval (docs/statistics.md#interventions-paired-differences-and-the-recovered-share).

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
    est = Estimate(value=t.delta, p=t.p, method=method, reason=t.reason, is_test=t.is_test)
    out = PairedDifference(n_prompts=t.n_pairs, n_questions=t.n_questions, em_a=t.em_a, em_b=t.em_b, estimate=est,
                           is_exact=t.is_exact)
    if t.n_pairs == 0 or not t.is_test:
        return out
    qs, (d,) = question_means(g, a - b)  # (G,) per-question mean differences
    carriers = int(np.sum(np.abs(d) > ZERO))
    if carriers < inf.MIN_CLUSTERS:  # a t interval of mostly-zero differences is too narrow (docs/statistics.md)
        return replace(out, estimate=replace(est, reason=t.reason or "no interval: " + inf.few_contrast_reason(
            carriers, d.size, inf.MIN_CLUSTERS, "questions whose mean difference is not 0")))
    fit = inf.clustered_ols(d, np.ones((d.size, 1)), qs, term=0, alpha=alpha)
    e = fit.estimate
    if not e.is_test or e.ci_low is None or e.ci_high is None:
        return replace(out, estimate=replace(est, reason=t.reason or f"no interval: {e.reason}"))
    # a difference of two proportions lies in [-1, 1]: the t interval is cut there (its coverage can only grow)
    return replace(out, estimate=replace(est, ci_low=max(-1.0, e.ci_low), ci_high=min(1.0, e.ci_high), se=e.se,
                                         df=e.df))


# the equivalence margin when an experiment states none: 0.10 EM, one question in ten
# (docs/statistics.md#equivalence-two-one-sided-tests-tost)
DEFAULT_MARGIN = 0.10


TOST_METHOD = ("TOST: two one-sided t tests of the mean per-question difference on t(G-1) (statsmodels "
               "ttost_paired)")


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST) that the mean per-question EM difference lies inside (−margin, +margin).

    Attributes:
        margin: δ, in EM units (a share of the questions).
        estimate: the mean per-question difference; its (1 − 2α) t interval (the TOST rejects exactly when it lies
            inside (−δ, δ)), standard error and G − 1 degrees of freedom; ``p`` the TOST p-value, the larger of the
            two one-sided p-values (None with a ``reason`` when not run; below α, "equivalent within ±δ" holds at
            level α); ``q`` its BH q-value where the caller forms a family.
        n_questions: questions G.
    """

    margin: float
    estimate: Estimate
    n_questions: int

    def holds(self, alpha: float) -> bool:
        """Whether equivalence within ±margin is shown at level ``alpha`` (by the q-value where there is one)."""
        e = self.estimate
        level = e.q if e.q is not None else e.p
        return level is not None and level < alpha


SCORE_METHOD = ("TOST: two one-sided score tests of the paired difference of proportions (Tango 1998), each "
                "against its margin with the other cell's restricted maximum-likelihood estimate; interval: the "
                "(1 - 2 alpha) score interval")


def _tango_z(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0: p_b − p_c = ``delta`` from a paired 2×2 table with ``b`` pairs (a right, b
    wrong), ``c`` pairs (a wrong, b right) and ``n`` pairs in all; the variance uses the maximum-likelihood p_c
    under H0 (the root of 2n·q² + B·q + C = 0 that is a probability)."""
    big_b = -(b + c) + (2 * n - b + c) * delta
    big_c = -c * delta * (1 - delta)
    q = (-big_b + math.sqrt(max(big_b * big_b - 8 * n * big_c, 0.0))) / (4 * n)
    var = n * (2 * q + delta * (1 - delta))
    diff = b - c - n * delta
    if var <= 0:  # only at |delta| = 1 with every pair at that corner
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)


def paired_binary_equivalence(b: int, c: int, n: int, margin: float = DEFAULT_MARGIN,
                              alpha: float = 0.05) -> Equivalence:
    """TOST of |p_a − p_b| < ``margin`` for one pair per question scored 0/1: two one-sided score tests of the
    paired difference of proportions (Tango 1998; docs/statistics.md#equivalence-two-one-sided-tests-tost).

    Args:
        b: questions right under ``a`` and wrong under ``b`` (d_q = +1).
        c: questions wrong under ``a`` and right under ``b`` (d_q = −1).
        n: questions in all.
        margin: δ in (0, 1).
        alpha: level of each one-sided test (the interval is 1 − 2α).

    Returns:
        The :class:`Equivalence`: the difference (b − c) / n, its Wald standard error, the (1 − 2α) score interval
        (the values of Δ that neither one-sided test at level α rejects) and the TOST p, the larger of the two
        one-sided p-values.
    """
    if not 0 < margin < 1:
        raise inf.InferenceInputError(f"paired_binary_equivalence: margin must lie in (0, 1), got {margin}")
    if n <= 0 or b < 0 or c < 0 or b + c > n:
        raise inf.InferenceInputError(f"paired_binary_equivalence: need 0 <= b, c and b + c <= n > 0, got b={b}, "
                                      f"c={c}, n={n}")
    from scipy.optimize import brentq

    p_upper = float(scipy.stats.norm.cdf(_tango_z(b, c, n, margin)))  # H0: Δ >= +δ
    p_lower = float(scipy.stats.norm.sf(_tango_z(b, c, n, -margin)))  # H0: Δ <= −δ
    z = float(scipy.stats.norm.ppf(1 - alpha))
    value = (b - c) / n
    eps = 1e-9
    # the statistic falls as Δ rises; the interval's ends are where it crosses ±z (the ends of [-1, 1] if never)
    lo = -1.0 if _tango_z(b, c, n, -1 + eps) <= z else brentq(lambda t: _tango_z(b, c, n, t) - z, -1 + eps, value)
    hi = 1.0 if _tango_z(b, c, n, 1 - eps) >= -z else brentq(lambda t: _tango_z(b, c, n, t) + z, value, 1 - eps)
    se = math.sqrt(max(b + c - (b - c) ** 2 / n, 0.0)) / n
    return Equivalence(margin, Estimate(value=value, se=se, ci_low=lo, ci_high=hi, p=max(p_upper, p_lower),
                                        method=SCORE_METHOD, is_test=True), n)


def paired_equivalence(em_a: np.ndarray, em_b: np.ndarray, questions: np.ndarray, margin: float = DEFAULT_MARGIN,
                       alpha: float = 0.05) -> Equivalence:
    """TOST of |EM_a − EM_b| < ``margin`` on the per-question mean differences
    (docs/statistics.md#equivalence-two-one-sided-tests-tost). With one pair per question and EM 0/1 (a study with
    one replication) it is the paired-proportions score TOST of :func:`paired_binary_equivalence`, which holds its
    level where few questions differ; otherwise two one-sided t tests with the gate below.

    Args:
        em_a, em_b: (n,) EM of each paired prompt under ``a`` and ``b``.
        questions: (n,) question (task) ids.
        margin: δ > 0, in EM units.
        alpha: level of each one-sided test (the interval is 1 − 2α).

    Returns:
        The :class:`Equivalence`; no test (a reason instead) when fewer than ``MIN_CLUSTERS`` questions have a
        difference other than 0: the t reference then understates the spread, as for the paired difference's
        interval, and equivalence would be claimed from a handful of questions.
    """
    if not margin > 0:
        raise inf.InferenceInputError(f"paired_equivalence: margin must be > 0, got {margin}")
    a, b = np.asarray(em_a, dtype=float), np.asarray(em_b, dtype=float)
    _, (a_q, b_q) = question_means(questions, a, b)
    d = a_q - b_q
    if d.size == a.size and np.all((a == 0) | (a == 1)) and np.all((b == 0) | (b == 1)):
        return paired_binary_equivalence(int(np.sum(d > 0)), int(np.sum(d < 0)), d.size, margin, alpha)
    carriers = int(np.sum(np.abs(d) > ZERO))
    if carriers < inf.MIN_CLUSTERS:
        return Equivalence(margin, Estimate.descriptive(float(d.mean()), f"no TOST: only {carriers} of {d.size} "
                           f"questions differ (fewer than {inf.MIN_CLUSTERS}; "
                           "docs/statistics.md#equivalence-two-one-sided-tests-tost)", TOST_METHOD), d.size)
    if float(d.std(ddof=1)) == 0.0:  # every question differs by the same amount: a t test has no spread to use
        return Equivalence(margin, Estimate.descriptive(float(d.mean()), "no TOST: every question's mean difference "
                           f"is {float(d[0]):+.3g}; the t reference needs differences that vary", TOST_METHOD), d.size)
    from statsmodels.stats.weightstats import ttost_paired

    p = float(ttost_paired(a_q, b_q, -margin, margin)[0])
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    half = float(scipy.stats.t.ppf(1 - alpha, d.size - 1)) * se
    mean = float(d.mean())
    return Equivalence(margin, Estimate(value=mean, se=se, ci_low=mean - half, ci_high=mean + half, df=d.size - 1,
                                        p=p, method=TOST_METHOD, is_test=True), d.size)


def paired_verdict(p_difference: float | None, p_equivalence: float | None, margin: float, mde: float | None,
                  alpha: float = 0.05) -> str:
    """Which of "different", "equivalent within ±δ" and "neither: no difference detected, MDE …" a paired comparison
    supports at level ``alpha``, from its difference test's p (or BH q) and its TOST's p (or q); ``mde``: the
    difference its test detects with 80 % power (None: not estimable)."""
    if p_difference is not None and p_difference < alpha:
        return "different"
    if p_equivalence is not None and p_equivalence < alpha:
        return f"equivalent within ±{margin:g}"
    return f"neither: no difference detected, MDE {'not estimable' if mde is None else format(mde, '.2f')}"


@dataclass(frozen=True)
class RecoveredShare:
    """(EM_int − EM_base) / (EM_Control − EM_base) with its Fieller interval, or the reason it is undefined.

    Attributes:
        estimate: the share (1: the intervention recovers the whole loss; 0: nothing; no value when undefined), its
            Fieller interval on t(G − 1) (none when undefined, descriptive or unbounded; no test, so ``is_test`` is
            False and there is no ``se`` or ``p``), the method, in words, and why the share or its interval is not
            given (``reason``).
        numerator: mean over questions of EM_int − EM_base.
        denominator: mean over questions of EM_Control − EM_base.
        n_questions: questions with an intervened, a baseline and a Control trial.
    """

    estimate: Estimate
    numerator: float | None
    denominator: float | None
    n_questions: int

    @classmethod
    def undefined(cls, n_questions: int, reason: str) -> RecoveredShare:
        """A share that cannot be estimated, and why."""
        return cls(Estimate.descriptive(None, reason, RECOVERED_METHOD), None, None, n_questions)


RECOVERED_METHOD = ("ratio of per-question mean differences; Fieller interval on t(G-1), widened to reach 0 where the "
                    "numerator's sign-flip test does not reject 0")


def fieller_quadratic(num: np.ndarray, den: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """Coefficients (a, b, c) of Fieller's set {R : a·R² + b·R + c ≤ 0} for mean(num) / mean(den), on t(G − 1).

    The set is the R with (N̄ − R·D̄)² ≤ t² (s_NN − 2R·s_ND + R²·s_DD) / G, the sample (co)variances s over the G
    questions: the R a t test of mean(num − R·den) = 0 does not reject.
    """
    G = num.size
    t2 = float(scipy.stats.t.ppf(1 - alpha / 2, G - 1)) ** 2
    cov = np.cov(np.vstack([num, den]), ddof=1)
    nm, dm = float(num.mean()), float(den.mean())
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


def sign_flip_p(z: np.ndarray, seed: int = 0) -> float:
    """Two-sided sign-flip p of mean(z) = 0, as :func:`inf.paired_sign_flip` tests a paired difference: all 2^G
    assignments up to ``inf.EXACT_SIGN_FLIP_MAX`` questions, else ``inf.N_RESAMPLES`` seeded ones (p = (1 + k) /
    (1 + B)); an assignment counts when its |sum| reaches the observed one, up to rounding."""
    n = z.size
    if n <= inf.EXACT_SIGN_FLIP_MAX:
        flips = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)
    else:
        flips = np.random.default_rng(seed).choice([-1.0, 1.0], size=(inf.N_RESAMPLES, n))
    obs = abs(float(z.sum()))
    k = int(np.sum(np.abs(flips @ z) >= obs - 1e-9 * max(1.0, float(np.abs(z).sum()))))
    return k / len(flips) if n <= inf.EXACT_SIGN_FLIP_MAX else (1 + k) / (1 + len(flips))


def recovered_share(em_int: np.ndarray, em_base: np.ndarray, em_control: np.ndarray, alpha: float = 0.05,
                    min_clusters: int = inf.MIN_CLUSTERS, seed: int = 0) -> RecoveredShare:
    """The recovered share from per-question means, with Fieller's interval (docs/statistics.md#interventions-paired-differences-and-the-recovered-share), widened to reach 0
    where the numerator's exact sign-flip test (:func:`sign_flip_p`) does not reject 0.

    Args:
        em_int: (G,) per-question mean EM under the intervention.
        em_base: (G,) per-question mean EM of the same prompts' baseline trials.
        em_control: (G,) per-question mean baseline Control EM.
        alpha: 1 − confidence level.
        min_clusters: fewer questions: the share is given without an interval.
        seed: seed of the Monte Carlo sign assignments (above 16 questions).

    Returns:
        The :class:`RecoveredShare`.
    """
    i, b, c = (np.asarray(x, dtype=float) for x in (em_int, em_base, em_control))
    G = int(i.size)
    if G == 0:
        return RecoveredShare.undefined(G, "no question has an intervened, a baseline and a Control trial")
    num, den = i - b, c - b
    nm, dm = float(num.mean()), float(den.mean())
    out = RecoveredShare(Estimate.descriptive(None, None, RECOVERED_METHOD), numerator=nm, denominator=dm,
                         n_questions=G)
    if dm <= 0:
        return replace(out, estimate=replace(out.estimate, reason=(
            f"EM_Control - EM_base = {dm:+.3f} <= 0: the baseline lost nothing to Control, so there is nothing to "
            "recover and the share is undefined")))

    def share(reason: str | None, ci: tuple[float, float] | None = None) -> RecoveredShare:
        return replace(out, estimate=replace(out.estimate, value=nm / dm, reason=reason,
                                             ci_low=None if ci is None else ci[0],
                                             ci_high=None if ci is None else ci[1]))

    if G < min_clusters:
        return share(inf.few_clusters_reason(G, min_clusters))
    resid = num - (nm / dm) * den
    if float(np.max(np.abs(resid))) <= 1e-12 * max(1.0, float(np.max(np.abs(num))), float(np.max(np.abs(den)))):
        return share("every question recovers the same share of its loss (EM_int - EM_base is proportional to "
                     "EM_Control - EM_base): the questions give no spread to build an interval from, so the share "
                     "is descriptive only")
    ci = fieller_interval(num, den, alpha)
    if ci is None:
        return share("the loss EM_Control - EM_base is not distinguishable from 0 at this level: the interval of "
                     "the share is unbounded")
    if (ci[0] > 0 or ci[1] < 0) and sign_flip_p(num, seed) >= alpha:
        # with few questions that change, the t interval can exclude 0 where the exact test cannot: it claims no more
        return share(None, ci=(min(ci[0], 0.0), max(ci[1], 0.0)))
    return share(None, ci=ci)


__all__ = ["RECOVERED_METHOD", "PairedDifference", "RecoveredShare", "fieller_interval", "fieller_quadratic",
           "paired_difference", "recovered_share", "sign_flip_p"]
