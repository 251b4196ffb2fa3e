"""CogniLoad in the analysis and report stages: needle/hay enrichment against a direct computation from the
attention records, the ``cogniload`` section of ``analysis.json``, ICE estimates untouched by CogniLoad trials,
and the report's CogniLoad section drawn from ``analysis.json`` alone.

The synthetic run is written with the real record classes (``TrialRecord``, ``SegmentAttention.save``); outcomes
follow a known U-shaped logistic model in rho; attention favours needles by a known, layer-dependent factor.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from probe.analysis import analyze_run, main_table
from probe.analysis.cogniload import analyze_cogniload
from probe.analysis.cogniload_attention import (
    CogniloadAttentionError,
    cogniload_attention,
    group_enrichment,
    prompt_enrichment,
)
from probe.analysis.tables import render_main_table
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.records import TrialRecord, append_jsonl, load_trials, make_trial_id
from probe.report import render_report
from probe.report import cogniload as CL

MODELS = ("model-a", "model-b")
GRID_D, GRID_N, GRID_RHO = (1, 3), (8, 20), (5, 50, 95)
PER_CELL = 8
N_LAYERS, N_HEADS = 4, 3
SEED = 777
N_BOOT = 40
CONFIG = f"""[experiment]
name = "cl"
seed = {SEED}
models = ["model-a", "model-b"]

[[tasks]]
source = "cogniload"

