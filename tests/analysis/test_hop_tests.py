"""Tests of the hop masses (probe.analysis.hop_tests) and the per-question contrasts of the max-T (probe.analysis.max_t).

Estimates are checked against statsmodels OLS on a design built here by hand, p-values against the scalar clustered
estimator on the same columns, the per-question contrasts against statsmodels residuals averaged with pandas, and
the max-T p-values against a direct enumeration of sign flips. Planted effects are put into the masses by the test.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from probe.analysis.hop_tests import FAILED_CORRECT, SATURATION_CONTROL, SATURATION_LONGCONTROL, hop_mass_tests
from probe.analysis.hops import CATEGORIES, HopRow
from probe.analysis.inference import clustered_ols
from probe.analysis.max_t import question_contrasts
from scripts.simulate import simulate_failed_null

L, H = 3, 4
HOP, EXT = CATEGORIES.index("hop"), CATEGORIES.index("extraneous")
BASE = HopRow(trial_id="", model="m", task_id="", condition="", load=0, hop=0, n_hops=2, target="hop_answer",
              entity="x", label="other", label_value=None, top_segment=None, top_segment_value=None,
              entity_in_distractor=False, n_mentions=1, token_start=0, token_end=1, mass=None, vmass=None, em=1.0)


def study(n_questions: int = 16, seed: int = 0, fail_ext: tuple[int, int] | None = None,
          sat_hop: tuple[int, int] | None = None, effect: float = 0.25, long_hop: tuple[int, int] | None = None,
          long_control: bool = False) -> tuple[list[HopRow], list[np.ndarray | None]]:
    """Trial-hops of Control, Saturation and Residue at loads 20 and 80 (and LongControl at both with
    ``long_control``), two hops each, a fifth of them not named (no mass). Failure rises with load and so does every
    head's extraneous mass (confounding); ``fail_ext`` gains ``effect`` extraneous mass in failed trials, ``sat_hop``
    loses ``effect`` hop mass under Saturation at 80 %, ``long_hop`` loses it in every long prompt at 80 %
    (Saturation and LongControl: an effect of length alone)."""
    rng = np.random.default_rng(seed)
    rows: list[HopRow] = []
    masses: list[np.ndarray | None] = []
    cells = (("Control", 0), ("Saturation", 20), ("Saturation", 80), ("Residue", 20), ("Residue", 80))
    if long_control:
        cells += (("LongControl", 20), ("LongControl", 80))
    for q in range(n_questions):
        q_eff = rng.normal(0, 0.05, size=(L, H))
        for cond, load in cells:
            em = float(rng.random() > 0.15 + 0.5 * (load == 80) + 0.1 * (q % 3 == 0))
            for hop in (0, 1):
                m = rng.normal(0.2, 0.04, size=(L, H, len(CATEGORIES))) + q_eff[..., None]
                m[..., EXT] = 0.0 if cond in ("Control", "LongControl") else m[..., EXT] + 0.001 * load
                m[..., HOP] += 0.03 * hop
                if fail_ext is not None and em < 0.5 and cond != "Control":
                    m[fail_ext + (EXT,)] += effect
                if sat_hop is not None and cond == "Saturation" and load == 80:
                    m[sat_hop + (HOP,)] -= effect
                if long_hop is not None and cond in ("Saturation", "LongControl") and load == 80:
                    m[long_hop + (HOP,)] -= effect
                named = rng.random() > 0.2
                rows.append(replace(BASE, trial_id=f"q{q}{cond}{load}", task_id=f"q{q}", condition=cond, load=load,
                                    hop=hop, em=em, target="wrong_answer" if hop == 1 and em < 0.5 else "hop_answer",
                                    label="other" if named else "not_named", n_mentions=int(named)))
                masses.append(m if named else None)
    return rows, masses


def frame(rows: list[HopRow], masses: list[np.ndarray | None]) -> pd.DataFrame:
    """The named trial-hops as a table (``i``: the row's index in ``rows``)."""
    keep = [i for i, m in enumerate(masses) if m is not None]
    rows = [rows[i] for i in keep]
    return pd.DataFrame({"q": [r.task_id for r in rows], "cond": [r.condition for r in rows],
                         "load": [float(r.load) for r in rows], "hop": [float(r.hop) for r in rows],
                         "failed": [float(r.em is not None and r.em < 0.5) for r in rows], "i": keep})


def test_failed_correct_matches_statsmodels_and_the_scalar_estimator():
    rows, masses = study()
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES, seed=1)
    fc = next(t for t in tests if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    df = frame(rows, masses)
    d = df[df["cond"].isin(["Saturation", "Residue"])]
    X = np.column_stack([np.ones(len(d)), d["failed"], d["load"], (d["cond"] == "Residue").astype(float),
                         d["hop"]])  # 2-hop tasks: the last hop is hop 1 (one column, not two)
    Y = np.stack([masses[i][..., EXT] for i in d["i"]])
    assert fc.n == len(d) and fc.n_questions == d["q"].nunique()
    est = fc.heads.estimates.values
    for li, h in itertools.product(range(L), range(H)):
        assert est[li, h] == pytest.approx(sm.OLS(Y[:, li, h], X).fit().params[1], abs=1e-6)
    ref = clustered_ols(Y.mean(axis=2)[:, 1], X, d["q"].to_numpy(), term=1)
    lt = fc.layers.layers[1].estimate
    assert (lt.value, lt.p, lt.df) == (pytest.approx(ref.estimate.value), pytest.approx(ref.estimate.p),
                                       pytest.approx(ref.estimate.df))
    assert fc.layers.is_test and fc.heads.is_test and fc.heads.max_t.p_max_t is not None


def test_question_contrasts_are_residual_means_per_question_and_max_t_enumerates():
    rows, masses = study(n_questions=8, seed=3)
    df = frame(rows, masses)
    d = df[df["cond"].isin(["Saturation", "Residue"])].reset_index(drop=True)
    Y = np.stack([masses[i][..., EXT] for i in d["i"]])
    N = np.column_stack([np.ones(len(d)), d["load"], (d["cond"] == "Residue").astype(float), d["hop"]])
    qc = question_contrasts(Y, d["failed"].to_numpy(), d["q"].to_numpy(), N)
    # independent: statsmodels residuals, pandas group means
    resid = np.stack([sm.OLS(Y[:, li, h], N).fit().resid for li in range(L) for h in range(H)], axis=1)
    r = pd.DataFrame(resid).assign(q=d["q"], f=d["failed"])
    means = r.groupby(["q", "f"]).mean()
    both = [q for q in dict.fromkeys(d["q"]) if {0.0, 1.0} <= set(d.loc[d["q"] == q, "failed"])]
    want = np.stack([means.loc[(q, 1.0)].to_numpy() - means.loc[(q, 0.0)].to_numpy() for q in both])
    assert list(qc.questions) == both and qc.n_dropped == d["q"].nunique() - len(both)
    np.testing.assert_allclose(qc.D.reshape(len(both), -1), want, atol=1e-10)
    # the p_max_t stored by the test is the direct enumeration of sign flips of those contrasts
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES)
    fc = next(t for t in tests if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    assert fc.heads.max_t.n_questions == len(both) and "exact, all 2^G" in fc.heads.max_t.method

    def tstat(x: np.ndarray) -> np.ndarray:
        return x.mean(0) / (x.std(0, ddof=1) / np.sqrt(len(x)))

    obs = np.abs(tstat(want))
    maxes = np.array([np.abs(tstat(np.array(s)[:, None] * want)).max()
                      for s in itertools.product((1, -1), repeat=len(both))])
    np.testing.assert_allclose(fc.heads.max_t.p_max_t.values.ravel(), [(maxes >= o - 1e-12).mean() for o in obs],
                               rtol=1e-6)


def test_a_planted_failure_head_is_found_by_max_t_and_only_it():
    rows, masses = study(n_questions=20, seed=5, fail_ext=(2, 1))
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES, seed=2)
    fc = next(t for t in tests if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    pm = fc.heads.max_t.p_max_t.values
    assert pm[2, 1] < 0.05
    assert np.all(np.delete(pm.ravel(), 2 * H + 1) >= 0.05)
    assert (2, 1) in {(h.layer, h.head) for h, _ in fc.heads.listed()}
    assert 2 in fc.layers.significant  # the head-pooled layer carries it too
    # without the plant: the load confounding alone finds nothing under max-T
    rows0, masses0 = study(n_questions=20, seed=5)
    tests0 = hop_mass_tests(rows0, masses0, "m", "raw", CATEGORIES, seed=2)
    fc0 = next(t for t in tests0 if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    assert np.all(fc0.heads.max_t.p_max_t.values >= 0.05)


def test_saturation_control_per_load_finds_the_planted_drop():
    rows, masses = study(n_questions=12, seed=7, sat_hop=(0, 3))
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES, seed=2)
    sc = {t.load: t for t in tests if t.contrast == SATURATION_CONTROL}
    assert set(sc) == {20, 80} and all(t.category == "hop" for t in sc.values())  # extraneous: 0 in Control
    df = frame(rows, masses)
    d = df[(df["cond"] == "Control") | ((df["cond"] == "Saturation") & (df["load"] == 80))]
    X = np.column_stack([np.ones(len(d)), (d["cond"] == "Saturation").astype(float), d["hop"]])
    Y = np.stack([masses[i][0, 3, HOP] for i in d["i"]])
    assert sc[80].heads.estimates.values[0, 3] == pytest.approx(sm.OLS(Y, X).fit().params[1], abs=1e-6)
    assert sc[80].heads.max_t.p_max_t.values[0, 3] < 0.05
    assert sc[20].heads.max_t.p_max_t.values[0, 3] >= 0.05


def test_saturation_longcontrol_separates_distraction_from_length():
    """A drop of the hop mass in every long prompt at 80 % (head 1.2: length) and one under Saturation only (head
    0.3: distraction). Saturation − Control finds both; Saturation − LongControl, at equal length, only the second;
    its estimate is statsmodels OLS on the Saturation and LongControl rows at 80 %."""
    rows, masses = study(n_questions=14, seed=5, sat_hop=(0, 3), long_hop=(1, 2), long_control=True)
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES, seed=2)
    sc = {t.load: t for t in tests if t.contrast == SATURATION_CONTROL}
    sl = {t.load: t for t in tests if t.contrast == SATURATION_LONGCONTROL}
    assert set(sl) == {20, 80} and all(t.category == "hop" for t in sl.values())
    assert "equal prompt length" in sl[80].estimand and "LongControl trials at 80 %" in sl[80].estimand
    p_sc, p_sl = sc[80].heads.max_t.p_max_t.values, sl[80].heads.max_t.p_max_t.values
    assert p_sc[0, 3] < 0.05 and p_sc[1, 2] < 0.05
    assert p_sl[0, 3] < 0.05 and p_sl[1, 2] >= 0.05
    df = frame(rows, masses)
    d = df[df["cond"].isin(["Saturation", "LongControl"]) & (df["load"] == 80)]
    X = np.column_stack([np.ones(len(d)), (d["cond"] == "Saturation").astype(float), d["hop"]])
    for head in ((0, 3), (1, 2)):
        Y = np.stack([masses[i][head + (HOP,)] for i in d["i"]])
        assert sl[80].heads.estimates.values[head] == pytest.approx(sm.OLS(Y, X).fit().params[1], abs=1e-6)
    # without LongControl trials the contrast is not offered
    plain = hop_mass_tests(*study(n_questions=6, seed=5), "m", "raw", CATEGORIES)
    assert not [t for t in plain if t.contrast == SATURATION_LONGCONTROL]


