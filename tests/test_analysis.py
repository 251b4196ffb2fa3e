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

from probe.analysis import Analysis, AnalysisConfigError, analyze_run
from probe.analysis.hypotheses import mcnemar_power, wald_power
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


def test_cells_match_statsmodels_cluster_ci_and_scipy_sem(effect_run):
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
        res = sm.OLS(y, np.ones((len(y), 1))).fit(
            cov_type="cluster", cov_kwds={"groups": pd.factorize(s["task_id"])[0]}, use_t=True)
        lo, hi = res.conf_int(0.05)[0]
        assert (c.em_ci_low, c.em_ci_high) == pytest.approx((lo, hi))
        assert c.em_ci_low < c.em_mean < c.em_ci_high
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
    ols = sm.OLS(d["em"].to_numpy(float), X).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    glm = sm.GLM(d["em"].to_numpy(float), X, family=sm.families.Binomial()).fit(
        cov_type="cluster", cov_kwds={"groups": groups})
    return ols, glm, len(d)


def test_h1_recovers_planted_beta_and_matches_statsmodels(effect_run):
    run, analysis, plan = effect_run
    df = read_trials(run)
    for cond, beta_true in (("Saturation", plan.beta_sat), ("Residue", plan.beta_res)):
        h = next(x for x in ice(analysis).h1 if x.condition == cond)
        ols, glm, n = _direct_h1(df, cond)
        assert h.n == n
        assert h.beta == pytest.approx(ols.params[1])
        assert h.se == pytest.approx(ols.bse[1])
        assert h.p == pytest.approx(ols.pvalues[1])
        assert (h.ci_low, h.ci_high) == pytest.approx(tuple(ols.conf_int(0.05)[1]))
        assert h.ci_low <= beta_true <= h.ci_high
        assert h.p < 0.001
        assert h.logit.coef == pytest.approx(glm.params[1], rel=1e-5)
        assert h.logit.p == pytest.approx(glm.pvalues[1], rel=1e-4)
        assert h.logit.coef < 0
    tax = ice(analysis).taxonomy[0]
    assert tax.is_load_sensitive is True and "load-sensitive" in tax.label


def test_h1_power_matches_normal_theory(effect_run):
    _, analysis, _ = effect_run
    h = next(x for x in ice(analysis).h1 if x.condition == "LongControl")
    z = abs(h.beta) / h.se
    zc = scipy.stats.norm.ppf(0.975)
    expected = scipy.stats.norm.cdf(z - zc) + scipy.stats.norm.cdf(-z - zc)
    assert h.power.power == pytest.approx(expected, rel=1e-6)
    # the one-tailed closed form ignores the far tail (< 1e-4 of the power at 80 %)
    assert h.power.mde_80 == pytest.approx((zc + scipy.stats.norm.ppf(0.8)) * h.se, rel=1e-4)
    direct = wald_power(0.01, 0.005, 100)
    assert direct.power == pytest.approx(scipy.stats.norm.cdf(2 - zc) + scipy.stats.norm.cdf(-2 - zc), rel=1e-6)


# ------------------------------------------------------------------------------------------- H2


