"""Report and comparison pages: every figure present and drawn from the analysis, values equal to a direct
computation from the records, text summary that claims only what the numbers support."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from probe.analysis import (
    SCHEMA_VERSION,
    AnalysisMissingError,
    AnalysisSchemaError,
    StaleAnalysisError,
    analyze_run,
    read_analysis,
)
from probe.analysis.ice import IceResult
from probe.config import AnalysisSection
from probe.report import CompareError, compare_runs, render_report
from probe.report import ice_figures as F
from probe.report.ice import model_summary
from probe.runfolder import RunFolder, make_prompt_id
from tests.fixtures.synthetic_run import Plan, make_run

MODEL = "model-a"
EXPECTED = {"saturation_curve", "em_by_condition", "h1_forest", "h3_scatter", "h3_attention", f"enrichment_{MODEL}",
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
    analyze_run(run)
    return render_report(run)


def ice(run: Path) -> IceResult:
    """The ICE result of the run's analysis.json, as the report reads it."""
    result = read_analysis(run).families["ice"]
    assert isinstance(result, IceResult)
    return result


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
    fig = F.draw_saturation_curve(ice(run), {})
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

    fig = F.draw_enrichment_heatmaps(ice(run), MODEL)
    images = {ax.get_title().split(" (")[0]: ax.get_images()[0] for ax in fig.axes if ax.get_images()}
    assert set(images) == {"Saturation 20%", "Saturation 80%", "Residue 20%", "Residue 80%"}
    trials = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    files = sorted({RunFolder(run).attention_record(t["model"], t["prompt_id"]) for t in trials
                    if t["condition"] == "Saturation" and t["load"] == 80})
    direct = np.mean([SegmentAttention.load(f).p_ext / SegmentAttention.load(f).chance[:, None] for f in files], axis=0)
    np.testing.assert_allclose(np.asarray(images["Saturation 80%"].get_array()), direct, rtol=1e-5)
    norm = images["Saturation 80%"].norm
    assert norm.vcenter == 1.0  # diverging scale centred at enrichment 1
    ax = next(a for a in fig.axes if a.get_title().startswith("Saturation 20%"))
    assert len(ax.get_yticks()) <= 14  # 36 layers: thinned, readable ticks


def test_heatmaps_outline_exactly_the_heads_that_pass_the_grid_correction(run, report):
    from matplotlib.patches import Rectangle

    result = ice(run)
    behaviour = result.attention_of(MODEL)
    named = {(h.layer, h.head) for h in behaviour.heads.significant}
    assert named and all(h.q < 0.05 for h in behaviour.heads.significant)
    fig = F.draw_enrichment_heatmaps(result, MODEL, behaviour, 0.05)
    for ax in (a for a in fig.axes if a.get_images()):
        boxes = {(round(r.get_x() + 0.5), round(r.get_y() + 0.5)) for r in ax.patches if isinstance(r, Rectangle)}
        assert {(layer, head) for head, layer in boxes} == named
    plain = F.draw_enrichment_heatmaps(result, MODEL)
    assert not any(a.patches for a in plain.axes if a.get_images())


def test_em_by_condition_stays_in_the_unit_interval_and_its_labels_do_not_overlap(run, report):
    fig = F.draw_em_by_condition(ice(run), {})
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in ax.get_xticklabels() if t.get_text()] + [t for t in ax.texts if t.get_text()]
    assert {t.get_text() for t in ax.texts} == {"Control", "LongControl", "Saturation", "Residue"}
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), "two labels of the EM-by-condition chart overlap"


def test_em_by_condition_marks_an_unscored_cell_and_leaves_a_cell_without_trials_empty(run, report):
    """In a comparison of runs whose designs differ, a model has no cell at all where its run did not go: that slot
    stays empty (the title says so), while a cell with trials but none scored keeps its x."""
    from matplotlib.collections import PathCollection

    def marks(fig) -> list:
        return [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]

    result = ice(run)
    b_cells = [dataclasses.replace(c, model="model-b") for c in result.cells if c.model == MODEL]
    unscored = next(c for c in b_cells if c.condition != "Control")
    b_cells = [dataclasses.replace(c, em_mean=None) if c is unscored else c for c in b_cells
               if c.condition != "Control"]  # model-b's run had no Control cell
    merged = dataclasses.replace(result, models=(MODEL, "model-b"), cells=(*result.cells, *b_cells))
    fig = F.draw_em_by_condition(merged, {})
    (x_marks,) = marks(fig)  # model-b's: model-a has a bar everywhere
    assert len(x_marks.get_offsets()) == 1  # the unscored cell; the Control slot has neither bar nor x
    assert "Control" in [t.get_text() for t in fig.axes[0].texts]
    assert "empty slot: no trial" in fig.axes[0].get_title()
    n_a = sum(c.em_mean is not None for c in result.cells if c.model == MODEL)
    assert len(fig.axes[0].patches) == n_a + sum(c.em_mean is not None for c in b_cells)
    full = F.draw_em_by_condition(result, {})
    assert "empty slot" not in full.axes[0].get_title() and not marks(full)


