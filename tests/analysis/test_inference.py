"""Small-sample inference (probe.analysis.inference): each estimator against statsmodels / scipy or an independent
direct computation, the minimum-G rule, and small versions of the coverage and null simulations of
docs/statistics.md (the full tables come from ``python scripts/simulate.py``)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from probe.analysis import inference as inf
from probe.analysis.attention_tests import attention_failure_tests, residue_similarity_tests
from probe.analysis.glm import clustered_logit
from scripts import simulate as sim


def clusters(n_clusters: int, per: int) -> np.ndarray:
    return np.repeat(np.arange(n_clusters), per)


# ------------------------------------------------------------------------------------------------ EM interval


def test_proportion_ci_stays_in_unit_interval_and_covers_the_mean() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        g = int(rng.integers(2, 12))
        r = int(rng.integers(1, 4))
        p = rng.choice([0.0, 0.02, 0.5, 0.98, 1.0])
        y = (rng.random(g * r) < p).astype(float)
        ci = inf.proportion_ci(y, clusters(g, r))
        assert 0.0 <= ci.ci_low <= ci.mean <= ci.ci_high <= 1.0
        assert ci.ci_high - ci.ci_low > 0.05  # never a degenerate [p, p], even when every outcome is equal
        assert ci.design_effect >= 1.0


def test_proportion_ci_with_one_trial_per_question_is_wilson_at_n_minus_one() -> None:
    # singleton clusters: the CR1 variance is n/(n-1) times the binomial one, so n_eff = n - 1, and t_{n-1} = t_{G-1}
    y = np.array([1, 0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1], dtype=float)
    n = y.size
    ci = inf.proportion_ci(y, np.arange(n))
    lo, hi = proportion_confint(y.mean() * (n - 1), n - 1, alpha=0.05, method="wilson")
    assert ci.n_effective == pytest.approx(n - 1)
    assert (ci.ci_low, ci.ci_high) == pytest.approx((lo, hi))


def test_proportion_ci_df_adjustment_with_few_questions() -> None:
    # every question has the same mean: the design effect is floored at 1, only the df adjustment shrinks n
    y = np.tile([1.0, 0.0, 1.0], 5)
    ci = inf.proportion_ci(y, clusters(5, 3))
    n = y.size
    assert ci.design_effect == 1.0
    assert ci.n_effective == pytest.approx(n * (scipy.stats.t.ppf(0.975, n - 1) / scipy.stats.t.ppf(0.975, 4)) ** 2)
    lo, hi = proportion_confint(y.mean() * ci.n_effective, ci.n_effective, method="wilson")
    assert (ci.ci_low, ci.ci_high) == pytest.approx((lo, hi))


def test_proportion_ci_widens_with_clustering() -> None:
    # same outcomes: 12 questions x 2 identical replications vs 24 independent questions
    base = np.array([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0], dtype=float)
    clustered = inf.proportion_ci(np.repeat(base, 2), clusters(12, 2))
    independent = inf.proportion_ci(np.repeat(base, 2), np.arange(24))
    assert clustered.design_effect > 1.5
    assert clustered.ci_high - clustered.ci_low > independent.ci_high - independent.ci_low


def test_proportion_ci_degenerate_inputs() -> None:
    assert inf.proportion_ci(np.zeros(0), np.zeros(0)).reason == "no scored trial"
    one = inf.proportion_ci(np.array([1.0, 0.0]), np.array(["q", "q"]))
    assert one.mean == 0.5 and one.ci_low is None and "one question" in one.reason
    with pytest.raises(inf.InferenceInputError, match="in \\[0, 1\\]"):
        inf.proportion_ci(np.array([0.0, 2.0]), np.array([0, 1]))
    with pytest.raises(inf.InferenceInputError, match="groups"):
        inf.proportion_ci(np.array([0.0, 1.0]), np.array([0]))


@pytest.mark.parametrize(("n_clusters", "replications", "em", "kappa"), [(7, 2, 0.5, 2.0), (20, 5, 0.1, 1.0)])
def test_coverage_quick(n_clusters: int, replications: int, em: float, kappa: float) -> None:
    """A small version of the coverage table: 400 runs (MC SE about 0.011)."""
    row = sim.coverage(7, n_clusters, replications, em, kappa, n_runs=400)
    assert 0.91 <= row.coverage <= 0.99, row
    assert row.n_runs == 400


def test_proportion_ci_all_equal_cell_assumes_one_observation_per_question() -> None:
    """All 50 answers wrong over 10 questions: the clustering cannot be estimated, so n_eff = G (ICC 1)."""
    y, g = np.zeros(50), clusters(10, 5)
    ci = inf.proportion_ci(y, g)
    n_star = 10 * (scipy.stats.t.ppf(0.975, 49) / scipy.stats.t.ppf(0.975, 9)) ** 2
    lo, hi = proportion_confint(0.0, n_star, alpha=0.05, method="wilson")
    assert ci.design_effect == pytest.approx(5.0) and ci.n_effective == pytest.approx(n_star)
    assert (ci.ci_low, ci.ci_high) == pytest.approx((0.0, hi))


def test_coverage_at_ten_questions_with_all_wrong_cells() -> None:
    """The issue's setting (G = 10, EM 0.1, ICC 0.5, 5 replications): 0.892 with the design effect floored at 1."""
    row = sim.coverage(sim.DEFAULT_SEED, 10, 5, 0.1, 1.0, n_runs=1000)
    assert 0.92 <= row.coverage <= 0.99, row


