"""The analysis reproduces every value of the golden record ``tests/fixtures/analysis_golden.json`` (schema 7), written
from the same fixture runs by ``python tests/fixtures/golden_runs.py``: a change of any number fails here until the
record is regenerated on purpose (and its diff checked, see ``tests/fixtures/golden_runs.py``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from probe.analysis import SCHEMA_VERSION, analyze_run, read_analysis
from probe.analysis.results import to_json
from tests.fixtures.golden_runs import GOLDEN, make_golden_runs

# fields that name the place or time of an analysis, not a result
NOT_RESULTS = {"run_dir", "created", "trials", "attention_summary_arrays"}


def assert_same(old: object, new: object, path: str) -> int:
    """Every value of ``old`` equals the one at the same place of ``new`` (floats to 1e-9); returns values checked."""
    if isinstance(old, dict):
        assert isinstance(new, dict), path
        assert set(new) - NOT_RESULTS == set(old) - NOT_RESULTS, f"{path}: keys {sorted(set(new) ^ set(old))} differ"
        return sum(assert_same(v, new[k], f"{path}.{k}") for k, v in old.items() if k not in NOT_RESULTS)
    if isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), path
        return sum(assert_same(o, x, f"{path}[{i}]") for i, (o, x) in enumerate(zip(old, new)))
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
    assert golden["schema"] == SCHEMA_VERSION
    analysis = read_analysis(runs["ice"])
    fresh = json.loads((runs["ice"] / "analysis.json").read_text())
    checked = assert_same(golden, fresh, "ice")
    assert checked > 1000
    with np.load(runs["ice"] / "attention_summary.npz") as z:
        assert set(z.files) == set(golden["attention_summary_arrays"])
        for k in z.files:
            np.testing.assert_allclose(z[k], np.asarray(golden["attention_summary_arrays"][k], dtype=float),
                                       rtol=1e-6, err_msg=k)
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
    assert to_json(ice)["h2"][0]["test"]["mcnemar"] is not None


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


def test_a_schema_4_analysis_still_reads_with_the_same_numbers(runs, tmp_path):
    """``analysis_schema4_ice.json`` is the ICE record as schema 4 wrote it (the measure inside field names:
    ``p_ext_layers``, ``odds_ratio_per_10pp_p_ext``, ``p_ext_key``): it reads, and its attention results equal
    today's analysis of the same run, measure column and all."""
    import dataclasses
    import shutil

    old = json.loads((Path(__file__).parent.parent / "fixtures" / "analysis_schema4_ice.json").read_text())
    assert old["schema"] == 4 and "p_ext_layers" in old["families"]["ice"]["attention_behaviour"][0]
    run = tmp_path / "ice"
    shutil.copytree(runs["ice"], run)
    # the fixture's trial records have since gained fields (``extraction``), so the file's sha256 moved; its
    # trials are the same
    old["inputs"]["trials_sha256"] = json.loads((run / "analysis.json").read_text())["inputs"]["trials_sha256"]
    (run / "analysis.json").write_text(json.dumps(old))
    then = read_analysis(run).families["ice"]  # the same trials: fresh
    now = without_head_se(read_analysis(runs["ice"]).families)["ice"]  # schema 4 had no SE, df of heads
    def unkeyed(a):  # the npz member names of the head grids changed (``ice_heads0_p_ext_estimate``), not their values
        return dataclasses.replace(a, heads=dataclasses.replace(a.heads, estimate_key=None, q_key=None))

    assert unmethodical([unkeyed(a) for a in then.attention_behaviour]) == \
        unmethodical([unkeyed(a) for a in now.attention_behaviour])
    assert then.attention_behaviour[0].heads.estimate_key == "ice_heads0_estimate"
    assert then.residue_attention == now.residue_attention
    keep = ("model", "condition", "load", "measure", "label", "n_prompts", "n_layers", "n_heads", "enrichment_mean",
            "chance_key", "targets")
    assert [{k: getattr(c, k) for k in keep} for c in then.attention_cells] == \
        [{k: getattr(c, k) for k in keep} for c in now.attention_cells]
    p_ext = [(c.mean, c.key) for c in then.attention_cells if c.measure == "p_ext"]
    assert p_ext == [(c.mean, c.key) for c in now.attention_cells if c.measure == "p_ext"]
    # the cells' ci_method text changed after this fixture was written (all-equal cells: one observation per
    # question); every number is the same. The scoring-path fields came later (issue 17): a schema-4 cell reads
    # them as their defaults (None)
    later = {f.name: f.default for f in dataclasses.fields(type(now.cells[0]))
             if f.name.startswith(("strict_em", "extraction_", "scoring_path"))}

    def plain(r):
        return dataclasses.replace(r, attention_cells=(), attention_behaviour=(),
                                   cells=tuple(dataclasses.replace(c, ci_method="", **later) for c in r.cells))

    assert unmethodical(plain(then)) == unmethodical(plain(now))


def unmethodical(x: object) -> object:
    """The JSON form of ``x`` without the ``method`` text of its estimates (schema 6 gives every estimate the
    method its fit names, schema 7 H3's Spearman estimate too; older files gave it to some holders only): the
    numbers and every other field stay."""
    def strip(v: object) -> object:
        if isinstance(v, dict):
            est = {"value", "se", "ci_low", "ci_high", "df", "p", "q", "method", "reason", "is_test"} == set(v)
            return {k: strip(w) for k, w in v.items() if not (est and k == "method")}
        if isinstance(v, list):
            return [strip(w) for w in v]
        return v
    return strip(to_json(x))


SCHEMA5 = Path(__file__).parent.parent / "fixtures" / "analysis_schema5.json"


