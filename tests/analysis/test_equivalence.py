"""Equivalence of a paired comparison (probe/analysis/paired_ratio.py: paired_equivalence, paired_verdict): the
TOST against a direct computation, its interval, its refusal when few questions carry a difference, its error rate
at the margin in a seeded simulation, the one-replication score TOST against a numerical fit, and the three
verdicts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from probe.analysis.inference import InferenceInputError
from probe.analysis.paired_ratio import paired_difference, paired_equivalence, paired_verdict


def _paired(rng: np.random.Generator, n_questions: int, delta: float, replications: int = 2):
    """Two prompts of each question (independent draws), EM probability p_q ~ U(0.3, 0.6) under b, p_q + delta
    under a."""
    p = rng.uniform(0.3, 0.6, n_questions)
    a = (rng.random((n_questions, replications)) < (p + delta)[:, None]).astype(float)
    b = (rng.random((n_questions, replications)) < p[:, None]).astype(float)
    return a.ravel(), b.ravel(), np.repeat(np.arange(n_questions), replications)


@pytest.mark.parametrize("seed", range(5))
def test_the_tost_is_the_larger_of_two_one_sided_t_tests_on_the_question_means(seed: int) -> None:
    a, b, q = _paired(np.random.default_rng(seed), 30, 0.05)
    e = paired_equivalence(a, b, q, margin=0.25, alpha=0.05).estimate
    d = a.reshape(30, 2).mean(1) - b.reshape(30, 2).mean(1)
    lower = scipy.stats.ttest_1samp(d, -0.25, alternative="greater").pvalue
    upper = scipy.stats.ttest_1samp(d, 0.25, alternative="less").pvalue
    # 1e-9: the same t statistic and reference computed two ways; a normal reference or a 1 - alpha interval
    # would differ by 1e-3 or more
    assert e.p == pytest.approx(max(lower, upper), abs=1e-9)
    half = scipy.stats.t.ppf(0.95, 29) * d.std(ddof=1) / np.sqrt(30)
    assert (e.ci_low, e.ci_high) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-12)
    # the TOST rejects exactly when its (1 - 2 alpha) interval lies inside the margins
    assert e.df == 29
    assert paired_equivalence(a, b, q, margin=0.25).holds(0.05) == (-0.25 < e.ci_low and e.ci_high < 0.25)


def test_few_questions_that_differ_give_no_test() -> None:
    q = np.repeat(np.arange(20), 2)
    a = np.zeros(40)
    a[:10] = 1.0  # questions 0-4 differ, 15 do not
    e = paired_equivalence(a, np.zeros(40), q, margin=0.25)
    assert e.estimate.p is None and not e.holds(0.05)
    assert "only 5 of 20 questions differ" in (e.estimate.reason or "")
    with pytest.raises(InferenceInputError, match="margin must be > 0"):
        paired_equivalence(a, np.zeros(40), q, margin=0.0)


def test_at_the_margin_equivalence_is_declared_at_most_alpha_of_the_time() -> None:
    # seeded: 400 data sets of 20 questions whose true difference is exactly the margin; the share declared
    # equivalent must stay within alpha + 3 Monte Carlo SEs (0.083); at no difference it is declared often
    rng = np.random.default_rng(2026)
    at_margin = np.mean([paired_equivalence(*_paired(rng, 20, 0.25), margin=0.25).holds(0.05) for _ in range(400)])
    inside = np.mean([paired_equivalence(*_paired(rng, 20, 0.0), margin=0.25).holds(0.05) for _ in range(200)])
    assert at_margin <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400)
    assert inside > 0.2


def _verdict(a: np.ndarray, b: np.ndarray, q: np.ndarray, margin: float) -> str:
    from probe.analysis import inference as inf

    d, e = paired_difference(a, b, q), paired_equivalence(a, b, q, margin)
    est = d.estimate
    mde = inf.t_power(est.value, est.se, est.df).mde if est.se else None
    return paired_verdict(est.p, e.estimate.p, margin, mde)


def test_the_verdict_says_which_of_the_three_holds() -> None:
    rng = np.random.default_rng(7)
    assert _verdict(*_paired(rng, 50, 0.35), margin=0.1) == "different"
    assert _verdict(*_paired(rng, 50, 0.0, replications=8), margin=0.3) == "equivalent within ±0.3"
    assert _verdict(*_paired(rng, 10, 0.0), margin=0.1).startswith("neither: no difference detected, MDE 0.")
    assert paired_verdict(None, None, 0.1, None) == "neither: no difference detected, MDE not estimable"


def test_every_h2_comparison_carries_its_tost_with_its_own_bh_family() -> None:
    import pandas as pd
    from statsmodels.stats.multitest import multipletests

    from probe.analysis.hypotheses import h2_comparisons

    rng = np.random.default_rng(11)
    rows = []
    for q in range(40):
        p = rng.uniform(0.3, 0.7)
        for cond, load, shift in (("Control", 0, 0.0), ("LongControl", 50, 0.0), ("Saturation", 50, -0.5)):
            for r in range(4):
                rows.append({"model": "m", "condition": cond, "load": load, "task_id": f"q{q}", "replication": r,
                             "em": float(rng.random() < max(p + shift, 0.0)), "is_scored": True})
    h2 = h2_comparisons(pd.DataFrame(rows), "m", alpha=0.05, seed=0, margin=0.3)
    assert [(r.a, r.b) for r in h2] == [("LongControl", "Control"), ("Saturation", "LongControl")]
    p = [r.equivalence.estimate.p for r in h2]
    assert all(r.equivalence.margin == 0.3 for r in h2) and None not in p
    # 1e-12: the same BH adjustment computed by statsmodels directly
    assert [r.equivalence.estimate.q for r in h2] == pytest.approx(list(multipletests(p, method="fdr_bh")[1]), abs=1e-12)
    assert [r.verdict(0.05) for r in h2] == ["equivalent within ±0.3", "different"]


def test_differences_that_do_not_vary_give_no_test() -> None:
    q = np.repeat(np.arange(8), 2)
    e = paired_equivalence(np.ones(16), np.zeros(16), q, margin=0.5)  # all 8 questions differ by exactly +1
    assert e.estimate.p is None and "every question's mean difference is +1" in (e.estimate.reason or "")


def test_in_the_one_replication_study_design_the_power_follows_the_arithmetic_and_the_margin_holds() -> None:
    """The design a confirmatory study runs (docs/statistics.md, the one-replication table): d_q in {-1, 0, 1}, 140
    questions, 30 % of them discordant. Seeded, 400 data sets a row: at no difference the TOST's power at ±0.15 is
    what the normal arithmetic gives (2 Phi((0.15 - 0.077) / 0.046) - 1 = 0.887) within 4 Monte Carlo SEs; at the
    margin it declares equivalence within alpha + 3 SEs; the sign test holds its level."""
    from scripts.simulate import study_design_rates

    power = study_design_rates(11, 140, 0.3, 0.15, 0.0, 400)
    half, se = scipy.stats.t.ppf(0.95, 139) * np.sqrt(0.3 / 140), np.sqrt(0.3 / 140)
    expected = 2 * scipy.stats.norm.cdf((0.15 - half) / se) - 1
    assert abs(power.equivalent - expected) <= 4 * np.sqrt(expected * (1 - expected) / 400)
    assert power.different <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400) and power.no_test == 0.0
    at_margin = study_design_rates(12, 140, 0.3, 0.15, 0.15, 400)
    assert at_margin.equivalent <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400) and at_margin.different > 0.75


def _restricted_score(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic from a numerical maximum-likelihood fit of the paired 2x2 table under p_b - p_c =
    delta (bounded scalar search over p_c), not from the closed-form root the package uses."""
    from scipy.optimize import minimize_scalar

    m = n - b - c
    lo, hi = max(0.0, -delta) + 1e-13, (1 - delta) / 2 - 1e-13

    def nll(q: float) -> float:
        return -sum(k * np.log(x) for k, x in ((b, q + delta), (c, q), (m, 1 - 2 * q - delta)) if k)

    q = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
    return (b - c - n * delta) / np.sqrt(n * (2 * q + delta * (1 - delta)))


