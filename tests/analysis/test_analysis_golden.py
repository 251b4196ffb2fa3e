"""The analysis reproduces every value of the golden record ``tests/fixtures/analysis_golden.json`` (schema 7), written
from the same fixture runs by ``python tests/fixtures/golden_runs.py``: a change of any number fails here until the
record is regenerated on purpose (and its diff checked, see ``tests/fixtures/golden_runs.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from probe.analysis import SCHEMA_VERSION, analyze_run, read_analysis
from probe.codec import encode
from tests.fixtures.golden_runs import GOLDEN, make_golden_runs

# fields that name the place or time of an analysis, not a result
NOT_RESULTS = {"run_dir", "created", "trials", "attention_summary_arrays", "arrays_sha256"}


# Every number is compared, floats at a relative 1e-6 (absolute 1e-9 near zero). What it guards: any change of a
# method, a default, a seed's use or a data path moves numbers by far more (1e-3 and up; a p-value of a permutation
# test by a multiple of 1/resamples). What it lets through: the last bits that a BLAS, LAPACK or statsmodels update,
# another CPU's kernels or another thread count change in a sum's order (1e-15 to 1e-10 relative on the fits seen,
# e.g. df 9.000000000000002 against 8.999999999999996), which a bit-for-bit comparison would fail on.
RTOL, ATOL = 1e-6, 1e-9


def assert_same(old: object, new: object, path: str) -> int:
    """Every value of ``old`` equals the one at the same place of ``new`` (floats to :data:`RTOL`, :data:`ATOL`);
    returns values checked."""
    if isinstance(old, dict):
        assert isinstance(new, dict), path
        assert set(new) - NOT_RESULTS == set(old) - NOT_RESULTS, f"{path}: keys {sorted(set(new) ^ set(old))} differ"
        return sum(assert_same(v, new[k], f"{path}.{k}") for k, v in old.items() if k not in NOT_RESULTS)
    if isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), path
        return sum(assert_same(o, x, f"{path}[{i}]") for i, (o, x) in enumerate(zip(old, new)))
    if isinstance(old, float) and not isinstance(new, bool):
        assert isinstance(new, (int, float)) and math.isclose(old, new, rel_tol=RTOL, abs_tol=ATOL), \
            f"{path}: {old!r} then, {new!r} now"
        return 1
    assert old == new, f"{path}: {old!r} then, {new!r} now"
    return 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    runs = make_golden_runs(tmp_path_factory.mktemp("golden"))
    for run in runs.values():
        analysis = analyze_run(run)
        assert read_analysis(run) == analysis  # analysis.json reads back into the very same typed results
    return runs


def test_ice_estimates_equal_the_golden_record(runs):
    golden = json.loads(GOLDEN.read_text())["ice"]
    assert golden["schema"] == SCHEMA_VERSION
    analysis = read_analysis(runs["ice"])
    fresh = json.loads((runs["ice"] / "analysis.json").read_text())
    checked = assert_same(golden, fresh, "ice")
    assert checked > 1000
    with np.load(runs["ice"] / "attention_summary.npz") as z:
        assert set(z.files) == set(golden["attention_summary_arrays"])
        for k in z.files:
            np.testing.assert_allclose(z[k], np.asarray(golden["attention_summary_arrays"][k], dtype=float),
                                       rtol=RTOL, atol=ATOL, err_msg=k)
    assert list(analysis.families) == ["ice"]
    assert analysis.seed == 0 and analysis.seed_source == "default"  # no config.toml: the documented default
    # a few headline values, named: the planted effects they estimate and the small-sample reference behind them
    ice = analysis.families["ice"]
    h1 = ice.h1_of("model-a", "Saturation")
    e = h1.estimate
    assert e.value < 0 and e.is_test and e.df == pytest.approx(9, abs=0.1)  # 10 questions, load within questions
    assert h1.logit.odds_ratio_per_10pp_load == pytest.approx(math.exp(10 * h1.logit.estimate.value))
    assert all(0 <= c.em_ci_low <= c.em_ci_high <= 1 for c in ice.cells)
    layer = ice.attention_behaviour[0].layers[2]
    assert layer.fit.odds_ratio_per_10pp == pytest.approx(math.exp(0.1 * layer.fit.estimate.value))
    assert ice.attention_behaviour[0].tracking_layers == (2,)  # the fixture's planted layer
    assert encode(ice)["h2"][0]["test"]["mcnemar"] is not None


def test_cogniload_estimates_equal_the_golden_record(runs):
    golden = json.loads(GOLDEN.read_text())["cogniload"]
    analysis = read_analysis(runs["cogniload"])
    fresh = json.loads((runs["cogniload"] / "analysis.json").read_text())
    checked = assert_same(golden, fresh, "cogniload")
    assert checked > 500
    assert analysis.n_trials_by_family == {"cogniload": golden["n_trials_by_family"]["cogniload"]}
    assert analysis.seed == 777 and analysis.seed_source == "config.toml"
    fits = analysis.families["cogniload"].models["model-a"]
    assert fits.fits["quadratic"].params["rho2"].value > 0  # the planted U-shape


def test_the_analysis_does_not_depend_on_the_order_trials_were_written(runs, tmp_path):
    """Writers record trials as they finish (a local model batches prompts by length, a served engine records
    answers as they arrive): the same trials in another order give the same analysis, value for value, and the
    same arrays (a Monte Carlo sign flip assigns its signs to questions in the run's order)."""
    import shutil

    for family, run in runs.items():
        shuffled = tmp_path / family
        shutil.copytree(run, shuffled, ignore=shutil.ignore_patterns("analysis.json", "attention_summary.npz"))
        lines = (run / "trials.jsonl").read_text().splitlines()
        order = np.random.default_rng(5).permutation(len(lines))
        (shuffled / "trials.jsonl").write_text("\n".join(lines[i] for i in order) + "\n")
        analyze_run(shuffled)
        before = json.loads((run / "analysis.json").read_text())
        after = json.loads((shuffled / "analysis.json").read_text())
        inputs = {"inputs"}  # the trial file's hash: its lines are in another order
        assert {k: v for k, v in after.items() if k not in inputs} == \
            {k: v for k, v in before.items() if k not in inputs} | {"run_dir": after["run_dir"],
                                                                      "created": after["created"]}, family
        if (run / "attention_summary.npz").exists():
            with np.load(run / "attention_summary.npz") as a, np.load(shuffled / "attention_summary.npz") as b:
                assert set(a.files) == set(b.files)
                for k in a.files:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