@pytest.mark.parametrize("name", ["ice", "cogniload"])
def test_a_schema_5_analysis_still_reads_with_the_same_numbers(runs, tmp_path, name):
    """``analysis_schema5.json`` is the golden record as schema 5 wrote it (every estimate spelled out flat in its
    holder: H1's ``beta``, ``se``, …; a layer fit's ``coef``; H2's test fields beside ``q``; CogniLoad terms
    without ``q``, ``reason``, ``is_test``): it reads, and equals today's analysis of the same run in every field
    but the estimates' added ``method`` text and the significant heads' added SE and df; and every number of it is
    one of today's, found without the upgrade (the multiset of every number in the file), today's adding only
    those heads' SE and df."""
    import shutil
    from collections import Counter

    old = json.loads(SCHEMA5.read_text())[name]
    assert old["schema"] == 5
    run = tmp_path / name
    shutil.copytree(runs[name], run)
    (run / "analysis.json").write_text(json.dumps({k: v for k, v in old.items() if k != "attention_summary_arrays"}))
    then, now = read_analysis(run), read_analysis(runs[name])
    assert then.schema == now.schema == SCHEMA_VERSION
    assert unmethodical(then.families) == unmethodical(without_head_se(now.families))

    def numbers(x: object) -> list[str]:
        if isinstance(x, dict):
            return [n for k, v in x.items() if k not in ("schema", "created", "run_dir") for n in numbers(v)]
        if isinstance(x, list):
            return [n for v in x for n in numbers(v)]
        return [f"{x:.9g}"] if isinstance(x, (int, float)) and not isinstance(x, bool) else []

    fresh = json.loads((runs[name] / "analysis.json").read_text())
    then_n, now_n = Counter(numbers(old["families"])), Counter(numbers(fresh["families"]))
    assert not then_n - now_n  # no number lost or changed
    added = Counter(numbers(to_json(now.families))) - Counter(numbers(to_json(without_head_se(now.families))))
    assert now_n - then_n == added  # the only new numbers: the significant heads' SE and df (schema 6)


SCHEMA6 = Path(__file__).parent.parent / "fixtures" / "analysis_schema6.json"


@pytest.mark.parametrize("name", ["ice", "cogniload"])
def test_a_schema_6_analysis_still_reads_with_the_same_numbers(runs, tmp_path, name):
    """``analysis_schema6.json`` is the golden record as schema 6 wrote it (H3's correlation spelled out flat:
    ``n_tasks``, ``r``, ``ci_low``, …, ``spearman_rho``, ``spearman_p``): it reads, equals today's analysis of the
    same run in every field but the Spearman estimate's added ``method`` text, and holds the same multiset of
    numbers as today's record."""
    import shutil
    from collections import Counter

    old = json.loads(SCHEMA6.read_text())[name]
    assert old["schema"] == 6
    if name == "ice":
        assert "r" in old["families"]["ice"]["h3"][0] and "correlation" not in old["families"]["ice"]["h3"][0]
    run = tmp_path / name
    shutil.copytree(runs[name], run)
    (run / "analysis.json").write_text(json.dumps({k: v for k, v in old.items() if k != "attention_summary_arrays"}))
    then, now = read_analysis(run), read_analysis(runs[name])
    assert then.schema == now.schema == SCHEMA_VERSION
    assert unmethodical(then.families) == unmethodical(without_max_t(now.families))  # max-T: added within schema 7
    assert then.interventions == now.interventions is None

    def numbers(x: object) -> list[str]:
        if isinstance(x, dict):
            return [n for k, v in x.items() if k not in ("schema", "created", "run_dir") for n in numbers(v)]
        if isinstance(x, list):
            return [n for v in x for n in numbers(v)]
        return [f"{x:.9g}"] if isinstance(x, (int, float)) and not isinstance(x, bool) else []

    fresh = json.loads((runs[name] / "analysis.json").read_text())
    added = Counter(numbers(to_json(now.families))) - Counter(numbers(to_json(without_max_t(now.families))))
    assert Counter(numbers(old["families"])) == Counter(numbers(fresh["families"])) - added
    assert not Counter(numbers(old["families"])) - Counter(numbers(fresh["families"]))  # none lost


def without_max_t(families: dict) -> dict:
    """``families`` without the per-head max-T option (added within schema 7: its fields take their defaults in
    older files)."""
    ice = families.get("ice")
    if ice is None:
        return families

    def plain(a):
        if a.heads is None:
            return a
        hits = tuple(dataclasses.replace(h, p_max_t=None) for h in a.heads.significant)
        return dataclasses.replace(a, heads=dataclasses.replace(a.heads, significant=hits, max_t=None),
                                   distractor_heads=tuple(dataclasses.replace(h, p_max_t=None)
                                                          for h in a.distractor_heads))

    return {**families, "ice": dataclasses.replace(ice, attention_behaviour=tuple(
        plain(a) for a in ice.attention_behaviour))}


def without_head_se(families: dict) -> dict:
    """``families`` with the significant heads' SE and df removed (schema 5 did not record them), and the per-head
    max-T option (added within schema 6: its fields take their defaults in older files)."""
    ice = families.get("ice")
    if ice is None:
        return families

    def plain(a):
        if a.heads is None:
            return a
        hits = tuple(dataclasses.replace(h, estimate=dataclasses.replace(h.estimate, se=None, df=None), p_max_t=None)
                     for h in a.heads.significant)
        distractor = tuple(dataclasses.replace(h, estimate=dataclasses.replace(h.estimate, se=None, df=None),
                                               p_max_t=None) for h in a.distractor_heads)
        heads = dataclasses.replace(a.heads, significant=hits, max_t=None)
        return dataclasses.replace(a, heads=heads, distractor_heads=distractor)

    return {**families, "ice": dataclasses.replace(ice, attention_behaviour=tuple(
        plain(a) for a in ice.attention_behaviour))}