def test_before_interval_leaves_unit_interval() -> None:
    # the demo's failure: the clustered t-interval of a 0/1 mean at G = 7
    y = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0], dtype=float)
    lo, hi = sim.before_mean_ci(y, clusters(7, 2))
    assert hi > 1.0
    ci = inf.proportion_ci(y, clusters(7, 2))
    assert ci.ci_high < 1.0


# ------------------------------------------------------------------------------------------------ clustered fits


def unbalanced_design(rng: np.random.Generator, n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = rng.integers(2, 9, size=n_clusters)
    codes = np.repeat(np.arange(n_clusters), sizes)
    n = codes.size
    between = rng.normal(size=n_clusters)[codes]
    X = np.column_stack([np.ones(n), between + 0.3 * rng.normal(size=n), rng.normal(size=n)])
    return X, codes


def test_cr1_weights_reproduce_statsmodels_cluster_se() -> None:
    rng = np.random.default_rng(1)
    X, codes = unbalanced_design(rng, 9)
    y = rng.normal(size=codes.size) + rng.normal(size=9)[codes]
    res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    for term in range(3):
        w, df = inf.sandwich_weights(X, codes, 9, term, "CR1")
        se = math.sqrt(np.sum(np.bincount(codes, weights=w * res.resid) ** 2))
        assert se == pytest.approx(res.bse[term], rel=1e-10)
        assert df == 8


def test_cr2_with_singleton_clusters_is_hc2() -> None:
    rng = np.random.default_rng(2)
    n = 40
    X = sm.add_constant(rng.normal(size=(n, 2)))
    y = X @ [1.0, 0.5, 0.0] + rng.normal(size=n) * (1 + np.abs(X[:, 1]))
    hc2 = sm.OLS(y, X).fit(cov_type="HC2")
    for term in range(3):
        fit = inf.clustered_ols(y, X, np.arange(n), term=term)
        assert fit.estimate.se == pytest.approx(hc2.bse[term], rel=1e-10)
        assert fit.estimate.value == pytest.approx(hc2.params[term], rel=1e-12)


def test_cr2_of_a_balanced_mean_is_the_variance_of_cluster_means_on_g_minus_1_df() -> None:
    rng = np.random.default_rng(3)
    g, r = 8, 3
    y = rng.normal(size=g * r) + rng.normal(size=g)[clusters(g, r)]
    fit = inf.clustered_ols(y, np.ones((g * r, 1)), clusters(g, r), term=0)
    means = y.reshape(g, r).mean(axis=1)
    assert fit.estimate.se == pytest.approx(math.sqrt(means.var(ddof=1) / g), rel=1e-10)
    assert fit.estimate.df == pytest.approx(g - 1, rel=1e-10)
    tt = scipy.stats.ttest_1samp(means, 0.0)  # the cluster-means t-test: same t, same df, same p
    assert fit.estimate.p == pytest.approx(tt.pvalue, rel=1e-8)


def test_bell_mccaffrey_df_against_the_full_hat_matrix() -> None:
    """The df from the G x G moment matrix equals the eigenvalue formula on the full n x n projection."""
    rng = np.random.default_rng(4)
    X, codes = unbalanced_design(rng, 7)
    n = codes.size
    for term in (1, 2):
        w, df = inf.sandwich_weights(X, codes, 7, term, "CR2")
        resid_maker = np.eye(n) - X @ np.linalg.inv(X.T @ X) @ X.T
        Gm = np.column_stack([resid_maker[:, codes == g] @ w[codes == g] for g in range(7)])  # (n, G)
        lam = np.linalg.eigvalsh(Gm.T @ Gm)
        assert df == pytest.approx(lam.sum() ** 2 / np.sum(lam**2), rel=1e-10)
        # CR2 weights: w_g = (I - H_gg)^(-1/2) X_g (X'X)^-1 l, checked with scipy's matrix square root
        bread = np.linalg.inv(X.T @ X)
        for g in range(7):
            idx = codes == g
            A = scipy.linalg.inv(scipy.linalg.sqrtm(np.eye(idx.sum()) - X[idx] @ bread @ X[idx].T)).real
            np.testing.assert_allclose(w[idx], A @ X[idx] @ bread[term], rtol=1e-8, atol=1e-12)
    # a regressor that varies mainly between questions leaves far fewer than G - 1 df
    assert inf.sandwich_weights(X, codes, 7, 1, "CR2")[1] < 6


def test_logit_cr2_with_singleton_clusters_is_the_hc2_sandwich() -> None:
    rng = np.random.default_rng(5)
    n = 80
    X = sm.add_constant(rng.normal(size=(n, 2)))
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ [0.2, 0.8, -0.5]))).astype(float)
    fit = clustered_logit(y, X, np.arange(n), term=1)
    glm = sm.GLM(y, X, family=sm.families.Binomial()).fit()
    mu = glm.fittedvalues
    W = mu * (1 - mu)
    bread = np.linalg.inv(X.T @ (W[:, None] * X))
    h = W * np.einsum("ij,jk,ik->i", X, bread, X)
    meat = X.T @ (((y - mu) ** 2 / (1 - h))[:, None] * X)
    assert fit.estimate.se == pytest.approx(math.sqrt((bread @ meat @ bread)[1, 1]), rel=1e-8)
    assert fit.estimate.value == pytest.approx(glm.params[1])


