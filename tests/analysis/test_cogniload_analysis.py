"""CogniLoad GLM and capacity thresholds on synthetic outcomes drawn from a known logistic model.

Checks against independent computations: the true coefficients (the fits must recover them), a direct
maximum-likelihood fit with scipy, the paper's closed-form threshold formulas, and raw accuracy differences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special

from probe.analysis.cogniload import CogniloadAnalysisError, CogniloadFits, _crossing, analyze_cogniload
from probe.records import TrialRecord

GRID_D = (1, 3, 5, 7, 10)
GRID_N = (20, 50, 100, 250)
GRID_RHO = (5, 25, 50, 75, 95)
# A U-shaped response in rho with 50 % crossings inside every tested range (at the grid means).
TRUE = {"const": 4.84, "d": -0.35, "log10_N": -1.2, "rho": -0.04, "rho2": 0.0004}


def _eta(b: dict[str, float], d: float, n: float, rho: float) -> float:
    return (
        b.get("const", 0.0)
        + b.get("d", 0.0) * d
        + b.get("log10_N", 0.0) * math.log10(n)
        + b.get("rho", 0.0) * rho
        + b.get("rho2", 0.0) * rho**2
        + b.get("d:log10_N", 0.0) * d * math.log10(n)
        + b.get("d:rho", 0.0) * d * rho
    )


def make_trials(
    b: dict[str, float],
    per_cell: int,
    seed: int,
    model: str = "m",
    grid: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = (GRID_D, GRID_N, GRID_RHO),
    outcome: str = "draw",
) -> list[TrialRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for d in grid[0]:
        for n in grid[1]:
            for rho in grid[2]:
                for i in range(per_cell):
                    if outcome == "draw":
                        em = float(rng.random() < special.expit(_eta(b, d, n, rho)))
                    elif outcome == "zero":
                        em = 0.0
                    else:  # "d1": correct exactly when d == 1 (perfect separation)
                        em = float(d == 1)
                    tid = f"cl-d{d}-N{n}-r{rho}-{i:04d}"
                    out.append(
                        TrialRecord(
                            trial_id=f"{model}::{tid}", model=model, prompt_id=tid, task_id=tid, source="cogniload",
                            condition="CogniLoad", load=0, achieved_load=0.0, replication=0, prompt_tokens=100,
                            output="", answer=None, gold="x", em=em, hop_recall=None, truncated=False,
                            uninterpretable=False, meta={"d": d, "N": n, "rho": rho}, family="cogniload",
                        )
                    )
    return out


def _means(trials: list[TrialRecord]) -> tuple[float, float, float]:
    d = np.mean([t.meta["d"] for t in trials])
    x = np.mean([math.log10(t.meta["N"]) for t in trials])
    r = np.mean([t.meta["rho"] for t in trials])
    return float(d), float(x), float(r)


def closed_form_thresholds(b: dict[str, float], means: tuple[float, float, float]) -> dict[str, float]:
    """The paper's formulas: solve logit = 0 for one variable with the others at their means."""
    d, x, r = means
    rho_part = b["rho"] * r + b["rho2"] * r**2
    ecl50 = 10 ** (-(b["const"] + b["d"] * d + rho_part) / b["log10_N"])
    id50 = -(b["const"] + b["log10_N"] * x + rho_part) / b["d"]
    c = b["const"] + b["d"] * d + b["log10_N"] * x
    disc = b["rho"] ** 2 - 4 * b["rho2"] * c
    nt50 = (-b["rho"] + math.sqrt(disc)) / (2 * b["rho2"])  # the upper root: P >= 0.5 from here to rho = 95
    return {"ECL50": ecl50, "ID50": id50, "NT50": nt50}


@pytest.fixture(scope="module")
def recovered() -> tuple[list[TrialRecord], CogniloadFits]:
    trials = make_trials(TRUE, per_cell=40, seed=2024)
    return trials, analyze_cogniload(trials, n_bootstrap=200, seed=1).models["m"]


def test_recovers_the_true_coefficients(recovered: tuple[list[TrialRecord], CogniloadFits]) -> None:
    _, res = recovered
    fit = res.fits["quadratic"]
    assert fit.status == "ok" and fit.terms == ("const", "d", "log10_N", "rho", "rho2")
    for term, true in TRUE.items():
        p = fit.params[term]
        assert abs(p.value - true) < 3.5 * p.se, (term, p, true)
    assert fit.params["d"].p < 1e-6 and fit.params["log10_N"].p < 1e-6