def test_h3_scatter_points_and_r_match_scipy(run, report):
    fig = F.draw_h3_scatter(ice(run), {})
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
    assert f"r = {r:+.2f}" in ax.get_title()


def test_h3_scatter_r_and_p_cover_no_point(run, report):
    """The r / p line sits above the axes (in the title), not in a box over the data."""
    ax = F.draw_h3_scatter(ice(run), {}).axes[0]
    assert not ax.texts and "p = " in ax.get_title()


def test_saturation_curve_draws_longcontrol_intervals_beside_the_others(run, report):
    fig = F.draw_saturation_curve(ice(run), {})
    ax = fig.axes[0]
    by_label = {c.get_label(): c for c in ax.containers}
    lc = by_label["LongControl"]
    assert all(lw > 0 for col in lc.lines[2] for lw in col.get_linewidths())  # the interval lines, not only caps
    xs = {name: np.asarray(c.lines[0].get_xdata(), dtype=float) for name, c in by_label.items()}
    span = np.diff(ax.get_xlim())[0]
    for load_x in xs["LongControl"]:
        for other in ("Saturation", "Residue"):
            assert np.min(np.abs(xs[other] - load_x)) > 0.02 * span  # markers side by side, none hidden


def test_ar_k_legend_sits_outside_and_panels_say_how_many_prompts(run, report):
    result = ice(run)
    fig = F.draw_ar_k(result, MODEL)
    assert fig.legends and not any(ax.get_legend() for ax in fig.axes)
    ar_k = [c for c in result.attention_cells if c.measure == "ar_k"]
    for ax, load in zip(fig.axes, sorted({c.load for c in ar_k})):
        cells = [c for c in ar_k if c.model == MODEL and c.load == load and c.condition in ("Saturation", "Residue")]
        for c in cells:
            assert f"{c.condition} {c.n_prompts}" in ax.get_title()


def test_every_table_scrolls_in_its_own_box(report):
    """Tables as wide as "What the model wrote" or H2 (15 columns) are wider than the page: each sits in a box that
    scrolls sideways, so the page keeps its width and its text stays in view."""
    html = report.read_text()
    assert html.count("<table>") >= 8
    assert html.count('<div class="tw"><table>') == html.count("<table>")
    assert html.count("</table></div>") == html.count("</table>")
    assert re.search(r"\.tw\{overflow-x:auto", html)


def test_attention_logistic_panel_shows_only_the_load_adjusted_fit(run, report):
    fig = F.draw_attention_behaviour(ice(run))
    bottom = fig.axes[1]
    labels = bottom.get_legend_handles_labels()[1]
    assert labels == ["adjusted for load and placement"] and "adjusted for load" in bottom.get_title()