def test_cr1_options_are_statsmodels() -> None:
    rng = np.random.default_rng(6)
    X, codes = unbalanced_design(rng, 10)
    y = (rng.random(codes.size) < 0.5).astype(float)
    ref = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    fit = inf.clustered_ols(y, X, codes, vcov="CR1")
    e = fit.estimate
    assert (e.se, e.p, e.ci_low, e.df) == pytest.approx((ref.bse[1], ref.pvalues[1], ref.conf_int()[1, 0], 9))
    ref = sm.GLM(y, X, family=sm.families.Binomial()).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    fit = clustered_logit(y, X, codes, vcov="CR1")
    e = fit.estimate
    assert (e.se, e.p, e.ci_high) == pytest.approx((ref.bse[1], ref.pvalues[1], ref.conf_int()[1, 1]))


def test_fits_below_the_minimum_number_of_questions_are_descriptive() -> None:
    rng = np.random.default_rng(7)
    codes = clusters(inf.MIN_CLUSTERS - 1, 8)
    x = np.tile([0.0, 20, 50, 80], codes.size // 4)
    y = (rng.random(codes.size) < 0.6 - 0.004 * x).astype(float)
    X = sm.add_constant(x)
    for fit in (inf.clustered_ols(y, X, codes), clustered_logit(y, X, codes)):
        assert not fit.is_test and fit.estimate.p is None and fit.estimate.se is None and fit.power is None
        assert fit.estimate.value is not None and "fewer than the minimum of 6" in fit.estimate.reason
    many = inf.clustered_ols_many(rng.normal(size=(codes.size, 3, 2)), X, codes)
    assert not many.is_test and np.isnan(many.p).all() and np.isfinite(many.estimate).all()
    ok = inf.clustered_ols(y, X, codes, min_clusters=inf.MIN_CLUSTERS - 1)
    assert ok.is_test


def test_degenerate_fits_say_why() -> None:
    codes = clusters(8, 4)
    X = sm.add_constant(np.tile([0.0, 20, 50, 80], 8))
    assert "no variance" in inf.clustered_ols(np.ones(32), X, codes).estimate.reason
    assert "rank deficient" in inf.clustered_ols(np.ones(32), np.ones((32, 2)), codes).estimate.reason
    y = (X[:, 1] > 30).astype(float)  # perfectly separated
    assert not clustered_logit(y, X, codes).is_test
    with pytest.raises(inf.InferenceInputError, match="0/1"):
        clustered_logit(np.full(32, 0.5), X, codes)
    with pytest.raises(inf.InferenceInputError, match="vcov"):
        inf.clustered_ols(np.ones(32), X, codes, vcov="HC3")  # type: ignore[arg-type]


def test_t_power_is_the_noncentral_t() -> None:
    est, se, df = 0.3, 0.12, 6.4
    pw = inf.t_power(est, se, df)
    c = scipy.stats.t.ppf(0.975, df)
    direct = scipy.stats.nct.sf(c, df, est / se) + scipy.stats.nct.cdf(-c, df, est / se)
    assert pw.power == pytest.approx(direct, rel=1e-8)
    at_mde = inf.t_power(pw.mde, se, df)
    assert at_mde.power == pytest.approx(0.80, abs=1e-6)
    # the normal reference promises more: the issue's 0.54 reported vs 0.41 achieved at G = 7
    assert scipy.stats.norm.sf(1.96 - est / se) > pw.power
    with pytest.raises(inf.InferenceInputError):
        inf.t_power(1.0, 0.0, 5)


# ----------------------------------------------------------------------------------------- many outcomes


def test_many_fits_match_statsmodels_per_column() -> None:
    rng = np.random.default_rng(8)
    X, codes = unbalanced_design(rng, 11)
    n = codes.size
    Y = rng.normal(size=(n, 30, 9)) + rng.normal(size=(11, 30, 9))[codes]
    Y[5, 3, 4] = np.nan  # a column with a missing row is fitted on its own rows
    cr1 = inf.clustered_ols_many(Y, X, codes, term=1, vcov="CR1")
    cr2 = inf.clustered_ols_many(Y, X, codes, term=1)
    assert cr1.p.shape == (30, 9) and cr2.is_test
    for layer, head in [(0, 0), (12, 5), (29, 8), (3, 4)]:
        col = Y[:, layer, head]
        ok = np.isfinite(col)
        ref = sm.OLS(col[ok], X[ok]).fit(cov_type="cluster", cov_kwds={"groups": codes[ok]}, use_t=True)
        got = (cr1.estimate[layer, head], cr1.se[layer, head], cr1.p[layer, head], cr1.ci_low[layer, head],
               cr1.ci_high[layer, head])
        assert got == pytest.approx((ref.params[1], ref.bse[1], ref.pvalues[1], *ref.conf_int()[1]), rel=1e-9)
        one = inf.clustered_ols(col[ok], X[ok], codes[ok])
        assert (cr2.estimate[layer, head], cr2.se[layer, head], cr2.p[layer, head], cr2.df[layer, head]) == \
            pytest.approx((one.estimate.value, one.estimate.se, one.estimate.p, one.estimate.df), rel=1e-9)
    assert cr2.n[3, 4] == n - 1 and cr2.n[0, 0] == n
    np.testing.assert_allclose(cr2.q, multipletests(cr2.p.ravel(), method="fdr_bh")[1].reshape(30, 9))


def test_bh_qvalues_ignore_missing_p_values() -> None:
    p = np.array([[0.001, np.nan], [0.04, 0.03]])
    q = inf.bh_qvalues(p)
    assert np.isnan(q[0, 1])
    np.testing.assert_allclose(q[~np.isnan(p)], multipletests([0.001, 0.04, 0.03], method="fdr_bh")[1])
    assert np.isnan(inf.bh_qvalues(np.array([np.nan, np.nan]))).all()
    with pytest.raises(inf.InferenceInputError):
        inf.bh_qvalues(np.array([1.5]))


def attention_trials(rng: np.random.Generator, n_clusters: int, planted: dict[tuple[int, int], float]):
    values, failed, load, residue, codes = sim.attention_data(rng, n_clusters, 2, 6, 4)
    for (layer, head), effect in planted.items():
        values[:, layer, head] += effect * failed
    return values, failed, load, residue, codes


def test_per_head_test_finds_planted_heads_only() -> None:
    rng = np.random.default_rng(9)
    planted = {(2, 1): 0.25, (4, 3): -0.25}
    values, failed, load, residue, codes = attention_trials(rng, 30, planted)
    res = attention_failure_tests(values, failed, load, codes, covariates=residue[:, None])
    assert res.estimate.shape == (6, 4)
    found = {tuple(int(i) for i in ix) for ix in res.significant(0.05)}
    assert found == set(planted)
    assert res.estimate[2, 1] > 0.15 and res.estimate[4, 3] < -0.15
    assert "adjusted for 2 covariate(s)" in res.method
    # the same coefficient as one fit with the same design
    X = np.column_stack([np.ones(failed.size), failed, load, residue])
    one = inf.clustered_ols(values[:, 2, 1], X, codes)
    assert (res.estimate[2, 1], res.p[2, 1]) == pytest.approx((one.estimate.value, one.estimate.p), rel=1e-9)


def test_per_head_test_without_a_contrast() -> None:
    rng = np.random.default_rng(10)
    values, _, load, _, codes = attention_trials(rng, 8, {})
    res = attention_failure_tests(values, np.zeros(codes.size, dtype=bool), load, codes)
    assert not res.is_test and "every trial is correct" in res.reason


def test_residue_similarity_finds_a_planted_slope() -> None:
    rng = np.random.default_rng(11)
    g, per = 25, 6
    codes = clusters(g, per)
    load = np.tile([20.0, 50, 80] * 2, g)
    s_sim = 0.3 + 0.1 * rng.normal(size=g)[codes] + 0.02 * rng.normal(size=codes.size)
    noise = 0.03 * rng.normal(size=(g, 5))[codes] + 0.03 * rng.normal(size=(codes.size, 5))
    ar = 0.2 + 0.1 * load[:, None] / 100 + noise
    ar[:, 3] += 0.5 * s_sim
    out = residue_similarity_tests(ar, s_sim, codes, load)
    assert out.is_load_adjusted
    assert [int(i[0]) for i in out.fits.significant()] == [3]
    assert out.fits.estimate[3] == pytest.approx(0.5, abs=0.2)
    assert out.pearson_r[3] == pytest.approx(scipy.stats.pearsonr(s_sim, ar[:, 3]).statistic)


# ---------------------------------------------------------------------------------------------------- H2


def enumerate_sign_flips(d: np.ndarray) -> float:
    observed = abs(d.mean())
    stats = [abs(np.mean(np.array(signs) * d)) for signs in itertools.product([1, -1], repeat=d.size)]
    return float(np.mean(np.array(stats) >= observed - 1e-12))


def test_sign_flip_is_exact_for_few_questions() -> None:
    rng = np.random.default_rng(12)
    g, r = 9, 3
    a = (rng.random(g * r) < 0.7).astype(float)
    b = (rng.random(g * r) < 0.4).astype(float)
    res = inf.paired_sign_flip(a, b, clusters(g, r))
    d = (a - b).reshape(g, r).mean(axis=1)
    assert res.is_exact and res.n_resamples == 2**g and res.seed is None
    assert res.p == pytest.approx(enumerate_sign_flips(d))
    assert res.delta == pytest.approx(d.mean())
    table = [[int(((a == 1) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())],
             [int(((a == 0) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())]]
    assert res.mcnemar.p == pytest.approx(mcnemar(table, exact=True).pvalue)


def test_sign_flip_monte_carlo_is_seeded_and_close_to_exact() -> None:
    rng = np.random.default_rng(13)
    g = 18
    a = (rng.random(g * 2) < 0.6).astype(float)
    b = (rng.random(g * 2) < 0.45).astype(float)
    exact = inf.paired_sign_flip(a, b, clusters(g, 2), exact_max=18)
    mc = inf.paired_sign_flip(a, b, clusters(g, 2), exact_max=10, n_resamples=4999, seed=3)
    again = inf.paired_sign_flip(a, b, clusters(g, 2), exact_max=10, n_resamples=4999, seed=3)
    assert exact.is_exact and not mc.is_exact and mc.seed == 3
    assert mc.p == again.p
    assert mc.p == pytest.approx(exact.p, abs=0.02)


def test_sign_flip_descriptive_below_minimum_and_uninformative_pairs() -> None:
    few = inf.paired_sign_flip(np.ones(10), np.zeros(10), clusters(5, 2))
    assert not few.is_test and few.p is None and "0.0625" in few.reason and few.delta == 1.0
    same = inf.paired_sign_flip(np.ones(12), np.ones(12), clusters(6, 2))
    assert same.p == 1.0 and "no information" in same.reason
    assert inf.paired_sign_flip(np.zeros(0), np.zeros(0), np.zeros(0)).reason.startswith("no pair")


def test_question_level_test_holds_its_level_where_mcnemar_does_not() -> None:
    """A small version of the H2 null table: 12 tests x 60 data sets, questions differing in their effect."""
    rows = sim.null_h2(seed=5, clusters=30, n_runs=60, tau=3.0, n_resamples=999)
    per_test = next(r for r in rows if r.per == "test")
    assert per_test.after <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 60)
    family = next(r for r in rows if r.per == "family")
    assert family.after < family.before


# ---------------------------------------------------------------------------------------------------- H3


def test_correlation_test_and_interval_agree() -> None:
    rng = np.random.default_rng(14)
    for _ in range(400):
        n = int(rng.integers(4, 12))
        x = rng.normal(size=n)
        y = 0.8 * x + rng.normal(size=n)
        c = inf.similarity_correlation(x, y, min_n=4).estimate
        ref = scipy.stats.pearsonr(x, y)
        ci = ref.confidence_interval()
        assert (c.value, c.ci_low, c.ci_high) == pytest.approx((ref.statistic, ci.low, ci.high))
        assert (c.p < 0.05) == (c.ci_low > 0 or c.ci_high < 0)


def test_correlation_at_n_four_reproduces_the_issue_and_refuses_n_three() -> None:
    c = inf.similarity_correlation(np.array([0.1, 0.2, 0.3, 0.5]), np.array([0.0, 0.5, 0.5, 1.0]), min_n=4).estimate
    assert c.value == pytest.approx(0.956, abs=1e-3) and c.ci_low < 0 < c.p - 0.05
    assert scipy.stats.pearsonr([0.1, 0.2, 0.3, 0.5], [0.0, 0.5, 0.5, 1.0]).pvalue < 0.05  # the old, inconsistent p
    three = inf.similarity_correlation(np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.5, 1.0]))
    e = three.estimate
    assert not e.is_test and e.p is None and e.ci_low is None and e.value == pytest.approx(1.0)
    assert three.spearman.value is None and not three.spearman.is_test  # no test: no robustness figure either
    flat = inf.similarity_correlation(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.5, 1 / 3 + 1 / 6, 0.5, 0.5]))
    assert flat.estimate.value is None and "same" in flat.estimate.reason