def test_too_few_rows_or_one_side_say_why():
    rows, masses = study(n_questions=3)
    only_ok = [replace(r, em=1.0) for r in rows]
    tests = hop_mass_tests(only_ok, masses, "m", "raw", CATEGORIES)
    fc = [t for t in tests if t.contrast == FAILED_CORRECT]
    assert fc and all(t.layers is None and "every trial is correct" in (t.reason or "") for t in fc)
    tests = hop_mass_tests(rows[:2], masses[:2], "m", "raw", CATEGORIES)
    assert all(t.reason is not None for t in tests)
    few = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES)  # 3 questions: descriptive
    f = next(t for t in few if t.contrast == FAILED_CORRECT)
    assert f.layers is not None and not f.layers.is_test and f.heads is not None and not f.heads.significant


def test_simulated_family_wise_error_and_power():
    rates = simulate_failed_null(n_sims=150, n_questions=10, grid=(4, 4), n_resamples=199, seed=4, clustered=False)
    assert rates["max_t"] <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 150)
    assert rates["max_t_raw"] > 0.15  # without the adjustment, load alone makes failed trials differ
    power = simulate_failed_null(n_sims=40, n_questions=20, grid=(4, 4), n_resamples=199, seed=5, effect=3.0,
                                 planted=(1, 2), clustered=False)
    assert power["found"] >= 0.9


