"""CogniLoad in the analysis and report stages: needle/hay enrichment against a direct computation from the
attention records, the ``cogniload`` section of ``analysis.json``, ICE estimates untouched by CogniLoad trials,
and the report's CogniLoad section drawn from ``analysis.json`` alone.

The synthetic run (:mod:`tests.fixtures.cogniload_run`) is written with the real record classes; outcomes follow a
known U-shaped logistic model in rho; attention favours needles by a known, layer-dependent factor.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import re
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from probe.analysis import Analysis, analyze_run, read_analysis
from probe.analysis.cogniload import CogniloadResult, analyze_cogniload
from probe.analysis.cogniload_attention import (
    CogniloadAttentionError,
    cogniload_attention,
    group_enrichment,
    prompt_enrichment,
)
from probe.analysis.ice import IceResult
from probe.attention.result import SegmentAttention
from probe.analysis.frame import in_run_order
from probe.records import load_trials
from probe.report import main_table, main_table_text, render_report, write_tables
from probe.report import cogniload_figures as CL
from probe.runfolder import RunFolder
from tests.fixtures.cogniload_run import (
    GRID_RHO,
    MODELS,
    N_BOOT,
    N_LAYERS,
    SEED,
    Layout,
    _chance,
    make_cogniload_run,
)


def cl(analysis: Analysis) -> CogniloadResult:
    """The CogniLoad family's result of an analysis."""
    result = analysis.families["cogniload"]
    assert isinstance(result, CogniloadResult)
    return result

@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict[str, Layout]]:
    d = tmp_path_factory.mktemp("cl") / "cl-run"
    return d, make_cogniload_run(d)


@pytest.fixture(scope="module")
def analysis(run) -> Analysis:
    analysis = analyze_run(run[0])
    write_tables(analysis, run[0])
    return analysis


# ------------------------------------------------------------------------------------------ enrichment


def _direct(run_dir: Path, lay: Layout, model: str, pid: str) -> tuple[np.ndarray, np.ndarray]:
    """Head-mean needle and hay enrichment per layer, straight from the definition and the prompt's layout."""
    sa = SegmentAttention.load(RunFolder(run_dir).attention_record(model, pid))
    mass = sa.seg_mass_segment.astype(np.float64)
    nonsink = [i for i, k in enumerate(lay.kinds) if k != "sink"]
    out = []
    for group in (lay.needles, lay.hay):
        if not group:
            out.append(np.full(N_LAYERS, np.nan))
            continue
        share = mass[..., group].sum(-1) / mass[..., nonsink].sum(-1)  # (L, H)
        out.append((share / _chance(lay, group)).mean(axis=1))
    return out[0], out[1]


def test_enrichment_equals_a_direct_computation(run):
    run_dir, layouts = run
    trials = load_trials(run_dir / "trials.jsonl")
    got, n_records = cogniload_attention(RunFolder(run_dir), trials)
    assert n_records == len(layouts) * len(MODELS)
    meta = {t.prompt_id: t.meta for t in trials}
    for model in MODELS:
        direct = {pid: _direct(run_dir, lay, model, pid) for pid, lay in layouts.items()}
        s = got.models[model]
        assert s.n_prompts == len(layouts) and s.n_layers == N_LAYERS and s.query == ("question",)
        for g, j in (("needle", 0), ("hay", 1)):
            stack = np.stack([v[j] for v in direct.values()])  # (prompt, L)
            for li in range(N_LAYERS):
                col = stack[:, li][np.isfinite(stack[:, li])]
                lo, hi = scipy.stats.t.interval(0.95, len(col) - 1, loc=col.mean(), scale=scipy.stats.sem(col))
                assert s.layer[g].n[li] == len(col)
                np.testing.assert_allclose([s.layer[g].mean[li], s.layer[g].ci_low[li], s.layer[g].ci_high[li]],
                                           [col.mean(), lo, hi], rtol=1e-5)
            for knob in ("rho", "N"):
                by = s.by(knob)
                assert list(by.levels) == sorted({m[knob] for m in meta.values()})
                for k, level in enumerate(by.levels):
                    rows = np.stack([v[j] for pid, v in direct.items() if meta[pid][knob] == level])
                    with np.errstate(all="ignore"):
                        want = np.array([r[np.isfinite(r)].mean() for r in rows.T])
                    np.testing.assert_allclose([by.series(g)[li][k] for li in range(N_LAYERS)], want, rtol=1e-5)
                    assert by.n[k] == len(rows)
        ratio = np.stack([np.log2(v[0] / v[1]) for v in direct.values()])
        with np.errstate(all="ignore"):
            want = np.array([c[np.isfinite(c)].mean() for c in ratio.T])
        np.testing.assert_allclose(s.layer["log2_ratio"].mean, want, rtol=1e-5)