[analysis]
n_bootstrap = {N_BOOT}
"""


@dataclass
class Layout:
    """Ground truth of one fabricated prompt: which segments are needles and hay, and the query positions."""

    spans: list[tuple[int, int]]
    kinds: list[str]
    needles: list[int]
    hay: list[int]
    queries: list[int]


def _eta(d: int, n: int, rho: int) -> float:
    return 2.5 - 0.3 * d - 1.0 * math.log10(n) - 0.08 * rho + 0.0008 * rho**2  # U-shaped in rho


def _layout(d: int, n: int, rho: int, rng: np.random.Generator) -> tuple[Layout, int]:
    n_people = max(d, 2)
    poi = int(rng.integers(n_people))
    n0 = max(1, min(n, round(n * rho / 100)))
    needle_steps = set(rng.choice(n, size=n0, replace=False).tolist())
    kinds = ["sink", "instruction", "sink", "instruction"]  # BOS, instruction, separator, framing paragraph
    kinds += ["germane" if p == poi else "extraneous" for p in range(n_people)]
    kinds += ["germane" if t in needle_steps else "extraneous" for t in range(n)]
    kinds += ["question", "sink"]  # the question, then the template's generation prompt
    spans, pos = [], 0
    for k in kinds:
        width = {"sink": 2, "question": 6}.get(k, int(rng.integers(3, 12)))
        spans.append((pos, pos + width))
        pos += width
    first = 4 + n_people
    needles = [i for i in range(first, first + n) if kinds[i] == "germane"]
    hay = [i for i in range(first, first + n) if kinds[i] == "extraneous"]
    q = spans[-2]
    queries = [*range(q[0], q[1]), pos - 1]  # the question tokens and the last prompt token
    return Layout(spans, kinds, needles, hay, queries), n_people


def _chance(lay: Layout, members: list[int]) -> float:
    """SPEC §4 chance of a key set under a full causal mask, counted token by token from the query positions."""
    is_member = np.zeros(lay.spans[-1][1], dtype=bool)
    is_nonsink = np.zeros_like(is_member)
    for i, (a, b) in enumerate(lay.spans):
        is_member[a:b] = i in members
        is_nonsink[a:b] = lay.kinds[i] != "sink"
    num = np.mean([is_member[: q + 1].sum() / (q + 1) for q in lay.queries])
    den = np.mean([is_nonsink[: q + 1].sum() / (q + 1) for q in lay.queries])
    return float(num / den)


def _record(lay: Layout, rho: int, rng: np.random.Generator) -> SegmentAttention:
    n_seg = len(lay.kinds)
    weights = np.ones((N_LAYERS, N_HEADS, n_seg))
    boost = np.array([0.5, 1.0, 2.0, 4.0])[:, None] * (1 + rho / 100)  # needles favoured more in later layers
    weights[..., lay.needles] *= boost[..., None]
    weights *= np.array([3.0 if k in ("sink", "question") else 1.0 for k in lay.kinds])
    mass = np.stack([[rng.dirichlet(w * 4) for w in row] for row in weights]).astype(np.float32)  # (L, H, S)
    by_kind = np.zeros((N_LAYERS, N_HEADS, len(KEY_KINDS)), dtype=np.float64)
    for s, k in enumerate(lay.kinds):
        by_kind[..., KEY_KINDS.index(k)] += mass[..., s]
    ext_all = [i for i, k in enumerate(lay.kinds) if k == "extraneous"]
    p_ext = by_kind[..., KEY_KINDS.index("extraneous")] / (1 - by_kind[..., KEY_KINDS.index("sink")])
    return SegmentAttention(
        seg_mass=by_kind.astype(np.float32), seg_mass_segment=mass, p_ext=p_ext.astype(np.float32),
        chance=np.full(N_LAYERS, _chance(lay, ext_all), dtype=np.float32), ar_k=None, kinds=KEY_KINDS,
        segment_labels=tuple(f"{k[:3]}{i}" for i, k in enumerate(lay.kinds)), segment_kinds=tuple(lay.kinds),
        segment_spans=tuple(lay.spans), ar_targets=(),
        options={"query": "question", "gamma": 0.5, "residue_mode": "cosine", "exclude_sink": True},
        n_tokens=lay.spans[-1][1], n_prompt_tokens=lay.spans[-1][1], n_queries=len(lay.queries))


def make_cogniload_run(run_dir: Path, models: tuple[str, ...] = MODELS, seed: int = 3) -> dict[str, Layout]:
    """Trials, attention records and config of a CogniLoad run; returns each prompt's layout."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(CONFIG, encoding="utf-8")
    layouts: dict[str, Layout] = {}
    trials: list[TrialRecord] = []
    for d in GRID_D:
        for n in GRID_N:
            for rho in GRID_RHO:
                for i in range(PER_CELL):
                    tid = f"cl-d{d}-N{n}-r{rho}-{i:04d}"
                    pid = f"{tid}.CogniLoad.L0.r0"
                    lay, n_people = _layout(d, n, rho, rng)
                    layouts[pid] = lay
                    meta = {"d": d, "N": n, "rho": rho, "n_needles": len(lay.needles), "n_hay": len(lay.hay),
                            "n_people": n_people}
                    for model in models:
                        em = float(rng.random() < 1 / (1 + math.exp(-_eta(d, n, rho))))
                        trials.append(TrialRecord(
                            trial_id=make_trial_id(model, pid), model=model, prompt_id=pid, task_id=tid,
                            source="cogniload", condition="CogniLoad", load=rho, achieved_load=float(rho),
                            replication=0, prompt_tokens=lay.spans[-1][1], output="x", answer="x", gold="x", em=em,
                            hop_recall=None, truncated=bool(rng.random() < 0.1), uninterpretable=False, meta=meta,
                            family="cogniload"))
                        _record(lay, rho, rng).save(run_dir / "attention" / model / f"{pid}.npz")
    append_jsonl(run_dir / "trials.jsonl", (t.to_dict() for t in trials))
    return layouts


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict[str, Layout]]:
    d = tmp_path_factory.mktemp("cl") / "cl-run"
    return d, make_cogniload_run(d)


@pytest.fixture(scope="module")
def analysis(run) -> dict:
    return analyze_run(run[0], fill_similarity=False)


# ------------------------------------------------------------------------------------------ enrichment