# --------------------------------------------------------------------------------------- null simulations


def bound(n_runs: int) -> float:
    return 0.05 + 3 * math.sqrt(0.05 * 0.95 / n_runs)


def test_null_h1_quick() -> None:
    rows = sim.null_h1(seed=21, clusters=7, n_runs=150)
    for r in rows:
        assert r.after <= bound(150), r


def test_null_per_head_and_per_layer_quick() -> None:
    heads = sim.null_heads(seed=22, clusters=7, n_runs=60, n_layers=10, n_heads=9)
    test_row = next(r for r in heads if r.per == "test")
    assert test_row.after <= bound(60)
    family = next(r for r in heads if r.per == "family")
    assert family.after <= bound(60)


def test_null_residue_similarity_quick() -> None:
    rows = sim.null_residue_similarity(seed=23, clusters=7, n_runs=150, n_layers=10)
    per_test = next(r for r in rows if r.per == "test")
    assert per_test.after <= bound(150)
    assert per_test.cr1_t > per_test.after  # CR1 with t(G-1) over-rejects for a between-question regressor


def test_null_h3_quick() -> None:
    (row,) = sim.null_h3(seed=24, n_questions=5, n_runs=300)
    assert row.after <= bound(300)


def test_simulation_entry_prints_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--only", "power", "--runs", "20"]) == 0
    out = capsys.readouterr().out
    assert "H1 power" in out and "| 7 |" in out
    with pytest.raises(SystemExit):
        sim.main(["--runs", "0"])