def test_a_non_finite_mass_leaves_its_row_out_of_the_max_t_and_ends_nothing():
    """One trial-hop whose mass is NaN in one head (a record with a non-finite value): the clustered fits leave that
    head's row out, the max-T step drops the row (every head needs a value) and says so; every test is still made,
    and its max-T p-values equal those of the study without that row."""
    rows, masses = study(n_questions=12, seed=3, fail_ext=(1, 2))
    bad = next(i for i, (r, m) in enumerate(zip(rows, masses)) if m is not None and r.condition == "Saturation")
    broken = list(masses)
    broken[bad] = masses[bad].copy()
    broken[bad][0, 0, EXT] = np.nan
    tests = hop_mass_tests(rows, broken, "m", "raw", CATEGORIES, seed=2)
    without = hop_mass_tests(rows, [None if i == bad else m for i, m in enumerate(masses)], "m", "raw", CATEGORIES,
                             seed=2)
    fc = next(t for t in tests if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    ref = next(t for t in without if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    assert fc.heads is not None and fc.heads.max_t is not None and fc.heads.max_t.p_max_t is not None
    assert "1 row(s) without a value in every head left out" in fc.heads.max_t.method
    assert ref.heads is not None and ref.heads.max_t is not None and ref.heads.max_t.p_max_t is not None
    np.testing.assert_array_equal(fc.heads.max_t.p_max_t.values, ref.heads.max_t.p_max_t.values)


def test_masses_of_two_shapes_say_why_they_are_not_tested():
    rows, masses = study(n_questions=8, seed=1)
    odd = next(i for i, m in enumerate(masses) if m is not None)
    masses = list(masses)
    masses[odd] = np.zeros((L + 1, H, len(CATEGORIES)))  # one record of a deeper model
    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES)
    assert tests and all(t.layers is None and t.reason is not None and "2 shapes" in t.reason for t in tests)


def tracking(rows: list[HopRow], masses: list[np.ndarray | None]):
    from probe.analysis.hops import HOP_LABELS, METHOD, WINDOW_RULE, HopTracking

    tests = hop_mass_tests(rows, masses, "m", "raw", CATEGORIES, seed=2)
    return HopTracking(cells=(), rows=tuple(rows), categories=CATEGORIES, labels=HOP_LABELS, window=WINDOW_RULE,
                       method=METHOD, n_trials=len({r.trial_id for r in rows}), n_skipped=0, reason=None,
                       tests=tuple(tests))


def test_tests_round_trip_through_the_file_and_a_run_without_them_writes_none():
    from probe.analysis.hops import HopTracking
    from probe.analysis.results import from_json
    from probe.codec import encode

    h = tracking(*study(n_questions=20, seed=5, fail_ext=(2, 1)))
    arrays: dict[str, np.ndarray] = {}
    assert h.tests and from_json(HopTracking, encode(h, arrays), arrays=arrays) == h
    assert arrays  # the per-head grids travel in the arrays, not in the JSON
    none = encode(replace(h, tests=()), {})
    assert isinstance(none, dict) and "tests" not in none  # a run without them writes no empty list
    assert from_json(HopTracking, none).tests == ()


def _hops_page(h, ctx=None) -> str:
    from probe.config import AnalysisSection
    from probe.report import ice_hops
    from probe.report.blocks import ReportContext, to_html

    return to_html(ice_hops.blocks(h, 0.05), ctx or ReportContext(AnalysisSection()))


def test_report_shows_the_tests_beside_the_hop_table():
    from probe.report import ice_hops
    from probe.report.blocks import to_markdown

    h = tracking(*study(n_questions=20, seed=5, fail_ext=(2, 1)))
    page = _hops_page(h)
    assert ice_hops.TESTS_TITLE in page.replace("&#x27;", "'") and "L2.H1" in page
    md = "\n".join(to_markdown(ice_hops.blocks(h, 0.05)))
    assert "L2.H1" in md and "failed - correct" in md and "Saturation - Control (80 %)" in md
    named = dict(ice_hops.tables(h))
    rows = named["hop_mass_tests"]
    fc = next(t for t in h.tests if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    head = [r for r in rows if r["category"] == "extraneous" and r["head"] is not None]
    assert {(r["layer"], r["head"]) for r in head} == {(x.layer, x.head) for x, _ in fc.heads.listed()}
    assert len([r for r in rows if r["category"] == "extraneous" and r["head"] is None]) == L
    assert "hop_mass_tests" not in dict(ice_hops.tables(replace(h, tests=())))


def test_report_names_the_tests_it_could_not_fit():

    rows, masses = study(n_questions=3)
    h = tracking([replace(r, em=1.0) for r in rows], masses)
    page = _hops_page(h)
    assert "Not tested: failed - correct hop (raw)" in page and "every trial is correct" in page


def test_report_draws_the_per_layer_test_figure(tmp_path):
    from probe.config import AnalysisSection
    from probe.report import ice_hops
    from probe.report.sections import ReportContext

    h = tracking(*study(n_questions=20, seed=5, fail_ext=(2, 1)))
    ctx = ReportContext(AnalysisSection(), tmp_path / "figures")
    page = _hops_page(h, ctx)
    assert [p.name for p in ctx.written] == ["hop_tests_m.png"] and page.count("<figure") == 1
    fig = ice_hops.draw_tests(h, "m")
    fitted = [t for t in h.tests if t.layers is not None]
    assert fig is not None and len(fig.axes) == len(fitted)
    fc = next(t for t in fitted if t.contrast == FAILED_CORRECT and t.category == "extraneous")
    ax = fig.axes[fitted.index(fc)]
    np.testing.assert_allclose(ax.lines[-1].get_ydata(), [lt.estimate.value for lt in fc.layers.layers])
    assert ice_hops.draw_tests(h, "other model") is None


@pytest.mark.slow
def test_a_run_analysed_end_to_end_carries_fitted_tests_into_every_product(tmp_path):
    """12 questions x Saturation at 20 and 80 % x 2 replications, answer attention planted so that failed trials
    look at the distractor d1 in layer 4, head 1, while writing: analysis.json (round trip), attention_summary.npz,
    tables/hop_mass_tests.csv and report.html all carry the fitted failed - correct tests."""
    from probe.analysis import analyze_run, read_analysis
    from probe.attention.answer import AnswerAttention
    from probe.prompts.builder import Piece, assemble
    from probe.records import TrialRecord, write_jsonl
    from probe.report import render_report, write_tables
    from probe.runfolder import RunFolder
    from probe.types import Prompt, Task
    from tests.analysis.test_hops import (HOPS, KINDS, LABELS, N_HEADS, N_LAYERS, PIECES, TEXTS, save_answer_record,
                                         spans_of)

    run = RunFolder(tmp_path)
    body = [Piece("germane", HOPS[0].fact, "hop0"), Piece("extraneous", TEXTS[3], "d0"),
            Piece("germane", HOPS[1].fact, "hop1"), Piece("extraneous", TEXTS[5], "d1")]
    question = "What is the capital of Vorlan's birthplace?"
    text, segs = assemble("Answer.", body, question)
    rng = np.random.default_rng(0)
    prompts, trials, tasks = {}, [], {}
    t = len(PIECES)
    for q in range(12):
        tasks[f"q{q}"] = Task(f"q{q}", "synthetic", question, "Arden", HOPS)
        for load in (20, 80):
            for rep in (0, 1):
                pid = f"q{q}|Saturation|L{load}|r{rep}"
                prompts[pid] = Prompt(pid, f"q{q}", "synthetic", "Saturation", load, float(load), rep, text, segs)
                em = float(rng.random() > (0.2 if load == 20 else 0.6))
                trials.append(TrialRecord(trial_id=f"m::{pid}", model="m", prompt_id=pid, task_id=f"q{q}",
                                          source="synthetic", condition="Saturation", load=load,
                                          achieved_load=float(load), replication=rep, prompt_tokens=40,
                                          output="".join(PIECES), answer="Arden" if em else "Zerin", gold="Arden",
                                          em=em, hop_recall=0.5, truncated=False, uninterpretable=False))
                mass = rng.dirichlet(np.ones(len(KINDS) + 1) * 5, size=(t, N_LAYERS, N_HEADS))
                if not em:
                    mass[:, 4, 1, 5] += 0.5
                mass /= mass.sum(-1, keepdims=True)
                save_answer_record(run, "m", pid, AnswerAttention(
                    tokens=np.arange(t), mass=mass.astype(np.float32), vmass=None,
                    top_key=np.zeros((t, N_LAYERS, N_HEADS), dtype=np.int32), prompt_ids=np.arange(40),
                    segment_kinds=KINDS, segment_labels=LABELS,
                    segment_spans=((0, 3), (3, 10), (10, 16), (16, 22), (22, 28), (28, 34), (34, 38), (38, 40)),
                    chars=spans_of(PIECES)))
    write_jsonl(run.trials, [x.to_dict() for x in trials])
    write_jsonl(run.prompts, [p.to_dict() for p in prompts.values()])
    write_jsonl(run.tasks, [x.to_dict() for x in tasks.values()])
    analysis = analyze_run(run)
    h = analysis.families["ice"].hop_tracking
    fc = next(x for x in h.tests if x.contrast == FAILED_CORRECT and x.category == "extraneous")
    assert fc.layers.is_test and fc.heads.is_test and fc.heads.max_t.n_questions >= 6
    assert (4, 1) in {(x.layer, x.head) for x, _ in fc.heads.listed()}
    assert all(x.reason is not None for x in h.tests if x.contrast == SATURATION_CONTROL)  # no Control trial
    assert read_analysis(run) == analysis
    stored = next(x for x in read_analysis(run).families["ice"].hop_tracking.tests  # as read back from the files
                  if x.contrast == FAILED_CORRECT and x.category == "extraneous").heads
    assert stored.max_t.p_max_t.values[4, 1] < 0.05 and stored.estimates.shape == (N_LAYERS, N_HEADS)
    write_tables(analysis, run)
    assert (run.tables / "hop_mass_tests.csv").is_file()
    page = render_report(run).read_text()
    assert "L4.H1" in page and (run.figures / "hop_tests_m.png").is_file()