def _direct(run_dir: Path, lay: Layout, model: str, pid: str) -> tuple[np.ndarray, np.ndarray]:
    """Head-mean needle and hay enrichment per layer, straight from the definition and the prompt's layout."""
    sa = SegmentAttention.load(run_dir / "attention" / model / f"{pid}.npz")
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
    got = cogniload_attention(run_dir, trials)
    meta = {t.prompt_id: t.meta for t in trials}
    for model in MODELS:
        direct = {pid: _direct(run_dir, lay, model, pid) for pid, lay in layouts.items()}
        s = got["models"][model]
        assert s["n_prompts"] == len(layouts) and s["n_layers"] == N_LAYERS and s["query"] == ["question"]
        for g, j in (("needle", 0), ("hay", 1)):
            stack = np.stack([v[j] for v in direct.values()])  # (prompt, L)
            for li in range(N_LAYERS):
                col = stack[:, li][np.isfinite(stack[:, li])]
                lo, hi = scipy.stats.t.interval(0.95, len(col) - 1, loc=col.mean(), scale=scipy.stats.sem(col))
                assert s["layer"][g]["n"][li] == len(col)
                np.testing.assert_allclose([s["layer"][g]["mean"][li], s["layer"][g]["ci_low"][li],
                                            s["layer"][g]["ci_high"][li]], [col.mean(), lo, hi], rtol=1e-5)
            for knob in ("rho", "N"):
                by = s[f"by_{knob}"]
                assert by["levels"] == sorted({m[knob] for m in meta.values()})
                for k, level in enumerate(by["levels"]):
                    rows = np.stack([v[j] for pid, v in direct.items() if meta[pid][knob] == level])
                    with np.errstate(all="ignore"):
                        want = np.array([r[np.isfinite(r)].mean() for r in rows.T])
                    np.testing.assert_allclose([by[g][li][k] for li in range(N_LAYERS)], want, rtol=1e-5)
                    assert by["n"][k] == len(rows)
        ratio = np.stack([np.log2(v[0] / v[1]) for v in direct.values()])
        with np.errstate(all="ignore"):
            want = np.array([c[np.isfinite(c)].mean() for c in ratio.T])
        np.testing.assert_allclose(s["layer"]["log2_ratio"]["mean"], want, rtol=1e-5)


def test_planted_needle_preference_is_recovered(analysis):
    att = analysis["cogniload"]["attention"]["models"]["model-a"]
    ratio = att["layer"]["log2_ratio"]["mean"]
    assert ratio[0] < 0 < ratio[-1]  # needles down-weighted (x0.5) in layer 0, favoured (x4) in the last layer
    assert all(a < b for a, b in zip(ratio, ratio[1:]))
    # the needle boost grows with rho, so the contrast does too
    by = att["by_rho"]["layer_mean"]["log2_ratio"]
    assert by[0] < by[-1]


def test_all_extraneous_segments_give_back_the_records_enrichment(run):
    run_dir, layouts = run
    for pid in list(layouts)[:6]:
        sa = SegmentAttention.load(run_dir / "attention" / "model-a" / f"{pid}.npz")
        ext = [i for i, k in enumerate(sa.segment_kinds) if k == "extraneous"]
        np.testing.assert_allclose(group_enrichment(sa, ext), sa.enrichment, rtol=1e-5)


def test_a_record_of_another_layout_is_refused(run):
    run_dir, layouts = run
    pid = next(iter(layouts))
    trial = next(t for t in load_trials(run_dir / "trials.jsonl") if t.prompt_id == pid)
    sa = SegmentAttention.load(run_dir / "attention" / trial.model / f"{pid}.npz")
    trial.meta = {**trial.meta, "n_people": trial.meta["n_people"] + 1}
    with pytest.raises(CogniloadAttentionError, match="n_people"):
        prompt_enrichment(sa, trial)


def test_no_hay_statement_leaves_hay_empty_not_zero(run):
    run_dir, layouts = run
    pid = next(p for p, lay in layouts.items() if not lay.hay)  # N = 8 at rho = 95: eight needles, no hay
    trial = next(t for t in load_trials(run_dir / "trials.jsonl") if t.prompt_id == pid)
    row = prompt_enrichment(SegmentAttention.load(run_dir / "attention" / trial.model / f"{pid}.npz"), trial)
    assert np.isnan(row.hay).all() and np.isfinite(row.needle).all() and np.isnan(row.log2_ratio).all()


# ------------------------------------------------------------------------------------------ analysis.json