def test_h2_mcnemar_matches_direct_pairing(effect_run):
    run, analysis, _ = effect_run
    df = scored(read_trials(run))
    key = ["task_id", "replication"]
    checked = 0
    for r in ice(analysis).h2:
        a = df[(df["condition"] == r.a) & ((df["load"] == r.load) | (r.a == "Control"))]
        b_load = r.load if r.b != "Control" else 0
        b = df[(df["condition"] == r.b) & (df["load"] == b_load)]
        m = a[key + ["em"]].merge(b[key + ["em"]], on=key)
        ya, yb = m["em_x"].to_numpy() == 1, m["em_y"].to_numpy() == 1
        table = [[(ya & yb).sum(), (ya & ~yb).sum()], [(~ya & yb).sum(), (~ya & ~yb).sum()]]
        assert r.n_pairs == len(m)
        assert (r.n_a_only, r.n_b_only) == (table[0][1], table[1][0])
        assert r.p == pytest.approx(mcnemar(table, exact=True).pvalue)
        assert r.delta == pytest.approx(m["em_x"].mean() - m["em_y"].mean())
        checked += 1
    comparisons = {(r.a, r.b) for r in ice(analysis).h2}
    assert comparisons == {("LongControl", "Control"), ("Saturation", "LongControl"), ("Residue", "Control"),
                           ("Residue", "Saturation")}
    assert checked == 12
    sat80 = next(r for r in ice(analysis).h2 if (r.a, r.b, r.load) == ("Saturation", "LongControl", 80))
    assert sat80.p < 0.001 and sat80.delta < 0  # planted: 0.4 below LongControl at 80 %


def test_mcnemar_power_simulation_matches_exact_enumeration():
    n, b, c = 40, 12, 3
    sim = mcnemar_power(n, b, c, alpha=0.05, n_sim=4000, seed=1).power
    probs = np.array([b, c, n - b - c]) / n
    exact = 0.0
    for i in range(n + 1):
        for j in range(n + 1 - i):
            p_ij = scipy.stats.multinomial.pmf([i, j, n - i - j], n, probs)
            p_val = 1.0 if i + j == 0 else scipy.stats.binomtest(i, i + j, 0.5).pvalue
            exact += p_ij * (p_val < 0.05)
    assert sim == pytest.approx(exact, abs=0.03)


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
    h = next(r for r in ice(analysis).h3 if r.load is None)
    pr = scipy.stats.pearsonr(x, y)
    ci = pr.confidence_interval(0.95)
    assert h.n_tasks == len(x) == plan.n_tasks
    assert h.r == pytest.approx(pr.statistic)
    assert h.p == pytest.approx(pr.pvalue)
    assert (h.ci_low, h.ci_high) == pytest.approx((ci.low, ci.high))
    # Fisher z by hand: tanh(atanh(r) +- z/sqrt(n-3))
    zc = scipy.stats.norm.ppf(0.975)
    assert h.ci_low == pytest.approx(math.tanh(math.atanh(h.r) - zc / math.sqrt(len(x) - 3)), rel=1e-6)
    assert h.spearman_rho == pytest.approx(scipy.stats.spearmanr(x, y).statistic)
    truth = population_h3_r(plan)
    assert truth > 0.2
    assert h.ci_low <= truth <= h.ci_high
    assert h.p < 0.01
    per_load = [r for r in ice(analysis).h3 if r.load is not None]
    assert sorted(r.load for r in per_load) == list(plan.loads)
    assert all(r.r is not None for r in per_load)


# ------------------------------------------------------------------------------------------- null set


def test_null_set_has_nothing_significant(null_run):
    _, analysis = null_run
    alpha = analysis.settings.alpha
    assert all(h.p >= alpha for h in ice(analysis).h1), [(h.condition, h.p) for h in ice(analysis).h1]
    assert all(r.p >= alpha for r in ice(analysis).h2), [(r.a, r.b, r.load, r.p) for r in ice(analysis).h2]
    assert all(r.p is None or r.p >= alpha for r in ice(analysis).h3)
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
    analysis = analyze_run(_write(tmp_path / "deg", trials), AnalysisSection(), fill_similarity=False)
    sat = next(h for h in ice(analysis).h1 if h.condition == "Saturation")
    assert sat.beta is None and "no variance" in sat.reason
    res = next(h for h in ice(analysis).h1 if h.condition == "Residue")
    # one Residue trial against constant Control trials: every residual is 0, so is the SE; no fake p
    assert res.beta is None and "standard error of β is 0" in res.reason
    lc = [h for h in ice(analysis).h1 if h.condition == "LongControl"]
    assert lc == []  # no LongControl trial: no row
    control = next(c for c in ice(analysis).cells if c.condition == "Control")
    lo, hi = proportion_confint(5, 5, alpha=0.05, method="wilson")
    assert (control.em_ci_low, control.em_ci_high) == pytest.approx((lo, hi))
    assert "wilson" in control.ci_method
    residue_pair = next(r for r in ice(analysis).h2 if r.a == "Residue" and r.b == "Control")
    assert residue_pair.n_pairs == 0 and residue_pair.p is None and "no pair" in residue_pair.reason
    h3 = ice(analysis).h3[0]
    assert h3.r is None and h3.reason
    one = next(c for c in ice(analysis).cells if c.condition == "Residue")
    assert one.em_sem is None and one.reason == "one scored trial: no standard error"


