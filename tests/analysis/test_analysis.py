"""Analysis of run folders: every estimate checked against statsmodels / scipy called directly on the records,
planted effects recovered, null sets not significant, degenerate cases explained, errors never scored as wrong."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from statsmodels.stats.multitest import multipletests

from probe.analysis import SCHEMA_VERSION, Analysis, AnalysisConfigError, analyze_run, read_analysis
from probe.analysis import inference as inf
from probe.analysis.glm import clustered_logit
from probe.analysis.estimate import Estimate
from probe.analysis.ice import IceResult
from probe.config import AnalysisSection
from probe.records import TrialRecord, append_jsonl
from probe.report import main_table, main_table_text, write_tables
from probe.runfolder import RunFolder
from tests.fixtures.synthetic_run import Plan, make_run, population_h3_r


def ice(analysis: Analysis) -> IceResult:
    """The ICE family's result of an analysis."""
    result = analysis.families["ice"]
    assert isinstance(result, IceResult)
    return result


def read_trials(run_dir: Path) -> pd.DataFrame:
    """The trial file read plainly (independent of probe.analysis.frame)."""
    rows = [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows)


def scored(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["em"].notna() & df["error"].isna() & ~df["skipped"]]


@pytest.fixture(scope="module")
def effect_run(tmp_path_factory) -> tuple[Path, Analysis, Plan]:
    plan = Plan(n_tasks=60, n_reps=3, beta_sat=-0.005, beta_res=-0.004, delta_long=0.0, h3_slope=0.0,
                error_rate=0.04, skip_rate=0.02, truncated_rate=0.03, seed=3)
    run = tmp_path_factory.mktemp("effect")
    make_run(run, plan)
    return run, analyze_run(run, AnalysisSection()), plan


@pytest.fixture(scope="module")
def null_run(tmp_path_factory) -> tuple[Path, Analysis]:
    plan = Plan(n_tasks=40, n_reps=2, beta_sat=0.0, beta_res=0.0, delta_long=0.0, h3_slope=0.0, seed=11)
    run = tmp_path_factory.mktemp("null")
    make_run(run, plan)
    return run, analyze_run(run, AnalysisSection())


# ------------------------------------------------------------------------------------------- cells


def _korn_graubard_wilson(y: np.ndarray, task_ids: pd.Series) -> tuple[float, float]:
    """The cell interval rebuilt from statsmodels: CR1 design effect, (t_{n-1}/t_{G-1})^2, Wilson at n*."""
    n, g = len(y), task_ids.nunique()
    p = y.mean()
    res = sm.OLS(y, np.ones((n, 1))).fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(task_ids)[0]})
    deff = max(1.0, res.bse[0] ** 2 / (p * (1 - p) / n)) if 0 < p < 1 else 1.0
    n_star = n / deff * (scipy.stats.t.ppf(0.975, n - 1) / scipy.stats.t.ppf(0.975, g - 1)) ** 2
    return proportion_confint(p * n_star, n_star, alpha=0.05, method="wilson")


def test_cells_match_a_bounded_interval_rebuilt_from_statsmodels_and_scipy_sem(effect_run):
    run, analysis, _ = effect_run
    df = read_trials(run)
    assert len(ice(analysis).cells) == 10  # Control + 3 loads x 3 conditions
    for c in ice(analysis).cells:
        g = df[(df["model"] == c.model) & (df["condition"] == c.condition) & (df["load"] == c.load)]
        s = scored(g)
        y = s["em"].to_numpy(float)
        assert c.n == len(s) and c.n_trials == len(g)
        assert c.n_error == int(g["error"].notna().sum())
        assert c.n_skipped == int(g["skipped"].sum())
        assert c.em_mean == pytest.approx(y.mean())
        assert c.em_sem == pytest.approx(scipy.stats.sem(y))
        assert (c.em_ci_low, c.em_ci_high) == pytest.approx(_korn_graubard_wilson(y, s["task_id"]))
        assert 0 <= c.em_ci_low < c.em_mean < c.em_ci_high <= 1 and c.em_design_effect >= 1
        assert c.truncated_rate == pytest.approx(s["truncated"].mean() if len(s) else 0.0)
        assert c.hop_recall_mean == pytest.approx(s["hop_recall"].mean())


def test_errors_and_skips_are_counted_not_scored_as_wrong(effect_run):
    run, analysis, _ = effect_run
    df = read_trials(run)
    assert analysis.n_error == int(df["error"].notna().sum()) > 0
    assert analysis.n_skipped == int(df["skipped"].sum()) > 0
    control = next(c for c in ice(analysis).cells if c.condition == "Control")
    g = df[df["condition"] == "Control"]
    # counting errors as wrong answers would give this lower mean; the analysis must not
    as_wrong = g["em"].fillna(0.0).mean()
    assert control.em_mean == pytest.approx(scored(g)["em"].mean())
    assert control.em_mean > as_wrong


# ------------------------------------------------------------------------------------------- H1


def _direct_h1(df: pd.DataFrame, condition: str):
    s = scored(df)
    d = s[((s["condition"] == condition) & (s["load"] > 0)) | (s["condition"] == "Control")]
    x = np.where(d["condition"] == "Control", 0.0, d["load"].astype(float))
    X = sm.add_constant(x)
    groups = pd.factorize(d["task_id"])[0]
    ols = sm.OLS(d["em"].to_numpy(float), X).fit()
    glm = sm.GLM(d["em"].to_numpy(float), X, family=sm.families.Binomial()).fit()
    return ols, glm, d, X