def test_coefficients_equal_a_direct_maximum_likelihood_fit(recovered: tuple[list[TrialRecord], CogniloadFits]) -> None:
    trials, res = recovered
    y = np.array([t.em for t in trials])
    d = np.array([t.meta["d"] for t in trials], dtype=float)
    x = np.log10([t.meta["N"] for t in trials])
    r = np.array([t.meta["rho"] for t in trials], dtype=float) / 100.0  # scaled for the optimiser
    design = np.column_stack([np.ones_like(d), d, x, r, r**2])

    def nll(beta: np.ndarray) -> float:
        eta = design @ beta
        return float(np.sum(np.logaddexp(0.0, eta) - y * eta))

    def grad(beta: np.ndarray) -> np.ndarray:
        return design.T @ (special.expit(design @ beta) - y)

    sol = optimize.minimize(nll, np.zeros(5), jac=grad, method="BFGS", options={"gtol": 1e-10, "maxiter": 2000})
    direct = dict(zip(["const", "d", "log10_N", "rho", "rho2"], sol.x / np.array([1, 1, 1, 100, 1e4])))
    for term, val in direct.items():
        assert res.fits["quadratic"].params[term].value == pytest.approx(val, rel=1e-4, abs=1e-8)
    k = 5
    assert res.fits["quadratic"].aic == pytest.approx(2 * k + 2 * sol.fun, rel=1e-6)


def test_quadratic_rho_preferred_by_aic_when_the_response_is_u_shaped(
    recovered: tuple[list[TrialRecord], CogniloadFits],
) -> None:
    _, res = recovered
    assert res.aic_preferred == "quadratic"
    assert res.delta_aic == pytest.approx(res.fits["linear"].aic - res.fits["quadratic"].aic)
    assert res.delta_aic > 10


def test_thresholds_match_the_closed_form_and_cover_the_truth(recovered: tuple[list[TrialRecord], CogniloadFits]) -> None:
    trials, res = recovered
    means = _means(trials)
    fitted = {t: v.value for t, v in res.fits["quadratic"].params.items()}
    from_fit = closed_form_thresholds(fitted, means)
    truth = closed_form_thresholds(TRUE, means)
    assert 20 < truth["ECL50"] < 250 and 5 < truth["NT50"] < 95 and 1 < truth["ID50"] < 10
    for name in ("ECL50", "NT50", "ID50"):
        th = res.thresholds[name]
        assert th.status == "ok" and th.reason is None
        assert th.value == pytest.approx(from_fit[name], rel=1e-9)
        assert th.ci_low < th.value < th.ci_high
        assert th.ci_low < truth[name] < th.ci_high, (name, th, truth[name])
        assert th.n_boot_defined + th.n_boot_undefined == 200


def test_delta_rho_is_the_raw_accuracy_difference(recovered: tuple[list[TrialRecord], CogniloadFits]) -> None:
    trials, res = recovered
    acc = {rho: np.mean([t.em for t in trials if t.meta["rho"] == rho]) for rho in (5, 95)}
    dr = res.delta_rho
    assert (dr.low_rho, dr.high_rho) == (5, 95)
    assert dr.value == pytest.approx(acc[5] - acc[95])
    assert dr.ci_low <= dr.value <= dr.ci_high
    assert res.accuracy_by["rho"]["5"].acc == pytest.approx(acc[5])
    assert res.accuracy == pytest.approx(np.mean([t.em for t in trials]))


@pytest.mark.parametrize(("term", "fit"), [("d:log10_N", "d_x_N"), ("d:rho", "d_x_rho")])
def test_recovers_interactions(term: str, fit: str) -> None:
    b = {"const": 3.0, "d": -0.2, "log10_N": -0.8, "rho": 0.0, "rho2": 0.0}
    b[term] = -0.25 if term == "d:log10_N" else -0.006
    res = analyze_cogniload(make_trials(b, per_cell=25, seed=5), n_bootstrap=0, seed=0).models["m"]
    p = res.fits[fit].params[term]
    assert res.fits[fit].status == "ok"
    assert abs(p.value - b[term]) < 3.5 * p.se and p.p < 0.01


def test_thresholds_outside_the_tested_range_are_not_numbers() -> None:
    strong = {"const": 9.0, "d": -0.3, "log10_N": -1.0, "rho": 0.0, "rho2": 0.0}
    res = analyze_cogniload(make_trials(strong, 20, seed=3), n_bootstrap=20, seed=0).models["m"]
    ecl = res.thresholds["ECL50"]
    assert ecl.status == "above_range" and ecl.value is None and ecl.ci_low is None
    assert "250" in ecl.reason and "extrapolation" in ecl.reason
    fitted = {t: v.value for t, v in res.fits["quadratic"].params.items()}
    means = _means(make_trials(strong, 1, 3))
    assert ecl.extrapolated == pytest.approx(closed_form_thresholds(fitted, means)["ECL50"])
    assert ecl.extrapolated > 250

    weak = {"const": -2.0, "d": -0.2, "log10_N": -0.5, "rho": 0.0, "rho2": 0.0}
    res = analyze_cogniload(make_trials(weak, 20, seed=4), n_bootstrap=20, seed=0).models["m"]
    for name in ("ECL50", "ID50"):
        th = res.thresholds[name]
        assert th.status == "below_range" and th.value is None and "below 0.5" in th.reason
    nt = res.thresholds["NT50"]
    assert nt.status == "above_range" and nt.value is None and "highest tested needle ratio" in nt.reason