def test_one_cluster_with_variance_falls_back_to_iid(tmp_path):
    ems = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    trials = [_trial(i, "q", "Control", 0, i, e) for i, e in enumerate(ems)]
    analysis = analyze_run(_write(tmp_path / "one", trials), AnalysisSection(), fill_similarity=False)
    c = ice(analysis).cells[0]
    res = sm.OLS(np.array(ems), np.ones((6, 1))).fit(use_t=True)
    assert (c.em_ci_low, c.em_ci_high) == pytest.approx(tuple(res.conf_int(0.05)[0]))
    assert c.ci_method.startswith("iid")


def test_duplicate_pair_keys_are_reported_not_guessed(tmp_path):
    trials = [_trial(0, "q", "Control", 0, 0, 1.0), _trial(1, "q", "Control", 0, 0, 0.0),
              _trial(2, "q", "LongControl", 20, 0, 1.0)]
    analysis = analyze_run(_write(tmp_path / "dup", trials), AnalysisSection(), fill_similarity=False)
    r = ice(analysis).h2[0]
    assert r.p is None and "ambiguous" in r.reason


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
    analysis = analyze_run(tmp_path / "r", AnalysisSection(), fill_similarity=False)
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
    assert stored["schema"] == 2 and stored["families"]["ice"]["cells"][0]["em_mean"] == ice(analysis).cells[0].em_mean
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


def test_attention_behaviour_finds_the_planted_layer_and_matches_glm(attention_run):
    from probe.attention.result import SegmentAttention

    run, analysis, plan = attention_run
    a = ice(analysis).attention_behaviour[0]
    assert plan.tracking_layer in a.tracking_layers_adjusted
    assert a.tracking_layers_adjusted == (plan.tracking_layer,)
    df = scored(read_trials(run))
    d = df[df["condition"].isin(["Saturation", "Residue"])].copy()
    folder = RunFolder(run)
    d["x"] = [float(np.nanmean(SegmentAttention.load(folder.attention_record(m, p)).p_ext[plan.tracking_layer]))
              for m, p in zip(d["model"], d["prompt_id"])]
    X = sm.add_constant(d["x"].to_numpy())
    fit = sm.GLM((d["em"] < 0.5).to_numpy(float), X, family=sm.families.Binomial()).fit(
        cov_type="cluster", cov_kwds={"groups": pd.factorize(d["task_id"])[0]})
    layer = a.layers[plan.tracking_layer]
    assert layer.n == len(d)
    assert layer.coef == pytest.approx(fit.params[1], rel=1e-5)
    assert (layer.ci_low, layer.ci_high) == pytest.approx(tuple(fit.conf_int(0.05)[1]), rel=1e-5)
    cells = {(c.condition, c.load): c for c in ice(analysis).attention_cells}
    assert set(cells) == {("Control", 0), ("Saturation", 20), ("Saturation", 80), ("Residue", 20), ("Residue", 80)}
    with np.load(run / "attention_summary.npz") as z:
        sat = cells[("Saturation", 80)]
        prompts = [p for p in df["prompt_id"].unique() if "-Saturation-80-" in p]
        mean = np.mean([SegmentAttention.load(folder.attention_record("model-a", p)).p_ext for p in prompts], axis=0)
        np.testing.assert_allclose(z[sat.p_ext_key], mean, rtol=1e-5)
        assert sat.ar_targets == ("germane 1", "germane 2", "question")
        assert z[sat.ar_k_key].shape == (plan.n_layers, 3)
        assert np.isnan(z[cells[("Control", 0)].enrichment_key]).all()  # chance 0: enrichment undefined


