"""The typed analysis reproduces every estimate of the golden record ``tests/fixtures/analysis_golden.json``, written
by the untyped analysis (commit 1cc45fc) from the same fixture runs: only the keys renamed by schema 2 differ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from probe.analysis import analyze_run, read_analysis
from probe.analysis.results import to_json
from tests.fixtures.golden_runs import GOLDEN, make_golden_runs

# schema 1 key -> schema 2 key (probe/analysis/results.py lists the renames)
RENAMED = {"odds_ratio_per_10pp": None}  # decided by where it occurs: see _new_key
ATTENTION_ARRAYS = {"p_ext": "p_ext_key", "enrichment": "enrichment_key", "chance": "chance_key", "ar_k": "ar_k_key"}
# fields schema 2 adds to objects of schema 1 (documented in the result types)
ADDED = {"level", "seed", "ci_note", "p_holm"}


def _new_key(key: str, path: str) -> str:
    if key == "odds_ratio_per_10pp":
        return "odds_ratio_per_10pp_load" if ".h1[" in path else "odds_ratio_per_10pp_p_ext"
    return key


def assert_same(old: object, new: object, path: str, arrays: tuple[dict, dict] | None = None) -> int:
    """Every value of ``old`` equals the one at the same place of ``new`` (floats to 1e-9); returns values checked."""
    if isinstance(old, dict):
        assert isinstance(new, dict), path
        extra = set(new) - {_new_key(k, path) for k in old} - {ATTENTION_ARRAYS[k] for k in old if k in ATTENTION_ARRAYS
                                                              and arrays is not None}
        assert extra <= ADDED, f"{path}: new keys {sorted(extra)}"
        n = 0
        for k, v in old.items():
            if arrays is not None and k in ATTENTION_ARRAYS and path.endswith("]"):
                old_arrays, new_arrays = arrays
                np.testing.assert_allclose(new_arrays[new[ATTENTION_ARRAYS[k]]], np.asarray(old_arrays[v]),
                                           rtol=1e-6, err_msg=f"{path}.{k}")
                n += 1
                continue
            assert _new_key(k, path) in new, f"{path}: {k} missing"
            n += assert_same(v, new[_new_key(k, path)], f"{path}.{k}", arrays)
        return n
    if isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), path
        return sum(assert_same(o, x, f"{path}[{i}]", arrays) for i, (o, x) in enumerate(zip(old, new)))
    if isinstance(old, float) and not isinstance(new, bool):
        assert isinstance(new, (int, float)) and math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-12), \
            f"{path}: {old!r} then, {new!r} now"
        return 1
    assert old == new, f"{path}: {old!r} then, {new!r} now"
    return 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    runs = make_golden_runs(tmp_path_factory.mktemp("golden"))
    for run in runs.values():
        analysis = analyze_run(run, fill_similarity=False)
        assert read_analysis(run) == analysis  # analysis.json reads back into the very same typed results
    return runs


def test_ice_estimates_equal_the_golden_record(runs):
    golden = json.loads(GOLDEN.read_text())["ice"]
    analysis = read_analysis(runs["ice"])
    ice = to_json(analysis.families["ice"])
    with np.load(runs["ice"] / "attention_summary.npz") as z:
        new_arrays = {k: z[k] for k in z.files}
    arrays = (golden["attention_summary_arrays"], new_arrays)
    checked = 0
    for key in ("cells", "h1", "h2", "h3", "attention_behaviour", "taxonomy"):
        checked += assert_same(golden[key], ice[key], f"ice.{key}")
    checked += assert_same(golden["attention_cells"], ice["attention_cells"], "ice.attention_cells", arrays)
    assert checked > 700
    assert list(analysis.families) == ["ice"]
    for key in ("n_trials", "n_scored", "n_error", "n_skipped"):
        assert getattr(analysis, key) == golden[key]
    assert list(analysis.models) == golden["models"] and analysis.settings.alpha == golden["config"]["alpha"]
    assert analysis.inputs.n_prompts == golden["inputs"]["n_prompts"]
    assert analysis.seed == 0 and analysis.seed_source == "default"  # no config.toml: the documented default
    # a few headline estimates, named: the golden record's values, and the planted effects they estimate
    h1 = analysis.families["ice"].h1_of("model-a", "Saturation")
    assert h1.beta == pytest.approx(golden["h1"][0]["beta"], rel=1e-12) and h1.beta < 0
    assert h1.logit.odds_ratio_per_10pp_load == pytest.approx(math.exp(10 * h1.logit.coef))
    layer = analysis.families["ice"].attention_behaviour[0].layers[2]
    assert layer.odds_ratio_per_10pp_p_ext == pytest.approx(math.exp(0.1 * layer.coef))


def test_cogniload_estimates_equal_the_golden_record(runs):
    golden = json.loads(GOLDEN.read_text())["cogniload"]
    analysis = read_analysis(runs["cogniload"])
    cl = to_json(analysis.families["cogniload"])
    checked = assert_same(golden["cogniload"], cl, "cogniload")
    assert checked > 500
    assert analysis.n_trials_by_family == {"cogniload": golden["n_cogniload"]}
    assert analysis.seed == 777 and analysis.seed_source == "config.toml"
    fits = analysis.families["cogniload"].models["model-a"]
    assert fits.fits["quadratic"].params["rho2"].estimate == pytest.approx(
        golden["cogniload"]["models"]["model-a"]["fits"]["quadratic"]["params"]["rho2"]["estimate"], rel=1e-9)