def test_planted_needle_preference_is_recovered(analysis):
    att = cl(analysis).attention.models["model-a"]
    ratio = att.layer["log2_ratio"].mean
    assert ratio[0] < 0 < ratio[-1]  # needles down-weighted (x0.5) in layer 0, favoured (x4) in the last layer
    assert all(a < b for a, b in zip(ratio, ratio[1:]))
    # the needle boost grows with rho, so the contrast does too
    by = att.by_rho.layer_mean["log2_ratio"]
    assert by[0] < by[-1]


def test_all_extraneous_segments_give_back_the_records_enrichment(run):
    run_dir, layouts = run
    for pid in list(layouts)[:6]:
        sa = SegmentAttention.load(RunFolder(run_dir).attention_record("model-a", pid))
        ext = [i for i, k in enumerate(sa.segment_kinds) if k == "extraneous"]
        np.testing.assert_allclose(group_enrichment(sa, ext), sa.enrichment, rtol=1e-5)


def test_a_record_of_another_layout_is_refused(run):
    run_dir, layouts = run
    pid = next(iter(layouts))
    trial = next(t for t in load_trials(run_dir / "trials.jsonl") if t.prompt_id == pid)
    sa = SegmentAttention.load(RunFolder(run_dir).attention_record(trial.model, pid))
    trial.meta = {**trial.meta, "n_people": trial.meta["n_people"] + 1}
    with pytest.raises(CogniloadAttentionError, match="n_people"):
        prompt_enrichment(sa, trial)


def test_no_hay_statement_leaves_hay_empty_not_zero(run):
    run_dir, layouts = run
    pid = next(p for p, lay in layouts.items() if not lay.hay)  # N = 8 at rho = 95: eight needles, no hay
    trial = next(t for t in load_trials(run_dir / "trials.jsonl") if t.prompt_id == pid)
    row = prompt_enrichment(SegmentAttention.load(RunFolder(run_dir).attention_record(trial.model, pid)), trial)
    assert np.isnan(row.hay).all() and np.isfinite(row.needle).all() and np.isnan(row.log2_ratio).all()


# ------------------------------------------------------------------------------------------ analysis.json