def test_attention_layer_without_outcome_variance_is_skipped_with_reason(tmp_path):
    plan = Plan(n_tasks=6, n_reps=1, loads=(50,), conditions=("Control", "Saturation"), p_control=0.98,
                beta_sat=0.0, task_sd=0.0, attention=True, tracking_layer=0, n_layers=2, n_heads=2, seed=1)
    make_run(tmp_path / "a", plan)
    analysis = analyze_run(tmp_path / "a", AnalysisSection())
    a = ice(analysis).attention_behaviour[0]
    assert a.tracking_layers == () and all(r.coef is None for r in a.layers)
    assert a.reason and all(r.reason for r in a.layers)


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


def test_h2_power_simulation_takes_the_experiments_seed(tmp_path):
    run = tmp_path / "seeded"
    make_run(run, Plan(n_tasks=12, n_reps=2, loads=(20, 80), beta_sat=-0.004, seed=4))
    RunFolder(run).config.write_text(CONFIG.format(seed=4321))
    analysis = analyze_run(run, fill_similarity=False)
    assert analysis.seed == 4321 and analysis.seed_source == "config.toml"
    simulated = [(k, r) for k, r in enumerate(ice(analysis).h2) if r.power is not None]
    assert len(simulated) >= 4
    for k, r in simulated:  # comparison k simulates with the experiment's seed + k
        assert r.power.seed == 4321 + k
        assert r.power.power == mcnemar_power(r.n_pairs, r.n_a_only, r.n_b_only, 0.05, 500, 4321 + k).power
    RunFolder(run).config.write_text(CONFIG.format(seed=7))
    other = analyze_run(run, fill_similarity=False)
    assert [r.power.seed for r in ice(other).h2 if r.power] == [7 + k for k, _ in simulated]
    assert [r.power.power for r in ice(other).h2 if r.power] != [r.power.power for _, r in simulated]


def test_an_unreadable_config_is_an_error_not_defaults(tmp_path):
    run = tmp_path / "broken"
    make_run(run, Plan(n_tasks=6, seed=1))
    config = RunFolder(run).config
    config.write_text('[experiment]\nname = "x"\nseed = 3\nnote = "two\nlines"\n')  # a newline in a basic string
    with pytest.raises(AnalysisConfigError, match=r"config\.toml: not valid TOML.*\[analysis\] gates"):
        analyze_run(run, fill_similarity=False)
    assert not RunFolder(run).analysis.exists()
    with pytest.raises(AnalysisConfigError):
        main_table(run)  # the quick table reads the same gates
    config.write_text(CONFIG.format(seed=3) + "\n[analysis]\nalpah = 0.1\n")
    with pytest.raises(AnalysisConfigError, match=r"alpah"):
        analyze_run(run, fill_similarity=False)
    # settings and seed given explicitly: the file is not needed, and the analysis says where they came from
    analysis = analyze_run(run, AnalysisSection(alpha=0.1), seed=5, fill_similarity=False)
    assert (analysis.settings.alpha, analysis.seed, analysis.seed_source) == (0.1, 5, "argument")


def test_a_run_without_config_uses_the_documented_defaults_and_says_so(tmp_path):
    run = tmp_path / "bare"
    make_run(run, Plan(n_tasks=6, seed=1))
    analysis = analyze_run(run, fill_similarity=False)
    assert (analysis.seed, analysis.seed_source) == (0, "default") and analysis.settings == AnalysisSection()
    assert any("no config.toml" in n and "seed 0" in n for n in analysis.notes)