# ------------------------------------------------------------------ questions that carry the contrast (issue 18)


def _one_question_carries(rng: np.random.Generator, n_clusters: int, per: int = 16,
                          n_out: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every failure falls in question 0; the outcome is noise plus a question effect (no link to failure)."""
    q = clusters(n_clusters, per)
    failed = (q == 0) & (np.arange(q.size) % 2 == 0)
    load = np.tile(np.array([20.0, 50.0, 80.0, 20.0]), q.size // 4)
    y = rng.normal(size=(q.size, n_out)) + rng.normal(size=(n_clusters, n_out))[q]
    return y, failed, load, q


@pytest.mark.parametrize("vcov", ["CR2", "CR1"])
def test_one_question_carrying_the_contrast_is_descriptive(vcov: str) -> None:
    rng = np.random.default_rng(18)
    y, failed, load, q = _one_question_carries(rng, 7)
    res = attention_failure_tests(y, failed, load, q, vcov=vcov)  # type: ignore[arg-type]
    assert not res.is_test and np.all(np.isnan(res.p)) and np.all(np.isfinite(res.estimate))
    assert "1 of 7 questions" in str(res.reason)
    X = np.column_stack([np.ones(q.size), failed, load])
    fit = inf.clustered_ols(y[:, 0], X, q, vcov=vcov)  # type: ignore[arg-type]
    assert not fit.is_test and fit.estimate.p is None and "1 of 7 questions" in str(fit.estimate.reason)
    y01 = failed.astype(float)  # a 0/1 outcome that varies in one question only
    lfit = clustered_logit(y01, np.column_stack([np.ones(q.size), y[:, 0]]), q, vcov=vcov)  # type: ignore[arg-type]
    assert not lfit.is_test and lfit.estimate.p is None and "1 of 7 questions" in str(lfit.estimate.reason)


def test_contrast_clusters_counts_the_questions_off_the_common_value() -> None:
    q = clusters(7, 4)
    assert inf.contrast_clusters(np.ones(q.size), q) == 7  # the intercept: every question
    assert inf.contrast_clusters(((q < 2) & (np.arange(q.size) % 2 == 0)).astype(float), q) == 2
    assert inf.contrast_clusters((q < 3).astype(float), q) == 3  # all-1 in 3 questions, all-0 in 4
    assert inf.contrast_clusters(np.tile([0.0, 20, 50, 80], 7), q) == 7  # load varies in every question
    s_sim = np.repeat(np.linspace(0.1, 0.7, 7), 4)  # a between-question regressor, all values distinct
    assert inf.contrast_clusters(s_sim, q) == 7
    # only question 0 has Saturation trials: the others sit at load 0 throughout
    assert inf.contrast_clusters(np.where(q == 0, np.tile([0.0, 20, 50, 80], 7), 0.0), q) == 1


def test_cr2_degenerate_direction_is_reported_not_dropped() -> None:
    """A regressor non-zero in one cluster only: CR2's I - H_gg is singular in exactly the tested direction."""
    rng = np.random.default_rng(3)
    q = clusters(8, 6)
    x = np.where(q == 0, rng.normal(size=q.size), 0.0)
    X = np.column_stack([np.ones(q.size), x])
    w, df = inf.sandwich_weights(X, q, 8, 1, "CR2")
    assert math.isnan(df)
    w0, df0 = inf.sandwich_weights(X, q, 8, 0, "CR2")  # the intercept is estimable as before
    assert math.isfinite(df0)


def test_null_rate_when_one_question_carries_the_contrast() -> None:
    rows = sim.null_one_question(7, 7, 60)
    assert all(r.after is not None and r.after <= 0.05 for r in rows)
    assert any(r.before is not None and r.before > 0.2 for r in rows)  # what the old rule did


def test_correlation_below_six_questions_is_descriptive() -> None:
    """H3 obeys the minimum-G rule of every other test; r = +-1 is never a test with p = 0 and [1, 1]."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=5)
    y = 3 * x + 0.1 * rng.normal(size=5)
    five = inf.similarity_correlation(x, y).estimate
    assert not five.is_test and five.p is None and five.ci_low is None
    assert five.value == pytest.approx(scipy.stats.pearsonr(x, y).statistic) and "minimum of 6" in str(five.reason)
    line = inf.similarity_correlation(np.arange(8.0), 2 * np.arange(8.0) + 1, min_n=4).estimate
    assert not line.is_test and line.p is None and line.ci_low is None and "one line" in str(line.reason)
    four = inf.similarity_correlation(np.arange(4.0), -np.arange(4.0), min_n=4).estimate
    assert not four.is_test and four.p is None
    six = inf.similarity_correlation(np.r_[x, 0.3], np.r_[y, 0.0]).estimate
    assert six.is_test and six.p is not None


# ------------------------------------------------------------------------------------- logistic separation


def test_h1_logistic_under_quasi_separation_is_descriptive() -> None:
    """Control right for every question, Saturation wrong but for a few trials at the lowest load: the logistic
    slope's MLE is infinite (quasi-complete separation), so no finite coefficient and p may be reported."""
    from probe.analysis.glm import fit_logit, separation

    q = clusters(8, 8)
    load = np.tile(np.array([0.0, 0.0, 20, 20, 50, 50, 80, 80]), 8)
    y = (load == 0).astype(float)
    y[(load == 20) & (q < 3) & (np.arange(q.size) % 2 == 0)] = 1.0  # a few right answers at 20 %: quasi
    X = sm.add_constant(load)
    sm_fit = sm.GLM(y, X, family=sm.families.Binomial()).fit()  # statsmodels itself stops at a finite slope
    assert np.isfinite(sm_fit.params[1]) and sm_fit.converged
    assert separation(y, X) is not None and "quasi-complete" in str(separation(y, X))
    fit = fit_logit(y, X, q)
    assert fit.status == "separation" and "infinite" in str(fit.reason)
    lfit = clustered_logit(y, X, q)
    assert not lfit.is_test and lfit.estimate.p is None
    y2 = y.copy()
    y2[(load == 50) & (q == 5)] = 1.0  # right answers at two loads: the MLE is finite again
    assert separation(y2, X) is None and fit_logit(y2, X, q).ok


# ------------------------------------------------------------------------------------------ edge cases (issue 18)


def test_t_power_at_large_noncentrality_is_a_number() -> None:
    """scipy's noncentral t is NaN at nc = 20 with 1.5 df; the power is checked against a direct simulation."""
    rng = np.random.default_rng(11)
    for nc, df in ((20.0, 1.5), (10.0, 20.0), (40.0, 20.0)):
        pw = inf.t_power(nc, 1.0, df)
        assert pw.power is not None
        t = (rng.normal(size=400_000) + nc) / np.sqrt(rng.chisquare(df, 400_000) / df)
        crit = scipy.stats.t.ppf(0.975, df)
        assert pw.power == pytest.approx(float(np.mean(np.abs(t) > crit)), abs=3e-3)


def test_sign_flip_is_exact_when_the_mean_difference_is_zero_up_to_rounding() -> None:
    d = np.array([-0.7, -0.6, 0.4, 0.2, 0.3, 0.1, 0.1, 0.2])  # cancels only up to rounding
    assert d.mean() != 0 and abs(d.mean()) < 1e-15
    flips = np.array(list(itertools.product([-1, 1], repeat=8)))
    observed = abs(float(np.sum(d)) / 8)
    # enumeration in exact arithmetic: the observed mean is 0, so every assignment is at least as extreme
    exact = float(np.mean(np.abs((flips * np.round(d * 10)).sum(axis=1)) >= 0))
    t = inf.paired_sign_flip(np.full(8, 0.8), 0.8 - d, np.arange(8))
    assert observed < 1e-15 and t.p == exact == 1.0 and t.is_exact and t.delta == 0.0


def test_fit_logit_takes_a_none_question_label_like_clustered_ols() -> None:
    from probe.analysis.glm import fit_logit

    rng = np.random.default_rng(4)
    g = np.array([None, "a", "b", "c", "d", "e", "f"], dtype=object)[clusters(7, 10)]
    x = rng.normal(size=g.size)
    y = (rng.random(g.size) < 1 / (1 + np.exp(-x))).astype(float)
    X = sm.add_constant(x)
    fit = fit_logit(y, X, g)
    assert fit.ok and fit.n_clusters == 7
    as_str = fit_logit(y, X, g.astype(str))
    assert fit.coefficient(1).se == pytest.approx(as_str.coefficient(1).se)