def test_h1_recovers_planted_beta_and_matches_statsmodels(effect_run):
    run, analysis, plan = effect_run
    df = read_trials(run)
    for cond, beta_true in (("Saturation", plan.beta_sat), ("Residue", plan.beta_res)):
        h = next(x for x in ice(analysis).h1 if x.condition == cond)
        ols, glm, d, X = _direct_h1(df, cond)
        y, groups = d["em"].to_numpy(float), d["task_id"].to_numpy()
        assert h.n == len(d) and h.estimate.is_test
        assert (h.intercept, h.estimate.value) == pytest.approx(tuple(ols.params))
        # the small-sample reference: CR2 with Bell-McCaffrey df, exactly as the checked estimator gives it
        ref = inf.clustered_ols(y, X, groups)
        e, r = h.estimate, ref.estimate
        assert (e.se, e.p, e.ci_low, e.ci_high, e.df) == pytest.approx((r.se, r.p, r.ci_low, r.ci_high, r.df))
        assert e.df == pytest.approx(plan.n_tasks - 1, rel=0.05)  # load varies within questions: about G - 1 df
        assert e.p == pytest.approx(2 * scipy.stats.t.sf(abs(e.value / e.se), e.df))
        assert h.estimate.ci_low <= beta_true <= h.estimate.ci_high
        assert h.estimate.p < 0.001
        assert h.logit.estimate.value == pytest.approx(glm.params[1], rel=1e-5)
        lref = clustered_logit(y, X, groups)
        lg, lr = h.logit.estimate, lref.estimate
        assert (lg.se, lg.p, lg.df) == pytest.approx((lr.se, lr.p, lr.df), rel=1e-6)
        assert h.logit.estimate.value < 0
    tax = ice(analysis).taxonomy[0]
    assert tax.is_load_sensitive is True and "load-sensitive" in tax.label


def _nct_power(nc: float, df: float) -> float:
    tc = scipy.stats.t.ppf(0.975, df)
    return float(scipy.stats.nct.sf(tc, df, nc) + scipy.stats.nct.cdf(-tc, df, nc))


def test_h1_power_is_the_noncentral_t_on_the_tests_df(effect_run):
    _, analysis, _ = effect_run
    h = next(x for x in ice(analysis).h1 if x.condition == "LongControl")
    assert h.power.df == h.estimate.df
    e = h.estimate
    assert h.power.power == pytest.approx(_nct_power(abs(e.value) / e.se, e.df), rel=1e-6)
    assert _nct_power(h.power.mde / e.se, e.df) == pytest.approx(0.80, abs=1e-4)  # the MDE has 80 % power


# ------------------------------------------------------------------------------------------- H2


def test_h2_sign_flip_on_direct_pairing_mcnemar_beside_it_bh_over_the_family(effect_run):
    run, analysis, _ = effect_run
    df = scored(read_trials(run))
    key = ["task_id", "replication"]
    rows = ice(analysis).h2
    for k, r in enumerate(rows):
        a = df[(df["condition"] == r.a) & ((df["load"] == r.load) | (r.a == "Control"))]
        b_load = r.load if r.b != "Control" else 0
        b = df[(df["condition"] == r.b) & (df["load"] == b_load)]
        m = a[key + ["em"]].merge(b[key + ["em"]], on=key)
        ya, yb = m["em_x"].to_numpy() == 1, m["em_y"].to_numpy() == 1
        table = [[(ya & yb).sum(), (ya & ~yb).sum()], [(~ya & yb).sum(), (~ya & ~yb).sum()]]
        assert r.test.n_pairs == r.test.mcnemar.n_pairs == len(m) and r.test.n_questions == m["task_id"].nunique()
        assert (r.test.mcnemar.n_a_only, r.test.mcnemar.n_b_only) == (table[0][1], table[1][0])
        assert r.test.mcnemar.p == pytest.approx(mcnemar(table, exact=True).pvalue)
        d = (m["em_x"] - m["em_y"]).groupby(m["task_id"]).mean().to_numpy()  # per-question mean difference
        assert r.test.delta == pytest.approx(d.mean())
        # 60 questions: Monte Carlo sign flips, seeded with the experiment's seed (0 here) plus the row's index
        direct = scipy.stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=9_999,
                                              rng=np.random.default_rng(k))
        assert not r.test.is_exact and r.test.seed == k and r.test.p == pytest.approx(direct.pvalue)
    assert [r.q for r in rows] == pytest.approx(multipletests([r.test.p for r in rows], method="fdr_bh")[1])
    comparisons = {(r.a, r.b) for r in rows}
    assert comparisons == {("LongControl", "Control"), ("Saturation", "LongControl"), ("Residue", "Control"),
                           ("Residue", "Saturation")}
    assert len(rows) == 12
    sat80 = next(r for r in rows if (r.a, r.b, r.load) == ("Saturation", "LongControl", 80))
    assert sat80.q < 0.01 and sat80.test.delta < 0  # planted: 0.4 below LongControl at 80 % (p >= 1/10,000 here)


def test_h2_power_is_the_one_sample_t_of_the_per_question_differences(effect_run):
    run, analysis, _ = effect_run
    r = next(r for r in ice(analysis).h2 if (r.a, r.b, r.load) == ("LongControl", "Control", 50))
    df = scored(read_trials(run))
    a = df[(df["condition"] == "LongControl") & (df["load"] == 50)]
    m = a[["task_id", "replication", "em"]].merge(df[df["condition"] == "Control"][["task_id", "replication", "em"]],
                                                  on=["task_id", "replication"])
    d = (m["em_x"] - m["em_y"]).groupby(m["task_id"]).mean()
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert r.test.power.df == len(d) - 1
    assert r.test.power.power == pytest.approx(_nct_power(abs(d.mean()) / se, len(d) - 1), rel=1e-6)


