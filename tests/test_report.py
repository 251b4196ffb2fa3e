"""Report and comparison pages: every figure present and drawn from the analysis, values equal to a direct
computation from the records, text summary that claims only what the numbers support."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from probe.analysis import analyze_run
from probe.config import AnalysisSection
from probe.report import compare_runs, render_report
from probe.report import figures as F
from probe.report.render import load_attention_arrays
from probe.report.summary import model_summary

_spec = importlib.util.spec_from_file_location("synthetic_run", Path(__file__).parent / "fixtures" / "synthetic_run.py")
synthetic_run = importlib.util.module_from_spec(_spec)
sys.modules["synthetic_run"] = synthetic_run
_spec.loader.exec_module(synthetic_run)
Plan, make_run = synthetic_run.Plan, synthetic_run.make_run

MODEL = "model-a"
EXPECTED = {"saturation_curve", "em_by_condition", "h1_forest", "h3_scatter", f"enrichment_{MODEL}",
            f"p_ext_layers_{MODEL}", f"ar_k_{MODEL}", "attention_behaviour"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    plan = Plan(n_tasks=16, n_reps=2, loads=(20, 80), beta_sat=-0.006, beta_res=-0.006, h3_slope=1.0,
                attention=True, attention_effect=1.0, n_layers=36, n_heads=8, error_rate=0.03, seed=4)
    d = tmp_path_factory.mktemp("report") / "demo"
    make_run(d, plan)
    return d


@pytest.fixture(scope="module")
def report(run) -> Path:
    return render_report(run)  # not analysed yet: the report runs the analysis first


def _png_ok(data: bytes) -> tuple[int, int]:
    img = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01  # not a blank canvas
    return img.shape[:2]


def test_every_figure_is_written_embedded_and_non_empty(run, report):
    assert report == run / "report.html" and (run / "analysis.json").is_file()
    pngs = {p.stem: p for p in (run / "figures").glob("*.png")}
    assert set(pngs) == EXPECTED
    html = report.read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(EXPECTED)
    on_disk = {p.read_bytes() for p in pngs.values()}
    for b64 in embedded:
        data = base64.b64decode(b64)
        assert data in on_disk
        _png_ok(data)
    assert "<script" not in html and "http" not in html.split("<body>")[1]  # self-contained
    for heading in ("Table 1", "Summary", "H1", "H2", "H3", "Taxonomy", "Methods"):
        assert heading in html


def test_saturation_curve_plots_the_trial_means(run, report):
    analysis = json.loads((run / "analysis.json").read_text())
    fig = F.draw_saturation_curve(analysis, {})
    ax = fig.axes[0]
    trials = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    for container in ax.containers:
        label = container.get_label()
        cond = label.split(" ")[0]
        xs, ys = container.lines[0].get_data()
        for x, y in zip(xs, ys):
            load = min((20, 80), key=lambda ld: abs(ld - x))  # markers are nudged sideways to stay apart
            ems = [t["em"] for t in trials if t["condition"] == cond and t["load"] == load and t["em"] is not None
                   and t["error"] is None]
            assert y == pytest.approx(np.mean(ems))
    control = [t["em"] for t in trials if t["condition"] == "Control" and t["em"] is not None and t["error"] is None]
    assert ax.lines[0].get_ydata()[0] == pytest.approx(np.mean(control))
    assert {c.get_label().split(" ")[0] for c in ax.containers} == {"Saturation", "Residue", "LongControl"}


def test_heatmap_shows_mean_enrichment_of_the_attention_records(run, report):
    from probe.attention.result import SegmentAttention

    analysis = json.loads((run / "analysis.json").read_text())
    fig = F.draw_enrichment_heatmaps(analysis, load_attention_arrays(run, analysis), MODEL)
    images = {ax.get_title().split(" (")[0]: ax.get_images()[0] for ax in fig.axes if ax.get_images()}
    assert set(images) == {"Saturation 20%", "Saturation 80%", "Residue 20%", "Residue 80%"}
    files = sorted((run / "attention" / MODEL).glob("*-Saturation-80-*.npz"))
    direct = np.mean([SegmentAttention.load(f).p_ext / SegmentAttention.load(f).chance[:, None] for f in files], axis=0)
    np.testing.assert_allclose(np.asarray(images["Saturation 80%"].get_array()), direct, rtol=1e-5)
    norm = images["Saturation 80%"].norm
    assert norm.vcenter == 1.0  # diverging scale centred at enrichment 1
    ax = next(a for a in fig.axes if a.get_title().startswith("Saturation 20%"))
    assert len(ax.get_yticks()) <= 14  # 36 layers: thinned, readable ticks


def test_h3_scatter_points_and_r_match_scipy(run, report):
    analysis = json.loads((run / "analysis.json").read_text())
    fig = F.draw_h3_scatter(analysis, {})
    ax = fig.axes[0]
    pts = ax.collections[0].get_offsets()
    trials = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    ok = [t for t in trials if t["em"] is not None and t["error"] is None]
    tasks = sorted({t["task_id"] for t in ok})
    xs, ys = [], []
    for task in tasks:
        c = [t["em"] for t in ok if t["task_id"] == task and t["condition"] == "Control"]
        r = [t for t in ok if t["task_id"] == task and t["condition"] == "Residue"]
        if c and r:
            xs.append(np.mean([t["s_sim"] for t in r]))
            ys.append(np.mean(c) - np.mean([t["em"] for t in r]))
    np.testing.assert_allclose(sorted(map(tuple, np.asarray(pts))), sorted(zip(xs, ys)), rtol=1e-9)
    r = scipy.stats.pearsonr(xs, ys).statistic
    assert f"r = {r:+.2f}" in ax.texts[0].get_text()


def test_summary_claims_follow_the_numbers(run, report):
    analysis = json.loads((run / "analysis.json").read_text())
    h1 = next(h for h in analysis["h1"] if h["condition"] == "Saturation")
    text = " ".join(model_summary(analysis, MODEL))
    if h1["p"] < 0.05 and h1["beta"] < 0:
        assert "EM declines with load" in text
    else:
        assert "no significant change" in text and "declines" not in text
    # the same analysis with a non-significant slope must not speak of a decline
    forced = json.loads(json.dumps(analysis))
    for h in forced["h1"]:
        h["p"] = 0.4
    for t in forced["taxonomy"]:
        t["label"], t["is_load_sensitive"] = "resilient", False
    text = " ".join(model_summary(forced, MODEL))
    assert "declines" not in text and "no significant change of EM with load" in text


def test_brittle_model_gets_no_inference(tmp_path):
    d = tmp_path / "brittle"
    make_run(d, Plan(n_tasks=10, p_control=0.03, beta_sat=0.0, beta_res=0.0, task_sd=0.0, seed=9))
    analyze_run(d, AnalysisSection(), fill_similarity=False)
    html = render_report(d).read_text()
    assert "no inference about extraneous load" in html
    text = " ".join(model_summary(json.loads((d / "analysis.json").read_text()), MODEL))
    assert "declines" not in text and "β" not in text
    pngs = sorted(p.stem for p in (d / "figures").glob("*.png"))
    assert "saturation_curve" in pngs and not any(p.startswith("enrichment") for p in pngs)


def test_stale_analysis_is_redone(tmp_path):
    d = tmp_path / "stale"
    make_run(d, Plan(n_tasks=6, seed=1))
    analyze_run(d, AnalysisSection(), fill_similarity=False)
    before = json.loads((d / "analysis.json").read_text())["n_trials"]
    extra = json.loads((d / "trials.jsonl").read_text().splitlines()[0])
    extra.update(trial_id="model-a::extra", prompt_id="extra", em=1.0)
    with (d / "trials.jsonl").open("a") as fh:
        fh.write(json.dumps(extra) + "\n")
    render_report(d)
    assert json.loads((d / "analysis.json").read_text())["n_trials"] == before + 1


def test_compare_runs_puts_runs_side_by_side(run, report, tmp_path):
    other = tmp_path / "other"
    make_run(other, Plan(models=("model-b", "model-c"), n_tasks=8, beta_sat=0.0, beta_res=0.0, seed=2))
    page = compare_runs([run, other], tmp_path / "cmp")
    assert page == tmp_path / "cmp" / "report.html"
    html = page.read_text()
    for name in ("demo: model-a", "other: model-b", "other: model-c"):
        assert name in html
    stems = {p.stem for p in (tmp_path / "cmp" / "figures").glob("*.png")}
    assert {"saturation_curve", "em_by_condition", "h1_forest", "h3_forest"} <= stems
    for p in (tmp_path / "cmp" / "figures").glob("*.png"):
        _png_ok(p.read_bytes())
    assert html.count("data:image/png;base64,") == len(stems)