def _wilson(p: float, n: float, z: float = scipy.stats.norm.ppf(0.975)) -> tuple[float, float]:
    """The Wilson score interval of a share p at n trials (n need not be an integer)."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_cogniload_section_of_the_analysis(run, analysis):
    run_dir, _ = run
    # the analysis reads trials in the run's order (no prompts.jsonl here: by prompt id), so its float sums are these
    trials = in_run_order(load_trials(run_dir / "trials.jsonl"), [])
    result = cl(analysis)
    assert result.seed == SEED and result.n_bootstrap == N_BOOT  # from the run's config.toml
    assert analysis.seed == SEED and analysis.seed_source == "config.toml"
    assert result.models == analyze_cogniload(trials, N_BOOT, SEED).models
    quad = result.models["model-a"].fits["quadratic"]
    assert quad.status == "ok" and quad.params["rho2"].value > 0  # the planted U-shape
    for model in MODELS:
        mine = [t for t in trials if t.model == model]
        cells = result.cells[model]
        assert cells.overall.n == len(mine) and cells.overall.condition == "CogniLoad"
        for knob in ("d", "N", "rho"):
            levels = sorted({t.meta[knob] for t in mine})
            assert [c.level for c in cells.by(knob)] == levels
            for c, level in zip(cells.by(knob), levels):
                ys = [t.em for t in mine if t.meta[knob] == level]
                assert c.n == len(ys) and c.em_mean == pytest.approx(np.mean(ys))
                # each puzzle answered once: the bounded interval is Wilson at n - 1 (design effect n / (n - 1))
                assert c.n_clusters == c.n
                assert (c.em_ci_low, c.em_ci_high) == pytest.approx(_wilson(np.mean(ys), len(ys) - 1))
                assert c.truncated_rate == pytest.approx(np.mean([t.truncated for t in mine if t.meta[knob] == level]))
    # CogniLoad trials are not ICE cells, nor a taxonomy without a Control condition: no ICE result at all
    assert list(analysis.families) == ["cogniload"]
    assert analysis.n_trials == len(trials) == analysis.n_trials_by_family["cogniload"]
    for name in ("cogniload_accuracy", "cogniload_fits", "cogniload_thresholds", "cogniload_attention_layers"):
        assert (run_dir / "tables" / f"{name}.csv").read_text().count("\n") > 1


def test_ice_estimates_ignore_cogniload_trials(tmp_path):
    from tests.fixtures import synthetic_run

    ice = tmp_path / "ice"
    synthetic_run.make_run(ice, synthetic_run.Plan(models=("model-a",), n_tasks=8, n_reps=1, loads=(20, 80),
                                                   attention=True, seed=5))
    mixed = tmp_path / "mixed"
    shutil.copytree(ice, mixed)
    cl_run = tmp_path / "cl-only"
    make_cogniload_run(cl_run, models=("model-a",), seed=9)
    with (mixed / "trials.jsonl").open("a", encoding="utf-8") as fh:
        fh.write((cl_run / "trials.jsonl").read_text(encoding="utf-8"))
    shutil.copytree(RunFolder(cl_run).attention_dir("model-a"), RunFolder(mixed).attention_dir("model-a"),
                    dirs_exist_ok=True)
    a = analyze_run(ice)
    b = analyze_run(mixed)
    assert isinstance(b.families["ice"], IceResult)
    assert b.families["ice"] == a.families["ice"]
    n_cl = b.n_trials_by_family["cogniload"]
    assert cl(b).cells["model-a"].overall.n == n_cl > 0
    assert not any("holds no record" in n for n in b.notes)
    text = main_table_text(b)
    assert re.search(r"model-a\s+CogniLoad\s+all\s+" + str(n_cl), text)
    assert "Control" in text and "accuracy by ρ" in text and "NT50" in text
    assert "CogniLoad" in main_table(mixed) and "CogniLoad" not in main_table(ice)


# ------------------------------------------------------------------------------------------ report


def _png_ok(data: bytes) -> None:
    img = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01  # not a blank canvas


def test_report_has_the_cogniload_section(run, analysis):
    run_dir, _ = run
    report = render_report(run_dir)
    html = report.read_text()
    expected = {"cogniload_accuracy"} | {f"cogniload_needle_hay_{kind}_{m}" for m in MODELS
                                        for kind in ("heatmap", "layers")}
    pngs = {p.stem: p for p in (run_dir / "figures").glob("*.png")}
    assert set(pngs) == expected
    embedded = [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]
    assert len(embedded) == len(expected)
    for data in embedded:
        assert data in {p.read_bytes() for p in pngs.values()}
        _png_ok(data)
    for text in ("<h2>CogniLoad</h2>", "ECL50", "NT50", "ID50", "Δρ", "AIC", "needle", "hay"):
        assert text in html
    assert "Table 1" not in html and "H2: paired" not in html  # no ICE trial, no ICE section


def test_the_threshold_table_gives_a_reason_by_its_first_clause_and_the_csv_keeps_it_whole(analysis):
    """A degenerate main fit left NT50 and ID50 without a value, each cell repeating the fit's 200-character reason
    (which the GLM table already gives); the page says its first clause, the CSV row the whole reason."""
    from probe.config import AnalysisSection
    from probe.report.blocks import ReportContext, to_html
    from probe.report.cogniload import threshold_rows, threshold_table

    why = ("the main fit is degenerate: quasi-complete separation: a combination of the predictors predicts 16 of "
           "the 24 outcomes exactly")
    result = cl(analysis)
    model = sorted(result.models)[0]
    fits = result.models[model]
    none = dataclasses.replace(fits.thresholds["NT50"], value=None, ci_low=None, ci_high=None, status="degenerate",
                               reason=why)
    result = dataclasses.replace(result, models={**result.models, model: dataclasses.replace(
        fits, thresholds={**fits.thresholds, "NT50": none})})
    html = to_html([threshold_table(result)], ReportContext(AnalysisSection()))
    assert '<span class="note">the main fit is degenerate</span>' in html and "quasi-complete" not in html
    (row,) = [r for r in threshold_rows(result) if r["model"] == model and r["threshold"] == "NT50"]
    assert row["reason"] == why and row["status"] == "degenerate"


def test_accuracy_figure_plots_the_trial_means(run, analysis):
    run_dir, _ = run
    trials = load_trials(run_dir / "trials.jsonl")
    fig = CL.draw_accuracy_by_knob(cl(analysis))
    containers = fig.axes[2].containers  # one errorbar per model, in model order
    assert len(containers) == len(MODELS)
    for model, bars in zip(sorted(MODELS), containers):
        want = [np.mean([t.em for t in trials if t.model == model and t.meta["rho"] == r]) for r in GRID_RHO]
        np.testing.assert_allclose(np.asarray(bars.lines[0].get_ydata(), dtype=float), want)


def test_report_draws_what_analysis_json_says(run, analysis, tmp_path):
    run_dir, _ = run
    work = tmp_path / "edited"
    shutil.copytree(run_dir, work)
    path = work / "analysis.json"
    a = json.loads(path.read_text())
    th = a["families"]["cogniload"]["models"]["model-a"]["thresholds"]["NT50"]
    th.update(value=42.5, ci_low=40.1, ci_high=44.9, status="ok", reason=None, n_boot_defined=N_BOOT,
              n_boot_undefined=0, ci_note=None)
    by = a["families"]["cogniload"]["attention"]["models"]["model-a"]["by_rho"]
    by["needle"] = [[2.0] * len(by["levels"]) for _ in range(N_LAYERS)]
    path.write_text(json.dumps(a))
    html = render_report(work).read_text()
    assert "42.5 percent [40.1, 44.9]" in html
    fig = CL.draw_needle_hay_heatmaps(cl(read_analysis(work)), "model-a")
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), 1.0)  # log2(2): drawn as stored