# ------------------------------------------------------------------------------------------- H3


@pytest.fixture(scope="module")
def h3_run(tmp_path_factory) -> tuple[Path, Analysis, Plan]:
    plan = Plan(n_tasks=150, n_reps=2, conditions=("Control", "Residue"), beta_sat=0.0, beta_res=-0.002,
                h3_slope=1.0, p_control=0.85, task_sd=0.0, seed=5)
    run = tmp_path_factory.mktemp("h3")
    make_run(run, plan)
    return run, analyze_run(run, AnalysisSection()), plan


def test_h3_matches_scipy_and_covers_population_r(h3_run):
    run, analysis, plan = h3_run
    df = scored(read_trials(run))
    control = df[df["condition"] == "Control"].groupby("task_id")["em"].mean()
    res = df[df["condition"] == "Residue"].groupby("task_id").agg(em=("em", "mean"), s=("s_sim", "mean"))
    joined = res.join(control.rename("c"), how="inner")
    x, y = joined["s"].to_numpy(), (joined["c"] - joined["em"]).to_numpy()
    c = next(r for r in ice(analysis).h3 if r.load is None).correlation
    h = c.estimate
    pr = scipy.stats.pearsonr(x, y)
    ci = pr.confidence_interval(0.95)
    assert c.n == len(x) == plan.n_tasks
    assert h.value == pytest.approx(pr.statistic)
    # the p-value of the Fisher-z pivot the interval inverts, so the two always agree
    assert h.p == pytest.approx(2 * scipy.stats.norm.sf(abs(math.atanh(h.value)) * math.sqrt(len(x) - 3)))
    assert (h.ci_low, h.ci_high) == pytest.approx((ci.low, ci.high))
    # Fisher z by hand: tanh(atanh(r) +- z/sqrt(n-3))
    zc = scipy.stats.norm.ppf(0.975)
    assert h.ci_low == pytest.approx(math.tanh(math.atanh(h.value) - zc / math.sqrt(len(x) - 3)), rel=1e-6)
    rank = scipy.stats.spearmanr(x, y)
    assert (c.spearman.value, c.spearman.p) == pytest.approx((rank.statistic, rank.pvalue)) and c.spearman.is_test
    truth = population_h3_r(plan)
    assert truth > 0.2
    assert h.ci_low <= truth <= h.ci_high
    assert h.p < 0.01
    per_load = [r for r in ice(analysis).h3 if r.load is not None]
    assert sorted(r.load for r in per_load) == list(plan.loads)
    assert all(r.correlation.estimate.value is not None for r in per_load)
    rows = [r.correlation.estimate for r in ice(analysis).h3]
    assert [r.q for r in rows] == pytest.approx(multipletests([r.p for r in rows], method="fdr_bh")[1])


# ------------------------------------------------------------------------------------------- null set


def test_null_set_has_nothing_significant(null_run):
    _, analysis = null_run
    alpha = analysis.settings.alpha
    assert all(h.estimate.p >= alpha for h in ice(analysis).h1), \
        [(h.condition, h.estimate.p) for h in ice(analysis).h1]
    assert all(r.q >= alpha for r in ice(analysis).h2), [(r.a, r.b, r.load, r.q) for r in ice(analysis).h2]
    assert all(e.p is None or e.p >= alpha for r in ice(analysis).h3 for e in (r.correlation.estimate,))
    tax = ice(analysis).taxonomy[0]
    assert tax.label == "resilient" and tax.is_load_sensitive is False


# ------------------------------------------------------------------------------------------- degenerate


def _trial(i: int, task: str, cond: str, load: int, rep: int, em: float | None, **kw) -> TrialRecord:
    fields = dict(trial_id=f"m::{i}", model="m", prompt_id=str(i), task_id=task, source="s", condition=cond,
                  load=load, achieved_load=float(load), replication=rep, prompt_tokens=10, output="x", answer="x",
                  gold="x", em=em, hop_recall=None, truncated=False, uninterpretable=False)
    fields.update(kw)
    return TrialRecord(**fields)