def test_per_layer_titles_that_carry_a_reason_stay_inside_their_figure(run, report):
    """A per-layer panel that is not tested says why in its title; the reasons run to 250 characters (here the real
    minimum-of-questions reason), so the title must wrap rather than run off both sides of the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from probe.analysis.inference import few_contrast_reason

    result = ice(run)
    why = few_contrast_reason(3, 10, 6, "the other questions hold the tested regressor at one common value")
    assert len(why) > 200
    result = dataclasses.replace(result, attention_behaviour=tuple(
        dataclasses.replace(a, layer_tests=dataclasses.replace(a.layer_tests, is_test=False, reason=why))
        for a in result.attention_behaviour if a.layer_tests is not None), residue_attention=tuple(
        dataclasses.replace(r, test=dataclasses.replace(r.test, is_test=False, reason=why.replace(":", ";")))
        for r in result.residue_attention if r.test is not None))
    figures = [F.draw_attention_behaviour(result), F.draw_residue_attention(result)]
    assert all(f is not None for f in figures)
    for fig in figures:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        width = fig.bbox.width
        titles = [ax.title for ax in fig.axes if ax.get_title()]
        assert any(why[:40] in t.get_text() or "only 3 of 10" in t.get_text() for t in titles)
        for t in titles:
            box = t.get_window_extent(canvas.get_renderer())
            assert box.x0 >= -1 and box.x1 <= width + 1, f"title runs off the figure: {t.get_text()[:60]}"


def test_summary_claims_follow_the_numbers(run, report):
    result, settings = ice(run), read_analysis(run).settings
    h1 = result.h1_of(MODEL, "Saturation")
    text = " ".join(model_summary(result, MODEL, settings))
    if h1.estimate.p < 0.05 and h1.estimate.value < 0:
        assert "EM declines with load" in text
    else:
        assert "no significant change" in text and "declines" not in text
    # the same analysis with a non-significant slope must not speak of a decline
    forced = dataclasses.replace(
        result, h1=tuple(dataclasses.replace(h, estimate=dataclasses.replace(h.estimate, p=0.4)) for h in result.h1),
        taxonomy=tuple(dataclasses.replace(t, label="resilient", is_load_sensitive=False) for t in result.taxonomy))
    text = " ".join(model_summary(forced, MODEL, settings))
    assert "declines" not in text and "no significant change of EM with load" in text


def test_summary_quotes_only_what_survives_its_familys_correction(run, report):
    result, settings = ice(run), read_analysis(run).settings
    text = " ".join(model_summary(result, MODEL, settings))
    att = result.attention_of(MODEL)
    assert att.tracking_layers and "failed trials put more attention on extraneous text in layer" in text
    assert "distractor heads" in text
    # the same p-values with q-values that do not pass: nothing may be called significant
    h2 = tuple(dataclasses.replace(r, test=dataclasses.replace(r.test, p=0.001), q=0.2) for r in result.h2)
    h2_strict = tuple(dataclasses.replace(r, test=dataclasses.replace(r.test, p=0.001), q=0.2) for r in result.h2_strict)
    layers = tuple(dataclasses.replace(t, estimate=dataclasses.replace(t.estimate, p=0.001, q=0.3))
                   for t in att.layer_tests.layers)
    weak = dataclasses.replace(
        att, layer_tests=dataclasses.replace(att.layer_tests, layers=layers, significant=()), tracking_layers=(),
        heads=dataclasses.replace(att.heads, significant=()), distractor_heads=())
    residue = tuple(dataclasses.replace(r, test=dataclasses.replace(
        r.test, layers=tuple(dataclasses.replace(t, estimate=t.estimate.with_q(0.5)) for t in r.test.layers),
        significant=()))
        for r in result.residue_attention)
    forced = dataclasses.replace(result, h2=h2, h2_strict=h2_strict, attention_behaviour=(weak,), residue_attention=residue,
                                 h3=tuple(dataclasses.replace(h, correlation=dataclasses.replace(
                                     h.correlation, estimate=h.correlation.estimate.with_q(0.5)))
                                     for h in result.h3))
    text = " ".join(model_summary(forced, MODEL, settings))
    assert "no comparison survives the correction" in text and "significant after correction" not in text
    assert "no layer survives Benjamini–Hochberg over the 36 layers" in text
    assert "no head survives Benjamini–Hochberg over the 36 × 8 grid" in text and "distractor heads" not in text
    assert "degrade more" not in text and "no significant correlation" in text


def test_a_fit_below_the_minimum_number_of_questions_is_described_not_tested(tmp_path):
    d = tmp_path / "few"
    make_run(d, Plan(n_tasks=5, n_reps=3, beta_sat=-0.006, seed=3))
    analyze_run(d, AnalysisSection())
    text = " ".join(model_summary(ice(d), MODEL, AnalysisSection()))
    assert "described only, not tested" in text and "fewer than the minimum of 6" in text
    assert "declines" not in text and "p = " not in text.split("H2")[0]
    assert "H2 (paired comparisons): not tested (12)" in text  # every H2 comparison, with its reason
    h3 = next(x for x in model_summary(ice(d), MODEL, AnalysisSection()) if x.startswith("H3:"))
    assert "described only, not tested" in h3 and "p = " not in h3 and "degrade" not in h3  # H3 obeys the rule


def test_brittle_model_gets_no_inference(tmp_path):
    d = tmp_path / "brittle"
    make_run(d, Plan(n_tasks=10, p_control=0.03, beta_sat=0.0, beta_res=0.0, task_sd=0.0, seed=9))
    analyze_run(d, AnalysisSection())
    html = render_report(d).read_text()
    assert "no inference about extraneous load" in html
    text = " ".join(model_summary(ice(d), MODEL, AnalysisSection()))
    assert "declines" not in text and "β" not in text
    pngs = sorted(p.stem for p in (d / "figures").glob("*.png"))
    assert "saturation_curve" in pngs and not any(p.startswith("enrichment") for p in pngs)


def _append_trial(run: Path) -> None:
    extra = json.loads((run / "trials.jsonl").read_text().splitlines()[0])
    extra.update(trial_id="model-a::extra", prompt_id="extra", em=1.0)
    with (run / "trials.jsonl").open("a") as fh:
        fh.write(json.dumps(extra) + "\n")


def test_report_reads_the_analysis_on_disk_and_refuses_a_missing_or_stale_one(tmp_path):
    d = tmp_path / "stale"
    make_run(d, Plan(n_tasks=6, seed=1))
    with pytest.raises(AnalysisMissingError, match=r"probe analyze"):
        render_report(d)  # never analysed: the report does not analyse it behind the user's back
    assert not (d / "analysis.json").exists()
    analyze_run(d, AnalysisSection())
    before = (d / "analysis.json").read_bytes()
    _append_trial(d)
    with pytest.raises(StaleAnalysisError, match=r"trials\.jsonl changed.*probe analyze"):
        render_report(d)
    assert (d / "analysis.json").read_bytes() == before and not (d / "report.html").exists()
    analyze_run(d, AnalysisSection())
    assert render_report(d).is_file()


def test_an_analysis_of_another_schema_is_refused_with_what_to_do(tmp_path):
    d = tmp_path / "old"
    make_run(d, Plan(n_tasks=6, seed=1))
    analyze_run(d, AnalysisSection())
    data = json.loads((d / "analysis.json").read_text())
    old = {k: v for k, v in data.items() if k != "schema"}  # a file written before versions
    (d / "analysis.json").write_text(json.dumps(old))
    with pytest.raises(AnalysisSchemaError, match=rf"schema 1 .*reads schema {SCHEMA_VERSION}.*probe analyze"):
        read_analysis(d)
    data["families"]["ice"]["cells"][0]["em_meen"] = data["families"]["ice"]["cells"][0].pop("em_mean")
    (d / "analysis.json").write_text(json.dumps(data))
    with pytest.raises(AnalysisSchemaError, match=r"cells\[0\].*em_meen.*probe analyze"):
        render_report(d)


def test_compare_runs_puts_runs_side_by_side(run, report, tmp_path):
    other = tmp_path / "other"
    make_run(other, Plan(models=("model-b", "model-c"), n_tasks=8, beta_sat=0.0, beta_res=0.0, seed=2))
    with pytest.raises(CompareError, match=r"'other'.*not found.*probe analyze"):
        compare_runs([run, other], tmp_path / "cmp")  # compare analyses nothing itself
    analyze_run(other)
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


def test_compare_h1_forest_has_a_row_per_condition_so_a_run_without_saturation_is_drawn(run, report, tmp_path):
    """A knockout run has Residue cells alone: its H1 fit is Residue's, and the comparison's forest (Saturation only
    before) left the run out."""
    from probe.report.blocks import merge_results as merge
    from probe.report.ice import h1_forest_rows

    other = tmp_path / "residue-only"
    make_run(other, Plan(n_tasks=8, conditions=("Control", "Residue"), loads=(20, 80), seed=5))
    analyze_run(other)
    merged = merge([(n, read_analysis(d).families["ice"]) for n, d in (("demo", run), ("ko", other))])
    rows = h1_forest_rows(merged, {})
    assert [r[0] for r in rows] == [f"{m} · {h.condition}" for m in merged.models
                                    for c in ("Saturation", "Residue", "LongControl")
                                    for h in merged.h1 if h.model == m and h.condition == c]
    assert "ko: model-a · Residue" in [r[0] for r in rows] and not any(r[0].startswith("ko: model-a · Sat")
                                                                       for r in rows)
    (ko,) = [h for h in merged.h1 if h.model == "ko: model-a"]
    assert rows[-1][1:] == (ko.estimate.value, ko.estimate.ci_low, ko.estimate.ci_high)


def test_compare_says_so_when_an_analysis_is_stale_and_does_not_redo_it(run, report, tmp_path):
    other = tmp_path / "other"
    make_run(other, Plan(n_tasks=6, seed=3))
    analyze_run(other)
    before = (other / "analysis.json").read_bytes()
    _append_trial(other)
    with pytest.raises(CompareError, match=r"'other'.*stale.*trials\.jsonl changed.*probe analyze"):
        compare_runs([run, other], tmp_path / "cmp")
    assert (other / "analysis.json").read_bytes() == before


ODD_TASKS = ("a/b c:d", "Ünïcødé 問題 ✓", "t" * 200, "..", "x|y%7C~", "plain")


def test_any_task_id_finds_its_attention_record_through_analysis_and_report(tmp_path):
    run = tmp_path / "odd"
    model = "org/model a"
    plan = Plan(models=(model,), task_ids=ODD_TASKS, n_reps=1, loads=(50,), conditions=("Control", "Saturation",
                "Residue"), attention=True, n_layers=3, n_heads=2, beta_sat=-0.004, seed=8)
    trials = make_run(run, plan, prompt_id=make_prompt_id)
    folder = RunFolder(run)
    prompt_ids = {t.prompt_id for t in trials}
    assert len(prompt_ids) == len(ODD_TASKS) * 3
    assert all(folder.attention_record(model, pid).is_file() for pid in prompt_ids)
    assert not (folder.attention_root / model).exists()  # not where a path built from the raw names would be
    analysis = analyze_run(run)
    result = analysis.families["ice"]
    assert result.attention_cells and sum(c.n_prompts for c in result.attention_cells if c.measure == "p_ext") == \
        len(prompt_ids)
    assert not any("holds no record" in n for n in analysis.notes)
    n_extraneous = sum(t.is_scored and t.condition in ("Saturation", "Residue") for t in trials)
    assert result.attention_behaviour[0].n_trials == n_extraneous
    html = render_report(run).read_text(encoding="utf-8")
    assert "org/model a" in html and (run / "figures" / "enrichment_org_model_a.png").is_file()
    assert {p.stem for p in folder.figures.glob("*.png")} >= {"p_ext_layers_org_model_a", "ar_k_org_model_a"}


def test_numbers_are_written_by_one_formatter():
    from probe import formatting as fmt

    assert (fmt.num(None), fmt.num(float("nan")), fmt.num(0.12345), fmt.num(-0.004, "+.3f")) == \
        ("—", "—", "0.123", "-0.004")
    assert (fmt.p_value(0.0004), fmt.p_value(0.0004, html=True), fmt.p_value(0.04567)) == ("<0.001", "&lt;0.001", "0.046")
    assert (fmt.p_phrase(0.0004), fmt.p_phrase(0.2)) == ("p < 0.001", "p = 0.200")
    assert (fmt.pct(0.25), fmt.pct(None), fmt.ci(0.1, 0.2), fmt.ci(None, 0.2)) == ("25%", "—", "[0.100, 0.200]", "—")


def test_heads_table_names_the_model_each_selection_was_resolved_for() -> None:
    """Two models resolve the same top-k intervention to their own heads: the table gives each its own row, with its
    model, in the report and in analysis.md."""
    from probe.analysis.interventions import InterventionResult
    from probe.interventions import HeadSelection, Intervention
    from probe.report.interventions import SECTION, heads_rows

    def top(model: str, heads: tuple) -> Intervention:
        return Intervention(kind="knockout", keys="extraneous", heads=heads, name="top3", model=model,
                            selection=HeadSelection(from_run="outputs/sel", k=len(heads), by="retrieval"))

    result = InterventionResult(specs=(top("model-a", ((1, 2), (3, 0))), top("model-b", ((0, 1), (2, 2)))),
                                rows=(), specific=(), heads=(), sweeps=(), alpha=0.05, notes=())
    rows = heads_rows(result)
    assert [r[0] for r in rows] == ["model-a", "model-b"]
    assert rows[0][-1] == "L1.H2, L3.H0" and rows[1][-1] == "L0.H1, L2.H2"
    md = "\n".join(SECTION.markdown(result, AnalysisSection()))
    assert "| model | intervention |" in md and "| model-b | top3 |" in md


def test_paired_difference_without_interval_says_why_in_its_cell() -> None:
    """A knockout whose EM changes on 2 of 12 questions (one prompt each, as in a study of one prompt per question)
    has a difference but no interval (the minimum-G rule): the table's cell gives the difference and the reason's
    first clause, not a bare number; with an interval, the interval."""
    from probe.analysis.paired_ratio import paired_difference
    from probe.report.interventions import _diff

    questions = np.arange(12)
    base = np.zeros(12)
    few = base.copy()
    few[[0, 5]] = 1.0  # two questions carry the change
    d = paired_difference(few, base, questions)
    assert d.estimate.value is not None and d.estimate.ci_low is None and d.estimate.reason
    cell = _diff(d)
    assert cell.startswith(f"{d.estimate.value:+.3f} (no interval: ") and "2 of 12 questions" in cell, cell
    assert "no interval: no interval" not in cell and "docs/" not in cell
    questions = np.repeat(np.arange(12), 2)
    rng = np.random.default_rng(0)
    spread = (rng.random(24) < 0.6).astype(float)
    d = paired_difference(spread, np.zeros(24), questions)
    assert d.estimate.ci_low is not None and _diff(d).endswith("]") and "no interval" not in _diff(d)


def test_a_long_head_list_is_counted_per_layer_and_says_where_every_head_is():
    """The summary names a few heads one by one (marking those that pass BH only) and counts many per layer, never
    cutting a list short without saying so."""
    from probe.analysis.estimate import Estimate
    from probe.analysis.head_tests import HeadHit
    from probe.report.ice import HEADS_NAMED, _heads_phrase

    def hit(layer: int, head: int, value: float) -> HeadHit:
        return HeadHit(layer, head, Estimate(value=value, p=0.001, q=0.01))

    few = [hit(9, 7, 0.2), hit(12, 1, 0.1)]
    assert _heads_phrase(few, {(12, 1)}, "more") == "more: L9.H7 (BH only), L12.H1"
    many = [hit(layer, head, -0.1) for layer in (0, 1, 5) for head in range(layer + 5)]
    assert len(many) > HEADS_NAMED
    text = _heads_phrase(many, {(0, 0), (5, 3)}, "less")
    assert text == ("less: 21 heads in 3 layers (per layer: L0 5, L1 6, L5 10; 2 of them also pass max-T; every "
                    "head is in tables/attention_heads.csv)")
    assert _heads_phrase([], set(), "none") == ""


def test_a_run_without_residue_says_h3_is_not_estimated_instead_of_an_empty_table(tmp_path):
    from probe.analysis import analyze_run
    from probe.report.ice import NO_H3
    from probe.report.tables import render_markdown

    run = tmp_path / "no-residue"
    make_run(run, Plan(n_tasks=8, loads=(80,), conditions=("Control", "Saturation"), seed=4))
    md = render_markdown(analyze_run(run, AnalysisSection(), seed=0))
    h3 = md.split("### H3", 1)[1].split("\n#", 1)[0]
    assert NO_H3 in h3 and "| model |" not in h3
    html = render_report(run).read_text()
    assert NO_H3 in html


def test_h3_rows_show_how_far_s_sim_varied_and_degradation_by_third() -> None:
    """The H3 table's descriptive columns: S_sim's range over the questions and the mean degradation of each third
    of them by S_sim (questions without a finite S_sim left out; fewer than three: blank)."""
    from types import SimpleNamespace

    from probe.analysis.hypotheses import H3Point
    from probe.report.ice import h3_spread

    def row(pairs):
        return SimpleNamespace(points=tuple(H3Point(f"t{i}", s, d, 1.0, 1.0 - d) for i, (s, d) in enumerate(pairs)))

    pairs = [(0.30, 1.0), (-0.05, 0.0), (0.12, 0.0), (0.55, 1.0), (0.20, 1.0), (0.01, -1.0), (0.41, 0.0),
             (float("nan"), 1.0)]
    # sorted by S_sim: -0.05 0, 0.01 -1 | 0.12 0, 0.20 1 | 0.30 1, 0.41 0, 0.55 1
    assert h3_spread(row(pairs)) == ("-0.05 to +0.55", "-0.50 (2) / +0.50 (2) / +0.67 (3)")
    assert h3_spread(row(pairs[:2])) == ("", "")