def test_model_at_zero_everywhere_is_degenerate() -> None:
    res = analyze_cogniload(make_trials({}, 5, seed=0, outcome="zero"), n_bootstrap=10, seed=0).models["m"]
    assert res.accuracy == 0.0
    for fit in res.fits.values():
        assert fit.status == "degenerate" and "accuracy 0 %" in fit.reason and fit.params == {}
    for th in res.thresholds.values():
        assert th.status == "degenerate" and th.value is None and "accuracy 0 %" in th.reason
    assert res.delta_aic is None and res.aic_preferred is None


def test_an_untested_variable_is_reported_before_a_degenerate_fit() -> None:
    trials = make_trials({}, 5, seed=0, grid=((1, 3), (20,), (5, 50, 95)), outcome="zero")
    th = analyze_cogniload(trials, n_bootstrap=0, seed=0).models["m"].thresholds
    assert th["ECL50"].status == "not_estimable" and th["ID50"].status == "degenerate"


def test_perfect_separation_is_degenerate() -> None:
    trials = make_trials({}, 10, seed=0, grid=((1, 3, 5), GRID_N, GRID_RHO), outcome="d1")
    res = analyze_cogniload(trials, n_bootstrap=5, seed=0).models["m"]
    fit = res.fits["quadratic"]
    assert fit.status == "degenerate" and "separation" in fit.reason
    assert res.thresholds["ID50"].value is None and "separation" in res.thresholds["ID50"].reason


def test_a_single_length_cannot_give_ecl50() -> None:
    """The demo grid: one N, two d levels, three rho levels."""
    b = {"const": 1.0, "d": -0.4, "log10_N": 0.0, "rho": 0.01, "rho2": 0.0}
    trials = make_trials(b, 30, seed=8, grid=((1, 3), (20,), (5, 50, 95)))
    res = analyze_cogniload(trials, n_bootstrap=10, seed=0).models["m"]
    quad = res.fits["quadratic"]
    assert quad.status == "ok" and "log10_N" not in quad.terms and "log10_N" in quad.dropped
    assert res.fits["d_x_N"].status == "not_estimable"
    ecl = res.thresholds["ECL50"]
    assert ecl.status == "not_estimable" and ecl.value is None and "one N level" in ecl.reason
    two_rho = make_trials(b, 30, seed=8, grid=((1, 3), (20, 50), (5, 95)))
    res2 = analyze_cogniload(two_rho, n_bootstrap=0, seed=0).models["m"]
    assert "rho2" in res2.fits["quadratic"].dropped and res2.delta_aic is None


def test_models_are_separate_and_other_sources_ignored() -> None:
    a = make_trials(TRUE, 4, seed=1, model="a")
    b = make_trials({}, 4, seed=1, model="b", outcome="zero")
    other = [
        TrialRecord(trial_id="a::q", model="a", prompt_id="q", task_id="q", source="synthetic", condition="Control",
                    load=0, achieved_load=0.0, replication=0, prompt_tokens=1, output="", answer=None, gold="x",
                    em=1.0, hop_recall=None, truncated=False, uninterpretable=False)
    ]
    out = analyze_cogniload(a + b + other, n_bootstrap=0, seed=0)
    assert sorted(out.models) == ["a", "b"]
    assert out.models["a"].n == len(a) and out.models["b"].accuracy == 0.0


def test_missing_meta_names_the_trial() -> None:
    t = make_trials(TRUE, 1, seed=0)[:3]
    t[1].meta = {"d": 3}
    with pytest.raises(CogniloadAnalysisError, match=t[1].trial_id):
        analyze_cogniload(t, n_bootstrap=0, seed=0)


def test_bootstrap_is_seeded() -> None:
    trials = make_trials(TRUE, 6, seed=9)
    a = analyze_cogniload(trials, n_bootstrap=30, seed=4)
    assert a == analyze_cogniload(trials, n_bootstrap=30, seed=4)
    assert a != analyze_cogniload(trials, n_bootstrap=30, seed=5)


@pytest.mark.parametrize(
    ("coefs", "lo", "hi", "direction", "expected"),
    [
        ([-2.0, 6.0], 1, 10, "up", ("ok", 3.0, None)),  # -2x + 6 >= 0 up to 3
        ([-2.0, 30.0], 1, 10, "up", ("holds", None, 15.0)),  # crosses beyond the range
        ([2.0, 1.0], 1, 10, "up", ("holds", None, None)),  # never falls
        ([-2.0, 1.0], 1, 10, "up", ("start_fails", None, 0.5)),
        ([1.0, -100.0, 2100.0], 5, 95, "down", ("ok", 70.0, None)),  # U: roots 30, 70; >= 0 from 70 up
        ([1.0, -100.0, 2600.0], 5, 95, "down", ("holds", None, None)),  # minimum above 0
        ([0.0, -1.0, 50.0], 5, 95, "down", ("start_fails", None, None)),  # falling: fails at 95, no crossing up
        ([0.0, 1.0, -50.0], 5, 95, "down", ("ok", 50.0, None)),
    ],
)
def test_crossing(coefs: list[float], lo: float, hi: float, direction: str, expected: tuple) -> None:
    status, value, extra = _crossing(np.array(coefs), lo, hi, direction)
    assert status == expected[0]
    for got, want in ((value, expected[1]), (extra, expected[2])):
        assert (got is None and want is None) or got == pytest.approx(want)