def _write(run: Path, trials: list[TrialRecord]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    append_jsonl(run / "trials.jsonl", (t.to_dict() for t in trials))
    return run


def test_no_variance_one_cluster_and_no_pairs_give_reasons(tmp_path):
    trials, i = [], 0
    for cond, load in (("Control", 0), ("Saturation", 20), ("Saturation", 80)):
        for rep in range(5):
            trials.append(_trial(i, "only", cond, load, rep, 1.0))
            i += 1
    trials.append(_trial(i, "only", "Residue", 50, 99, 0.0))  # no Control pair with replication 99
    analysis = analyze_run(_write(tmp_path / "deg", trials), AnalysisSection())
    sat = next(h for h in ice(analysis).h1 if h.condition == "Saturation")
    assert sat.estimate.value is None and "no variance" in sat.estimate.reason
    res = next(h for h in ice(analysis).h1 if h.condition == "Residue")
    # one question: the slope is described, never tested
    e = res.estimate
    assert e.value is not None and not e.is_test and e.p is None and "fewer than the minimum of 6" in e.reason
    assert res.power is None
    lc = [h for h in ice(analysis).h1 if h.condition == "LongControl"]
    assert lc == []  # no LongControl trial: no row
    control = next(c for c in ice(analysis).cells if c.condition == "Control")
    assert control.em_mean == 1.0 and control.em_ci_low is None and "one question" in control.ci_reason
    residue_pair = next(r for r in ice(analysis).h2 if r.a == "Residue" and r.b == "Control")
    assert residue_pair.test.n_pairs == 0 and residue_pair.test.p is None and "no pair" in residue_pair.test.reason
    h3 = ice(analysis).h3[0].correlation.estimate
    assert h3.value is None and h3.reason
    one = next(c for c in ice(analysis).cells if c.condition == "Residue")
    assert one.em_sem is None and one.em_ci_low is None and one.reason is None and one.ci_reason


def test_every_answer_the_same_still_gets_a_bounded_interval(tmp_path):
    trials = [_trial(i, f"q{i % 7}", "Control", 0, i // 7, 1.0) for i in range(14)]
    analysis = analyze_run(_write(tmp_path / "same", trials), AnalysisSection())
    c = ice(analysis).cells[0]
    # every answer the same: one observation per question (design effect n/G = 2), docs/statistics.md
    n_star = 7 * (scipy.stats.t.ppf(0.975, 13) / scipy.stats.t.ppf(0.975, 6)) ** 2
    lo, hi = proportion_confint(n_star, n_star, alpha=0.05, method="wilson")
    assert (c.em_ci_low, c.em_ci_high) == pytest.approx((lo, hi)) and c.em_ci_high == 1.0 and lo < 0.9


def test_one_question_gives_a_mean_without_an_interval(tmp_path):
    ems = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    trials = [_trial(i, "q", "Control", 0, i, e) for i, e in enumerate(ems)]
    analysis = analyze_run(_write(tmp_path / "one", trials), AnalysisSection())
    c = ice(analysis).cells[0]
    assert c.em_mean == pytest.approx(4 / 6) and c.em_ci_low is None and c.em_ci_high is None
    assert c.ci_method is None and "one question" in c.ci_reason


def test_duplicate_pair_keys_are_reported_not_guessed(tmp_path):
    trials = [_trial(0, "q", "Control", 0, 0, 1.0), _trial(1, "q", "Control", 0, 0, 0.0),
              _trial(2, "q", "LongControl", 20, 0, 1.0)]
    analysis = analyze_run(_write(tmp_path / "dup", trials), AnalysisSection())
    r = ice(analysis).h2[0]
    assert r.test.p is None and "ambiguous" in r.test.reason


# ------------------------------------------------------------------------------------------- taxonomy


@pytest.mark.parametrize(
    ("plan", "label"),
    [
        (Plan(n_tasks=15, p_control=0.03, beta_sat=0.0, beta_res=0.0, task_sd=0.0, seed=2), "intrinsic-load brittle"),
        (Plan(n_tasks=15, truncated_rate=0.4, beta_sat=0.0, beta_res=0.0, seed=2), "confounded"),
        (Plan(n_tasks=5, error_rate=1.0, seed=2), "unscorable"),
    ],
)
def test_taxonomy_gates(tmp_path, plan, label):
    make_run(tmp_path / "r", plan)
    analysis = analyze_run(tmp_path / "r", AnalysisSection())
    tax = ice(analysis).taxonomy[0]
    assert tax.label == label
    assert (tax.gates.brittle_em, tax.gates.confound_rate, tax.gates.alpha) == (0.10, 0.20, 0.05)
    df = read_trials(tmp_path / "r")
    if label == "confounded":
        out = df[df["error"].isna() & ~df["skipped"]]
        assert tax.confound_rate_observed == pytest.approx((out["truncated"] | out["uninterpretable"]).mean())
    if label == "intrinsic-load brittle":
        assert tax.control_em == pytest.approx(scored(df[df["condition"] == "Control"])["em"].mean())


# ------------------------------------------------------------------------------------------- outputs


def test_tables_and_text_are_written(effect_run):
    run, analysis, _ = effect_run
    text = main_table_text(analysis)
    assert "Saturation" in text and "H1 model-a" in text and "load-sensitive" in text
    written = write_tables(analysis, run)
    assert RunFolder(run).analysis_md in written and (run / "analysis.md").read_text().count("|") > 50
    cells_csv = pd.read_csv(run / "tables" / "cells.csv")
    assert len(cells_csv) == len(ice(analysis).cells)
    assert cells_csv["em_mean"].to_numpy() == pytest.approx([c.em_mean for c in ice(analysis).cells])
    h1_csv = pd.read_csv(run / "tables" / "h1.csv")
    assert h1_csv["logit_odds_ratio_per_10pp_load"].to_numpy() == pytest.approx(
        [h.logit.odds_ratio_per_10pp_load for h in ice(analysis).h1])
    stored = json.loads((run / "analysis.json").read_text())
    assert stored["schema"] == SCHEMA_VERSION
    assert stored["families"]["ice"]["cells"][0]["em_mean"] == ice(analysis).cells[0].em_mean
    quick = main_table(run)  # from the trials, without analysis.json
    for c in ice(analysis).cells:
        assert f"{c.em_mean:.3f} ({c.em_sem:.3f})" in quick


# ------------------------------------------------------------------------------------------- attention


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory) -> tuple[Path, Analysis, Plan]:
    plan = Plan(n_tasks=24, n_reps=2, loads=(20, 80), conditions=("Control", "Saturation", "Residue"),
                beta_sat=0.0, beta_res=0.0, p_control=0.6, task_sd=0.0, attention=True, attention_effect=1.0,
                tracking_layer=2, n_layers=4, n_heads=3, seed=7)
    run = tmp_path_factory.mktemp("attn")
    make_run(run, plan)
    return run, analyze_run(run, AnalysisSection()), plan


def test_attention_behaviour_finds_the_planted_layer_and_heads_and_matches_statsmodels(attention_run):
    from probe.attention.result import SegmentAttention

    run, analysis, plan = attention_run
    a = ice(analysis).attention_behaviour[0]
    assert a.tracking_layers == (plan.tracking_layer,)  # the per-layer test, BH across layers
    assert a.logit_layers_adjusted == (plan.tracking_layer,)  # the logistic robustness line agrees
    # every head of the planted layer carries the effect; no other head survives BH over the grid
    assert {(h.layer, h.head) for h in a.distractor_heads} == {(plan.tracking_layer, h) for h in range(plan.n_heads)}
    assert {h.layer for h in a.heads.significant} == {plan.tracking_layer}
    df = scored(read_trials(run))
    d = df[df["condition"].isin(["Saturation", "Residue"])].copy()
    folder = RunFolder(run)
    recs = [SegmentAttention.load(folder.attention_record(m, p)) for m, p in zip(d["model"], d["prompt_id"])]
    d["x"] = [float(np.nanmean(r.p_ext[plan.tracking_layer])) for r in recs]
    failed = (d["em"] < 0.5).to_numpy(float)
    groups = d["task_id"].to_numpy()
    # per layer: P_ext on [1, failed, load, Residue], the coefficient of failed
    Xo = np.column_stack([np.ones(len(d)), failed, d["load"].to_numpy(float), (d["condition"] == "Residue")])
    ols = sm.OLS(d["x"].to_numpy(), Xo.astype(float)).fit()
    t = a.layer_tests.layers[plan.tracking_layer]
    assert t.n == len(d) and t.estimate.value == pytest.approx(ols.params[1])
    ref = inf.clustered_ols(d["x"].to_numpy(), Xo.astype(float), groups).estimate
    assert (t.estimate.se, t.estimate.p, t.estimate.df) == pytest.approx((ref.se, ref.p, ref.df))
    assert [x.estimate.q for x in a.layer_tests.layers] == pytest.approx(
        multipletests([x.estimate.p for x in a.layer_tests.layers], method="fdr_bh")[1])
    # per head: the planted layer's first head, on enrichment
    e = np.array([r.enrichment[plan.tracking_layer, 0] for r in recs])
    hit = next(h for h in a.heads.significant if (h.layer, h.head) == (plan.tracking_layer, 0))
    assert hit.estimate.value == pytest.approx(sm.OLS(e, Xo.astype(float)).fit().params[1])
    assert hit.estimate.p == pytest.approx(inf.clustered_ols(e, Xo.astype(float), groups).estimate.p)
    stored = ice(read_analysis(run)).attention_behaviour[0].heads  # its grids as read back from the files
    assert stored is not None and stored.q_values is not None
    assert stored.q_values.shape == (plan.n_layers, plan.n_heads)
    assert stored.q_values.values[plan.tracking_layer, 0] == pytest.approx(hit.q, rel=1e-5)
    # the logistic robustness line: statsmodels' coefficients, CR2 with Bell-McCaffrey df
    X = sm.add_constant(d["x"].to_numpy())
    fit = sm.GLM(failed, X, family=sm.families.Binomial()).fit()
    layer = a.layers[plan.tracking_layer]
    assert layer.n == len(d)
    e = layer.fit.estimate
    assert e.value == pytest.approx(fit.params[1], rel=1e-5)
    lref = clustered_logit(failed, X, groups).estimate
    assert (e.ci_low, e.ci_high, e.df) == pytest.approx((lref.ci_low, lref.ci_high, lref.df), rel=1e-5)
    cells = {(c.condition, c.load, c.measure): c for c in ice(read_analysis(run)).attention_cells}
    assert {k[:2] for k in cells} == {("Control", 0), ("Saturation", 20), ("Saturation", 80), ("Residue", 20),
                                      ("Residue", 80)}
    sat = cells[("Saturation", 80, "p_ext")]
    prompts = [p for p in df["prompt_id"].unique() if "-Saturation-80-" in p]
    mean = np.mean([SegmentAttention.load(folder.attention_record("model-a", p)).p_ext for p in prompts], axis=0)
    np.testing.assert_allclose(sat.values.values, mean, rtol=1e-5)  # float32 storage of a float64 mean
    ar = cells[("Saturation", 80, "ar_k")]
    assert ar.targets == ("germane 1", "germane 2", "question")
    assert ar.values.shape == (plan.n_layers, 3)
    control = cells[("Control", 0, "p_ext")].enrichment
    assert control is not None and np.isnan(control.values).all()  # chance 0: enrichment undefined


def test_attention_heads_max_t_finds_the_planted_layer_and_equals_its_question_contrasts(attention_run):
    """The family-wise option over the head grid: the max-T p-values stored are those of the per-question failed -
    correct contrasts of enrichment residuals on [1, load, Residue] (statsmodels residuals, pandas means here), and
    only heads of the planted layer pass it."""
    from probe.analysis.max_t import max_t_sign_flip
    from probe.attention.result import SegmentAttention

    run, analysis, plan = attention_run
    a = ice(analysis).attention_behaviour[0]
    mt = a.heads.max_t
    assert mt is not None and mt.p_max_t is not None and mt.significant
    assert {h.layer for h in mt.significant} == {plan.tracking_layer}
    df = scored(read_trials(run))
    d = df[df["condition"].isin(["Saturation", "Residue"])].reset_index(drop=True)
    folder = RunFolder(run)
    e = np.stack([SegmentAttention.load(folder.attention_record(m, p)).enrichment
                  for m, p in zip(d["model"], d["prompt_id"])])
    N = np.column_stack([np.ones(len(d)), d["load"].to_numpy(float), (d["condition"] == "Residue").to_numpy(float)])
    resid = np.stack([sm.OLS(e[:, li, h], N).fit().resid for li in range(plan.n_layers)
                      for h in range(plan.n_heads)], axis=1)
    r = pd.DataFrame(resid).assign(q=d["task_id"], f=(d["em"] < 0.5).astype(float))
    both = [q for q in dict.fromkeys(d["task_id"]) if r.loc[r["q"] == q, "f"].nunique() == 2]
    m = r.groupby(["q", "f"]).mean()
    D = np.stack([m.loc[(q, 1.0)].to_numpy() - m.loc[(q, 0.0)].to_numpy() for q in both])
    want = max_t_sign_flip(D.reshape(len(both), plan.n_layers, plan.n_heads), seed=analysis.seed)
    assert mt.n_questions == len(both)
    stored = ice(read_analysis(run)).attention_behaviour[0].heads
    assert stored is not None and stored.max_t is not None and stored.max_t.p_max_t is not None
    np.testing.assert_allclose(stored.max_t.p_max_t.values, want.p_max_t, rtol=1e-6)


def test_attention_layer_without_outcome_variance_is_skipped_with_reason(tmp_path):
    plan = Plan(n_tasks=6, n_reps=1, loads=(50,), conditions=("Control", "Saturation"), p_control=0.98,
                beta_sat=0.0, task_sd=0.0, attention=True, tracking_layer=0, n_layers=2, n_heads=2, seed=1)
    make_run(tmp_path / "a", plan)
    analysis = analyze_run(tmp_path / "a", AnalysisSection())
    a = ice(analysis).attention_behaviour[0]
    assert a.tracking_layers == () and all(r.fit.estimate.value is None for r in a.layers)
    assert all(r.fit.estimate.reason for r in a.layers)
    # every trial right (and 6 questions): nothing to contrast, so no test and no head named
    assert not a.layer_tests.is_test and "no contrast" in a.layer_tests.reason and a.distractor_heads == ()


# ------------------------------------------------------------------------------------------- settings and seed

CONFIG = """[experiment]
name = "seeded"
seed = {seed}
models = ["model-a"]

[[tasks]]
source = "synthetic"
n = 12
hops = 2
"""


def test_h2_monte_carlo_sign_flips_take_the_experiments_seed(tmp_path):
    run = tmp_path / "seeded"
    make_run(run, Plan(n_tasks=20, n_reps=2, loads=(20, 80), beta_sat=-0.004, seed=4))  # > 16 questions: Monte Carlo
    RunFolder(run).config.write_text(CONFIG.format(seed=4321))
    analysis = analyze_run(run)
    assert analysis.seed == 4321 and analysis.seed_source == "config.toml"
    drawn = [(k, r.test) for k, r in enumerate(ice(analysis).h2) if r.test.is_test and r.test.reason is None]
    assert len(drawn) >= 4
    for k, r in drawn:  # comparison k draws its sign flips with the experiment's seed + k
        assert not r.is_exact and r.seed == 4321 + k and r.n_resamples == inf.N_RESAMPLES
    RunFolder(run).config.write_text(CONFIG.format(seed=7))
    other = analyze_run(run)
    again = [r.test for r in ice(other).h2 if r.test.is_test and r.test.reason is None]
    assert [r.seed for r in again] == [7 + k for k, _ in drawn]
    assert [r.p for r in again] != [r.p for _, r in drawn]


def test_an_unreadable_config_is_an_error_not_defaults(tmp_path):
    run = tmp_path / "broken"
    make_run(run, Plan(n_tasks=6, seed=1))
    config = RunFolder(run).config
    config.write_text('[experiment]\nname = "x"\nseed = 3\nnote = "two\nlines"\n')  # a newline in a basic string
    with pytest.raises(AnalysisConfigError, match=r"config\.toml: not valid TOML.*\[analysis\] gates"):
        analyze_run(run)
    assert not RunFolder(run).analysis.exists()
    with pytest.raises(AnalysisConfigError):
        main_table(run)  # the quick table reads the same gates
    config.write_text(CONFIG.format(seed=3) + "\n[analysis]\nalpah = 0.1\n")
    with pytest.raises(AnalysisConfigError, match=r"alpah"):
        analyze_run(run)
    # settings and seed given explicitly: the file is not needed, and the analysis says where they came from
    analysis = analyze_run(run, AnalysisSection(alpha=0.1), seed=5)
    assert (analysis.settings.alpha, analysis.seed, analysis.seed_source) == (0.1, 5, "argument")


def test_a_run_without_config_uses_the_documented_defaults_and_says_so(tmp_path):
    run = tmp_path / "bare"
    make_run(run, Plan(n_tasks=6, seed=1))
    analysis = analyze_run(run)
    assert (analysis.seed, analysis.seed_source) == (0, "default") and analysis.settings == AnalysisSection()
    assert any("no config.toml" in n and "seed 0" in n for n in analysis.notes)


# ------------------------------------------------------------------------------------------- H3 in attention


@pytest.fixture(scope="module")
def residue_attention_run(tmp_path_factory) -> tuple[Path, Analysis, Plan]:
    plan = Plan(n_tasks=20, n_reps=2, loads=(20, 80), conditions=("Control", "Saturation", "Residue"), beta_sat=0.0,
                beta_res=0.0, attention=True, ar_slope=0.5, ar_layer=1, n_layers=4, n_heads=3, seed=13)
    run = tmp_path_factory.mktemp("h3att")
    make_run(run, plan)
    return run, analyze_run(run, AnalysisSection()), plan


def test_h3_in_attention_finds_the_planted_layer_and_matches_statsmodels(residue_attention_run):
    from probe.attention.result import SegmentAttention

    run, analysis, plan = residue_attention_run
    rows = {r.target: r for r in ice(analysis).residue_attention}
    assert set(rows) == {"question", "last germane"}
    for r in rows.values():
        # the planted layer is found, with the smallest q (BH controls the share of false layers, not their number)
        assert r.test.is_test and plan.ar_layer in r.test.significant and r.is_load_adjusted
        assert min(r.test.layers, key=lambda x: x.estimate.q).layer == plan.ar_layer
        assert r.n_prompts == plan.n_tasks * len(plan.loads) * plan.n_reps and r.n_questions == plan.n_tasks
    df = read_trials(run)
    d = df[df["condition"] == "Residue"].drop_duplicates("prompt_id")
    folder = RunFolder(run)
    recs = [SegmentAttention.load(folder.attention_record(m, p)) for m, p in zip(d["model"], d["prompt_id"])]
    y = np.array([r.ar_k_mean[plan.ar_layer, -1] for r in recs])  # the question is the last target
    X = np.column_stack([np.ones(len(d)), d["s_sim"].to_numpy(float), d["load"].to_numpy(float)])
    t = rows["question"].test.layers[plan.ar_layer]
    t = t.estimate
    assert t.value == pytest.approx(sm.OLS(y, X).fit().params[1])
    ref = inf.clustered_ols(y, X, d["task_id"].to_numpy()).estimate
    assert (t.se, t.p, t.df) == pytest.approx((ref.se, ref.p, ref.df))
    assert t.ci_low <= plan.ar_slope <= t.ci_high
    layers = [x.estimate for x in rows["question"].test.layers]
    assert [x.q for x in layers] == pytest.approx(multipletests([x.p for x in layers], method="fdr_bh")[1])
    germane = np.array([r.ar_k_mean[plan.ar_layer, 1] for r in recs])  # germane 2: the last germane segment
    assert rows["last germane"].test.layers[plan.ar_layer].estimate.value == \
        pytest.approx(sm.OLS(germane, X).fit().params[1])


def assert_claims_survive(data: dict, alpha: float = 0.05) -> int:
    """In an ``analysis.json`` (as parsed JSON): every EM interval lies in [0, 1], every correlation interval in
    [-1, 1], and every attention result the analysis names as significant survives its family's correction. Returns
    the number of claims checked."""
    checked = 0
    for fam in data["families"].values():
        cells = list(fam.get("cells", [])) if isinstance(fam.get("cells"), list) else [
            c for knobs in fam.get("cells", {}).values() for c in [knobs["overall"], *knobs["d"], *knobs["N"],
                                                                   *knobs["rho"]]]
        for c in cells:
            if c["em_ci_low"] is not None:
                assert 0.0 <= c["em_ci_low"] <= c["em_mean"] <= c["em_ci_high"] <= 1.0, c
                checked += 1
        for h in (row["correlation"]["estimate"] for row in fam.get("h3", [])):
            if h["ci_low"] is not None:
                assert -1.0 <= h["ci_low"] <= h["ci_high"] <= 1.0 and (h["p"] < alpha) == (h["ci_low"] > 0 or
                                                                                            h["ci_high"] < 0)
                checked += 1
        for a in fam.get("attention_behaviour", []):
            layers = a["layer_tests"]["layers"] if a["layer_tests"] else []
            survive = {x["layer"] for x in layers if (q := x["estimate"]["q"]) is not None and q < alpha}
            assert set(a["layer_tests"]["significant"] if a["layer_tests"] else ()) == survive
            assert set(a["tracking_layers"]) <= survive
            for h in [*(a["heads"]["significant"] if a["heads"] else []), *a["distractor_heads"]]:
                assert h["estimate"]["q"] < alpha
            logit = {x["layer"] for x in a["layers"] if (q := x["fit"]["estimate"]["q"]) is not None and q < alpha}
            adjusted = {x["layer"] for x in a["layers"] if x["adjusted"] and (q := x["adjusted"]["estimate"]["q"])
                        is not None and q < alpha}
            assert set(a["logit_layers"]) <= logit and set(a["logit_layers_adjusted"]) <= adjusted
            checked += len(layers) + len(a["layers"])
        for r in fam.get("residue_attention", []):
            if r["test"]:
                survive = {x["layer"] for x in r["test"]["layers"]
                           if (q := x["estimate"]["q"]) is not None and q < alpha}
                assert set(r["test"]["significant"]) == survive
                checked += len(r["test"]["layers"])
    return checked


def test_no_interval_leaves_its_range_and_no_attention_claim_skips_its_correction(attention_run,
                                                                                  residue_attention_run):
    for run, analysis, _ in (attention_run, residue_attention_run):
        data = json.loads((run / "analysis.json").read_text())
        assert assert_claims_survive(data) > 20
    # the check bites: a layer named without surviving BH, or an interval past 1, is caught
    data = json.loads((attention_run[0] / "analysis.json").read_text())
    a = data["families"]["ice"]["attention_behaviour"][0]
    extra = next(x["layer"] for x in a["layer_tests"]["layers"]
                 if (q := x["estimate"]["q"]) is not None and q >= 0.05)
    a["tracking_layers"] = [*a["tracking_layers"], extra]
    with pytest.raises(AssertionError):
        assert_claims_survive(data)
    data = json.loads((attention_run[0] / "analysis.json").read_text())
    data["families"]["ice"]["cells"][0]["em_ci_high"] = 1.05
    with pytest.raises(AssertionError):
        assert_claims_survive(data)


def test_taxonomy_calls_a_significant_rise_a_rise_not_no_decline() -> None:
    """The summary said "no significant decline with load (β = +0.0052, p = 0.026)" for a significant rise."""
    import dataclasses

    from probe.analysis.hypotheses import H1Fit
    from probe.analysis.taxonomy import classify_model
    from probe.config import AnalysisSection

    df = pd.DataFrame({"model": ["m"] * 4, "condition": ["Control"] * 4, "is_scored": [True] * 4,
                       "em": [1.0, 1.0, 0.0, 1.0], "has_output": [True] * 4, "truncated": [False] * 4,
                       "uninterpretable": [False] * 4, "error": [None] * 4, "skipped": [False] * 4})
    h1 = H1Fit(model="m", condition="Saturation", n=40, n_clusters=10, loads=(0, 20, 80),
               estimate=Estimate(value=0.0052, se=0.002, ci_low=0.001, ci_high=0.009, df=9.0, p=0.026, method="CR2",
                                 is_test=True), intercept=0.5, logit=None, power=None)
    tax = classify_model(df, "m", h1, AnalysisSection())
    assert "no significant" not in tax.reason and "rises" in tax.reason and not tax.is_load_sensitive
    flat = classify_model(df, "m", dataclasses.replace(h1, estimate=dataclasses.replace(h1.estimate, p=0.4)),
                          AnalysisSection())
    assert "no significant change" in flat.reason


# ------------------------------------------------------------------------------------------- scoring path


def _sign_flip_p(d: np.ndarray) -> float:
    """Exact two-sided sign-flip p of the mean of ``d``, by enumerating every sign assignment (no scipy)."""
    import itertools

    obs = abs(d.mean())
    flips = [abs((np.array(s) * d).mean()) for s in itertools.product((1, -1), repeat=len(d))]
    return float(np.mean([f >= obs - 1e-12 for f in flips]))


def _path_trials() -> list[TrialRecord]:
    """12 questions, one replication: Control always boxed; Saturation answers 10 questions by the last line only;
    Residue boxes all but one."""
    trials, i = [], 0
    for q in range(12):
        for cond, load, rule, em in (("Control", 0, "boxed", 1.0),
                                     ("Saturation", 80, "last_line" if q < 10 else "boxed", 1.0 if q % 2 else 0.0),
                                     ("Residue", 80, "last_line" if q == 0 else "boxed", 1.0)):
            trials.append(_trial(i, f"q{q:02d}", cond, load, 0, em, extraction=rule))
            i += 1
    return trials


def test_strict_em_and_rule_shares_per_cell_match_a_direct_count(tmp_path):
    trials = _path_trials()
    analysis = analyze_run(_write(tmp_path / "path", trials), AnalysisSection())
    df = pd.DataFrame([t.to_dict() for t in trials])
    for c in ice(analysis).cells:
        g = df[(df["condition"] == c.condition) & (df["load"] == c.load)]
        strict = (g["em"] * g["extraction"].isin(["boxed", "answer_line"])).to_numpy(float)
        assert c.strict_em_mean == pytest.approx(strict.mean())
        assert c.extraction_shares == pytest.approx(g["extraction"].value_counts(normalize=True).to_dict())
        if 0 < strict.mean() < 1:
            assert (c.strict_em_ci_low, c.strict_em_ci_high) == pytest.approx(
                _korn_graubard_wilson(strict, g["task_id"]))
    sat = next(c for c in ice(analysis).cells if c.condition == "Saturation")
    assert sat.em_mean == pytest.approx(6 / 12) and sat.strict_em_mean == pytest.approx(1 / 12)


def test_a_condition_that_stops_boxing_is_flagged_against_control(tmp_path):
    trials = _path_trials()
    analysis = analyze_run(_write(tmp_path / "path", trials), AnalysisSection())
    df = pd.DataFrame([t.to_dict() for t in trials])
    strict = df.assign(s=df["extraction"].isin(["boxed", "answer_line"]).astype(float)).pivot(
        index="task_id", columns="condition", values="s")
    cells = {c.condition: c for c in ice(analysis).cells}
    for cond, flagged in (("Saturation", True), ("Residue", False)):
        d = (strict[cond] - strict["Control"]).to_numpy()
        assert cells[cond].scoring_path_p == pytest.approx(_sign_flip_p(d))
        assert cells[cond].scoring_path_delta == pytest.approx(d.mean())
        assert cells[cond].scoring_path_shift is flagged
    assert cells["Saturation"].scoring_path_p < 0.01 and cells["Residue"].scoring_path_p == 1.0
    assert cells["Control"].scoring_path_p is None and cells["Control"].scoring_path_shift is None
    text = main_table_text(analysis)
    assert "strict EM" in text and "box 17% last 83% § p=0.002" in text and "§ = the mix differs" in text


def test_records_without_a_scoring_rule_give_reasons_not_numbers(tmp_path):
    trials = [_trial(i, f"q{i % 8}", cond, load, 0, 1.0) for i, (cond, load) in
              enumerate([("Control", 0)] * 8 + [("Saturation", 80)] * 8)]
    analysis = analyze_run(_write(tmp_path / "old", trials), AnalysisSection())
    sat = next(c for c in ice(analysis).cells if c.condition == "Saturation")
    assert sat.em_mean == 1.0 and sat.strict_em_mean is None and sat.extraction_shares is None
    assert sat.scoring_path_p is None and "no output with a recorded scoring rule" in sat.scoring_path_reason