def _wilson(k: int, n: int, z: float = scipy.stats.norm.ppf(0.975)) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_cogniload_section_of_the_analysis(run, analysis):
    run_dir, _ = run
    trials = load_trials(run_dir / "trials.jsonl")
    cl = analysis["cogniload"]
    assert cl["seed"] == SEED and cl["n_bootstrap"] == N_BOOT  # from the run's config.toml
    direct = json.loads(json.dumps(analyze_cogniload(trials, N_BOOT, SEED)))
    assert cl["models"] == direct["models"]
    quad = cl["models"]["model-a"]["fits"]["quadratic"]
    assert quad["status"] == "ok" and quad["params"]["rho2"]["estimate"] > 0  # the planted U-shape
    for model in MODELS:
        mine = [t for t in trials if t.model == model]
        cells = cl["cells"][model]
        assert cells["overall"]["n"] == len(mine) and cells["overall"]["condition"] == "CogniLoad"
        for knob in ("d", "N", "rho"):
            levels = sorted({t.meta[knob] for t in mine})
            assert [c["level"] for c in cells[knob]] == levels
            for c, level in zip(cells[knob], levels):
                ys = [t.em for t in mine if t.meta[knob] == level]
                assert c["n"] == len(ys) and c["em_mean"] == pytest.approx(np.mean(ys))
                assert (c["em_ci_low"], c["em_ci_high"]) == pytest.approx(_wilson(int(sum(ys)), len(ys)))
                assert c["truncated_rate"] == pytest.approx(
                    np.mean([t.truncated for t in mine if t.meta[knob] == level]))
    # CogniLoad trials are not ICE cells, nor a taxonomy without a Control condition
    assert analysis["cells"] == [] and analysis["h1"] == [] and analysis["taxonomy"] == []
    assert analysis["n_trials"] == len(trials) == analysis["n_cogniload"]
    for name in ("cogniload_accuracy", "cogniload_fits", "cogniload_thresholds", "cogniload_attention_layers"):
        assert (run_dir / "tables" / f"{name}.csv").read_text().count("\n") > 1


def test_ice_estimates_ignore_cogniload_trials(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("synthetic_run", Path(__file__).parent / "fixtures" /
                                                  "synthetic_run.py")
    synthetic_run = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("synthetic_run", synthetic_run)
    spec.loader.exec_module(synthetic_run)
    ice = tmp_path / "ice"
    synthetic_run.make_run(ice, synthetic_run.Plan(models=("model-a",), n_tasks=8, n_reps=1, loads=(20, 80),
                                                   attention=True, seed=5))
    mixed = tmp_path / "mixed"
    shutil.copytree(ice, mixed)
    cl = tmp_path / "cl-only"
    make_cogniload_run(cl, models=("model-a",), seed=9)
    with (mixed / "trials.jsonl").open("a", encoding="utf-8") as fh:
        fh.write((cl / "trials.jsonl").read_text(encoding="utf-8"))
    shutil.copytree(cl / "attention" / "model-a", mixed / "attention" / "model-a", dirs_exist_ok=True)
    a = analyze_run(ice, fill_similarity=False)
    b = analyze_run(mixed, fill_similarity=False)
    for key in ("cells", "h1", "h2", "h3", "taxonomy", "attention_cells", "attention_behaviour"):
        assert b[key] == a[key], key
    assert b["cogniload"]["cells"]["model-a"]["overall"]["n"] == b["n_cogniload"] > 0
    assert not any("holds no record" in n for n in b["notes"])
    text = render_main_table(b)
    assert re.search(r"model-a\s+CogniLoad\s+all\s+" + str(b["n_cogniload"]), text)
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


def test_accuracy_figure_plots_the_trial_means(run, analysis):
    run_dir, _ = run
    trials = load_trials(run_dir / "trials.jsonl")
    fig = CL.draw_accuracy_by_knob(analysis)
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
    th = a["cogniload"]["models"]["model-a"]["thresholds"]["NT50"]
    th.update(value=42.5, ci_low=40.1, ci_high=44.9, status="ok", reason=None, n_boot_defined=N_BOOT,
              n_boot_undefined=0, ci_note=None)
    by = a["cogniload"]["attention"]["models"]["model-a"]["by_rho"]
    by["needle"] = [[2.0] * len(by["levels"]) for _ in range(N_LAYERS)]
    path.write_text(json.dumps(a))
    html = render_report(work).read_text()
    assert "42.5 percent [40.1, 44.9]" in html
    fig = CL.draw_needle_hay_heatmaps(json.loads(path.read_text()), "model-a")
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), 1.0)  # log2(2): drawn as stored