@pytest.mark.parametrize("b, c, n", [(5, 3, 140), (0, 0, 20), (10, 0, 40), (7, 12, 30), (3, 1, 20), (0, 9, 140)])
def test_one_replication_uses_the_score_tost_held_to_a_numerical_fit(b: int, c: int, n: int) -> None:
    a_em = np.r_[np.ones(b), np.zeros(c), np.ones((n - b - c) // 2), np.zeros(n - b - c - (n - b - c) // 2)]
    b_em = np.r_[np.zeros(b), np.ones(c), np.ones((n - b - c) // 2), np.zeros(n - b - c - (n - b - c) // 2)]
    e = paired_equivalence(a_em, b_em, np.arange(n), margin=0.12).estimate
    assert e.method is not None and "score" in e.method
    p_upper = scipy.stats.norm.cdf(_restricted_score(b, c, n, 0.12))
    p_lower = scipy.stats.norm.sf(_restricted_score(b, c, n, -0.12))
    # 1e-6: the closed-form root against a numerical optimum (xatol 1e-13); a wrong variance term moves p by 1e-2
    assert e.p == pytest.approx(max(p_upper, p_lower), abs=1e-6)
    assert e.value == pytest.approx((b - c) / n, abs=1e-12)
    # the (1 - 2 alpha) score interval: at each end the one-sided test is exactly at alpha (or the end is -1 / 1)
    z = scipy.stats.norm.ppf(0.95)
    for end, sign in ((e.ci_low, 1), (e.ci_high, -1)):
        assert abs(end) == pytest.approx(1.0) or _restricted_score(b, c, n, end) == pytest.approx(sign * z, abs=1e-5)
    holds = paired_equivalence(a_em, b_em, np.arange(n), margin=0.12).holds(0.05)
    assert holds == (-0.12 < e.ci_low and e.ci_high < 0.12)


def test_where_few_questions_differ_the_one_replication_tost_holds_its_level() -> None:
    """140 questions, 10 % discordant, all of them +1 so the true difference is the margin 0.10 (the design where the
    t-based TOST declared equivalence 9 % of the time): seeded, 600 data sets; the score TOST declares equivalence
    within alpha + 3 Monte Carlo SEs (0.077), and at no difference it has power (0.92 simulated at 2,000)."""
    from scripts.simulate import study_design_rates

    assert study_design_rates(3, 140, 0.1, 0.10, 0.10, 600).equivalent <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 600)
    assert study_design_rates(4, 140, 0.1, 0.10, 0.0, 300).equivalent > 0.8


def test_the_score_tost_refuses_a_table_that_cannot_be() -> None:
    from probe.analysis.paired_ratio import paired_binary_equivalence

    with pytest.raises(InferenceInputError, match="b \\+ c <= n"):
        paired_binary_equivalence(5, 6, 10)
    with pytest.raises(InferenceInputError, match="margin must lie in"):
        paired_binary_equivalence(1, 1, 10, margin=1.0)
