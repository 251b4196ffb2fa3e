"""Interventions in experiments: the ``[[interventions]]`` section, resolution (sweeps, top-k heads), the runner's
trials and probe records per intervention, resumption, and refusals."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from probe.runner import run_experiment
from probe.runner.checks import check_inputs, check_interventions_supported
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts
from probe.config import config_from_dict, dump_config
from probe.errors import ConfigError
from probe.interventions import read_interventions
from probe.runner.resolve import resolve_interventions
from probe.loading import ModelCard
from probe.records import load_prompts, load_trials, make_trial_id
from tests.fixtures.interrupt import interrupt_run

pytestmark = pytest.mark.integration

INTERVENTIONS = [
    {"name": "ko", "kind": "knockout", "keys": "extraneous"},
    {"name": "ko-random", "kind": "knockout", "keys": "matched-random"},
    {"name": "sweep", "kind": "steer", "alpha": 0.0, "layers": {"window": 1, "stride": 1}},
]


def make_cfg(tmp_path: Path, card: Path, interventions=INTERVENTIONS, name: str = "iv", seed: int = 3,
             probe: bool = True):
    return config_from_dict({
        "experiment": {"name": name, "seed": seed, "models": [str(card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 2, "hops": 2}],
        "ice": {"conditions": ["Control", "Residue"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 4, "batch_size": 3},
        "probe": {"enabled": probe},
        "analysis": {"embedder": ""},
        "interventions": interventions,
    })


def test_run_records_every_prompt_once_per_intervention(tmp_path, tiny_card) -> None:
    from probe.runfolder import RunFolder

    cfg = make_cfg(tmp_path, tiny_card)
    run_dir = run_experiment(cfg, progress=False)
    trials = load_trials(run_dir / "trials.jsonl")
    prompts = {p.prompt_id for p in load_prompts(RunFolder(run_dir).prompts)}
    names = [None, "ko", "ko-random", "sweep@L0-0", "sweep@L1-1"]  # the tiny model has 2 layers
    assert len(trials) == len(prompts) * len(names) == 4 * 5
    assert {(t.prompt_id, t.intervention) for t in trials} == {(p, n) for p in prompts for n in names}
    assert all(t.trial_id == make_trial_id(t.model, t.prompt_id, t.intervention) for t in trials)
    by = {(t.prompt_id, t.intervention): t for t in trials}
    for t in trials:
        if t.intervention in ("ko", "ko-random"):
            ext_keys = t.meta["intervention_keys"]
            assert (ext_keys == 0) == (t.condition == "Control")
            # a Control prompt has no extraneous tokens: its knockout is the baseline, token for token
            if t.condition == "Control":
                assert t.output == by[(t.prompt_id, None)].output
    # the matched-random control edits as many tokens as the extraneous knockout
    for p in prompts:
        assert by[(p, "ko-random")].meta["intervention_keys"] == by[(p, "ko")].meta["intervention_keys"]
    # probe records per intervention, where the run folder names them
    folder = RunFolder(run_dir)
    for p in prompts:
        for n in names:
            assert folder.attention_record("tiny-llama", p, n).is_file()
    entries = read_interventions(run_dir)
    assert [e["name"] for e in entries] == names[1:]
    sweep = [e for e in entries if e["group"] == "sweep"]
    assert [e["window"] for e in sweep] == [[0, 0], [1, 1]] and [e["layers"] for e in sweep] == [[0], [1]]
    ko = entries[0]
    assert ko["layers"] == [0, 1] and ko["heads"] == "all" and ko["alpha"] is None and ko["kind"] == "knockout"
    assert ko["window"] is None and ko["selection"] is None and ko["model"] == "tiny-llama"


def test_an_intervention_runs_only_on_the_cells_it_names(tmp_path, tiny_card) -> None:
    """``conditions`` / ``loads`` restrict an intervention to those prompts; the baseline still runs on every one,
    and a resumed run adds nothing."""
    sections = [{"name": "ko", "kind": "knockout", "conditions": ["Residue"]},
                {"name": "ko-control", "kind": "knockout", "keys": "matched-random", "loads": [0]}]
    cfg = make_cfg(tmp_path, tiny_card, interventions=sections, probe=False)
    run_dir = run_experiment(cfg, progress=False)
    trials = load_trials(run_dir / "trials.jsonl")
    cells = {(t.intervention, t.condition) for t in trials}
    assert {c for iv, c in cells if iv is None} == {"Control", "Residue"}
    assert {c for iv, c in cells if iv == "ko"} == {"Residue"}
    assert {c for iv, c in cells if iv == "ko-control"} == {"Control"}
    assert len(trials) == 4 + 2 + 2
    saved = json.loads((run_dir / "interventions.json").read_text())
    assert [(d["name"], d["conditions"], d["loads"]) for d in saved] == [("ko", ["Residue"], None),
                                                                         ("ko-control", None, [0])]
    assert run_experiment(cfg, progress=False) == run_dir
    assert len(load_trials(run_dir / "trials.jsonl")) == len(trials)


def test_interrupted_intervention_run_resumes_without_duplicates(tmp_path, tiny_card, monkeypatch) -> None:
    cfg = make_cfg(tmp_path, tiny_card, interventions=INTERVENTIONS[:1], probe=False)
    first = interrupt_run(cfg, monkeypatch, stop_at=1, counted=lambda intervention: intervention is not None)
    path = cfg.run_dir / "trials.jsonl"
    assert 4 <= len(first) < 8
    run_experiment(cfg, progress=False)
    ids = [json.loads(x)["trial_id"] for x in path.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 8
    before = path.read_text()
    run_experiment(cfg, progress=False)
    assert path.read_text() == before


def test_top_k_heads_come_from_a_separate_probe_run(tmp_path, tiny_card) -> None:
    from probe.attention import SegmentAttention
    from probe.runfolder import RunFolder

    selection = make_cfg(tmp_path, tiny_card, interventions=[], name="select", seed=11)
    sel_dir = run_experiment(selection, progress=False)
    top = {"name": "top", "kind": "knockout", "heads": {"top_k": 3, "from": str(sel_dir), "random_control": True}}
    cfg = make_cfg(tmp_path, tiny_card, interventions=[top], seed=3)
    prepare_run_dir(cfg)
    prompts = build_run_prompts(cfg, progress=False)["tiny-llama"]
    resolved = resolve_interventions(cfg, "tiny-llama", 2, 4, prompts)
    # the reference ranking: mean enrichment over the selection run's records, computed here
    recs = [SegmentAttention.load(p) for p in sorted(RunFolder(sel_dir).attention_dir("tiny-llama").glob("*.npz"))]
    mean = np.nanmean(np.stack([r.enrichment for r in recs]), axis=0)
    want = sorted(((int(i) // 4, int(i) % 4) for i in np.argsort(-mean, axis=None)[:3]))
    assert [r.name for r in resolved] == ["top", "top+random"]
    assert sorted(resolved[0].heads) == want
    assert not set(resolved[1].heads) & set(resolved[0].heads) and len(resolved[1].heads) == 3
    sel = resolved[0].selection
    assert sel is not None and sel.from_run == str(sel_dir) and sel.k == 3 and sel.by == "enrichment"
    assert sel.n_prompts == len(recs) and sel.control_of is None
    assert resolved[1].selection == dataclasses.replace(sel, control_of="top")
    # the same questions in selection and test are refused: before anything is built (from the tasks and the
    # model's configuration), and again from the built prompts
    same = make_cfg(tmp_path, tiny_card, interventions=[top], name="same", seed=11)
    with pytest.raises(ConfigError, match="questions"):
        check_inputs(same)
    assert not same.run_dir.exists()
    prepare_run_dir(same)
    with pytest.raises(ConfigError, match="questions"):
        resolve_interventions(same, "tiny-llama", 2, 4, build_run_prompts(same, progress=False)["tiny-llama"])
    check_inputs(cfg)  # other questions: passes


def test_interventions_on_a_served_model_are_refused(tmp_path, tiny_card) -> None:
    cfg = make_cfg(tmp_path, tiny_card)
    served = ModelCard(name="served-test", source="api", backend="openai", base_url="http://127.0.0.1:1/v1",
                       served_model="m")
    with pytest.raises(ConfigError, match="local weights"):
        check_interventions_supported(cfg, [served])


def test_section_round_trips_through_the_run_config(tmp_path, tiny_card) -> None:
    sections = [*INTERVENTIONS,
                {"name": "pairs", "kind": "steer", "alpha": 0.5, "queries": "after", "layers": [0, 1],
                 "heads": [[0, 1], [1, 2]]},
                {"name": "top", "kind": "knockout", "heads": {"top_k": 2, "from": "outputs/x", "by": "p_ext"}},
                {"name": "cell", "kind": "knockout", "conditions": ["Residue"], "loads": [50]}]
    cfg = make_cfg(tmp_path, tiny_card, interventions=sections)
    assert config_from_dict(tomllib.loads(dump_config(cfg))) == cfg


@pytest.mark.parametrize("section, match", [
    ({"name": "a", "kind": "knockout", "alpha": 0.5}, r"interventions\['a'\]\.alpha"),
    ({"name": "a", "kind": "steer"}, r"\.alpha"),
    ({"name": "a", "kind": "steer", "alpha": -0.1}, r"\.alpha"),
    ({"name": "a b", "kind": "knockout"}, r"interventions\.name: 'a b'"),
    ({"name": "a+random", "kind": "knockout"}, r"interventions\.name: 'a\+random'"),
    ({"name": "a", "kind": "knockout", "model": "m"}, r"interventions\[0\]\.model: the runner sets it"),
    ({"name": "a", "kind": "reinject", "keys": "germane", "heads": [[0, 1]]}, "remove layers and heads"),
    ({"name": "a", "kind": "cut"}, r"\.kind"),
    ({"name": "a", "kind": "knockout", "keys": "noise"}, r"\.keys"),
    ({"name": "a", "kind": "knockout", "queries": "all"}, r"\.queries"),
    ({"name": "a", "kind": "knockout", "layers": "some"}, r"\.layers"),
    ({"name": "a", "kind": "knockout", "layers": {"window": 0}}, "window"),
    ({"name": "a", "kind": "knockout", "layers": {"window": 2}, "heads": [[0, 1]]}, "sweep"),
    ({"name": "a", "kind": "knockout", "heads": [[0]]}, r"\.heads"),
    ({"name": "a", "kind": "knockout", "heads": {"top_k": 0, "from": "x"}}, "top_k"),
    ({"name": "a", "kind": "knockout", "colour": 1}, "unknown key"),
    ({"name": "a", "kind": "reinject", "keys": "germane", "layers": [0]}, "remove layers and heads"),
    ({"name": "a", "kind": "reinject", "keys": "matched-random"}, r"\.keys: 'matched-random': a reinject repeats"),
    ({"kind": "knockout"}, r"missing key\(s\) name"),
    ({"name": "a", "kind": "knockout", "loads": ["50"]}, r"\.loads\[0\]: expected int, got '50'"),
    ({"name": "a", "kind": "knockout", "conditions": ["Saturation"]}, r"\.conditions: \['Saturation'\] not in"),
    ({"name": "a", "kind": "knockout", "conditions": "Residue"}, r"\.conditions: expected a list, got 'Residue'"),
    ({"name": "a", "kind": "knockout", "conditions": []}, r"\.conditions"),
    ({"name": "a", "kind": "knockout", "loads": [20]}, r"\.loads: \[20\] not in"),
    ({"name": "a", "kind": "knockout", "loads": [50, 50]}, r"\.loads"),
])
def test_section_errors_name_the_field(tmp_path, tiny_card, section, match) -> None:
    with pytest.raises(ConfigError, match=match):
        make_cfg(tmp_path, tiny_card, interventions=[section])


def test_duplicate_names_and_layers_outside_the_model_are_refused(tmp_path, tiny_card) -> None:
    with pytest.raises(ConfigError, match="used twice"):
        make_cfg(tmp_path, tiny_card, interventions=[INTERVENTIONS[0], INTERVENTIONS[0]])
    cfg = make_cfg(tmp_path, tiny_card, interventions=[{"name": "a", "kind": "knockout", "layers": [0, 2]}])
    with pytest.raises(ConfigError, match=r"layers \[2\]"):
        resolve_interventions(cfg, "tiny-llama", 2, 4)
    cfg = make_cfg(tmp_path, tiny_card, interventions=[{"name": "a", "kind": "knockout", "layers": {"window": 3}}])
    with pytest.raises(ConfigError, match="window = 3"):
        resolve_interventions(cfg, "tiny-llama", 2, 4)


def test_validate_checks_the_section(tmp_path, tiny_card, capsys) -> None:
    from probe.cli import main

    exp = tmp_path / "e.toml"
    exp.write_text(f'[experiment]\nname = "v"\nmodels = ["{tiny_card}"]\n[[tasks]]\nsource = "synthetic"\n'
                   '[[interventions]]\nname = "ko"\nkind = "knockout"\nalpha = 0.2\n')
    assert main(["validate", str(exp)]) != 0
    assert "alpha" in capsys.readouterr().err
    exp.write_text(exp.read_text().replace("alpha = 0.2\n", 'heads = {top_k = 2, from = "nowhere"}\n'))
    assert main(["validate", str(exp)]) != 0
    assert "nowhere" in capsys.readouterr().err


def test_probe_records_under_an_intervention_equal_a_separate_probe_of_the_edited_model(tmp_path, tiny_card) -> None:
    """The runner's probe record of a prompt under ``ko`` (computed during batched generation) equals probing that
    prompt alone inside ``probe.intervention`` with the same edit; and differs from its baseline record."""
    import probe
    from probe.attention import SegmentAttention
    from probe.interventions import Intervention
    from probe.runfolder import RunFolder

    cfg = make_cfg(tmp_path, tiny_card, interventions=INTERVENTIONS[:1])
    run_dir = run_experiment(cfg, progress=False)
    folder = RunFolder(run_dir)
    lm = probe.load_model(str(tiny_card), device="cpu")
    residue = [p for p in load_prompts(folder.prompts) if p.condition == "Residue"]
    assert residue
    for p in residue:
        got = SegmentAttention.load(folder.attention_record("tiny-llama", p.prompt_id, "ko"))
        base = SegmentAttention.load(folder.attention_record("tiny-llama", p.prompt_id))
        tp = lm.tokenize(p)
        with lm.intervention([tp], Intervention(kind="knockout", keys="extraneous", name="ko")):
            want = lm.probe(tp, cfg.probe)
        np.testing.assert_allclose(got.seg_mass, want.seg_mass, atol=1e-5)
        assert np.abs(got.seg_mass - base.seg_mass).max() > 1e-4


DILUTION = [
    {"name": "steer-germane", "kind": "steer", "alpha": 4.0, "keys": "germane"},
    {"name": "steer-matched", "kind": "steer", "alpha": 4.0, "keys": "matched-germane"},
    {"name": "re-germane", "kind": "reinject", "keys": "germane"},
    {"name": "re-filler", "kind": "reinject", "keys": "filler"},
]


def test_dilution_arms_steer_towards_the_facts_and_reinject_them_against_matched_controls(tmp_path, tiny_card):
    """The two arms of the dilution test and their controls run as interventions: a germane steer and its
    matched-germane twin edit as many keys; a reinject generates the prompt with the facts (or as many neutral
    sentences) repeated before the question, exactly as a direct generation of that prompt, unprobed; the analysis
    pairs each arm with its control."""
    from probe.analysis import analyze_run
    from probe.config import AnalysisSection
    from probe.prompts.reinject import reinject
    from probe.runfolder import RunFolder

    cfg = dataclasses.replace(make_cfg(tmp_path, tiny_card, interventions=DILUTION),
                              ice=dataclasses.replace(make_cfg(tmp_path, tiny_card).ice,
                                                      conditions=("Control", "LongControl", "Saturation")))
    run_dir = run_experiment(cfg, progress=False)
    folder = RunFolder(run_dir)
    trials = load_trials(run_dir / "trials.jsonl")
    prompts = {p.prompt_id: p for p in load_prompts(folder.prompts)}
    names = [None] + [d["name"] for d in DILUTION]
    assert {(t.prompt_id, t.intervention) for t in trials} == {(p, n) for p in prompts for n in names}
    by = {(t.prompt_id, t.intervention): t for t in trials}
    for pid, p in prompts.items():
        steer, matched = by[pid, "steer-germane"], by[pid, "steer-matched"]
        if p.condition == "Control":  # no filler or extraneous token to draw: the control says it is short
            assert matched.meta["intervention_keys"] == 0 < matched.meta["intervention_keys_wanted"]
        else:
            assert matched.meta["intervention_keys"] == steer.meta["intervention_keys"] > 0
        # a reinject adds text before the question, and is not probed (its prompt is not the recorded one)
        assert by[pid, "re-germane"].prompt_tokens > by[pid, None].prompt_tokens
        assert by[pid, "re-filler"].prompt_tokens > by[pid, None].prompt_tokens
        assert folder.attention_record("tiny-llama", pid, "steer-germane").is_file()
        assert not folder.attention_record("tiny-llama", pid, "re-germane").exists()
    from probe.backends import make_backend
    from probe.loading import get_card

    backend = make_backend(get_card(str(tiny_card)), device="cpu", seed=cfg.experiment.seed)
    edited = [reinject(p, what, cfg.experiment.seed) for p in prompts.values() for what in ("germane", "filler")]
    direct = {(p.prompt_id, p.segments[-2].kind): g for p, g in backend.generate(edited, cfg.generation)}
    for (pid, kind), g in direct.items():
        t = by[pid, "re-germane" if kind == "germane" else "re-filler"]
        assert (t.output, t.prompt_tokens) == (g.text, g.prompt_tokens)
    res = analyze_run(run_dir, AnalysisSection(), seed=0).interventions
    assert res is not None
    pairs = {(c.condition, c.a, c.b) for c in res.specific}
    for cond in ("Control", "LongControl", "Saturation"):
        assert {(cond, "steer-germane", "steer-matched"), (cond, "re-germane", "re-filler")} <= pairs
    control = [c for c in res.specific if c.condition == "Control" and c.a == "steer-germane"]
    assert control and control[0].unmatched is not None  # its control drew no token: never a claim


def test_the_manipulation_check_reports_the_mass_each_steer_moved(tmp_path, tiny_card) -> None:
    """Probed with the answer capture, each steer's check is the answer rows' mass on each segment kind under the
    steer against the same prompt's baseline: a steer with alpha 1 edits nothing, so it moves nothing (to float32
    rounding); alpha 4 on the germane facts raises their mass in every prompt; the baseline and steered masses are
    the records' own (summed over the kind's segments, averaged over answer tokens, layers and heads); the germane
    arm's row against its matched control is there."""
    from probe.analysis import analyze_run
    from probe.attention import SegmentAttention
    from probe.config import AnalysisSection
    from probe.runfolder import RunFolder

    arms = [{"name": "steer-germane", "kind": "steer", "alpha": 4.0, "keys": "germane"},
            {"name": "steer-matched", "kind": "steer", "alpha": 4.0, "keys": "matched-germane"},
            {"name": "steer-none", "kind": "steer", "alpha": 1.0, "keys": "germane"}]
    base_cfg = make_cfg(tmp_path, tiny_card, interventions=arms)
    cfg = dataclasses.replace(base_cfg, ice=dataclasses.replace(base_cfg.ice, conditions=("Control", "LongControl")),
                              probe=dataclasses.replace(base_cfg.probe, answer=True))
    run_dir = run_experiment(cfg, progress=False)
    moved = analyze_run(run_dir, AnalysisSection(), seed=0).interventions.moved
    rows = {(m.condition, m.intervention, m.kind): m for m in moved}
    for kind in ("germane", "filler"):
        none = rows["LongControl", "steer-none", kind].diff.estimate.value
        assert abs(none) < 1e-6  # alpha 1: the same model, the same answer, the same float32 attention
    g = rows["LongControl", "steer-germane", "germane"]
    assert g.target and not rows["LongControl", "steer-germane", "filler"].target
    assert rows["LongControl", "steer-matched", "filler"].target
    folder = RunFolder(run_dir)
    lc = [p for p in load_prompts(folder.prompts) if p.condition == "LongControl"]

    def mass(pid: str, name: str | None) -> float:
        a = SegmentAttention.load(folder.attention_record("tiny-llama", pid, name)).answer
        on = [i for i, k in enumerate(a.segment_kinds) if k == "germane"]
        return float(a.mass[:, :, :, on].sum(-1).mean())

    steered = [mass(p.prompt_id, "steer-germane") - mass(p.prompt_id, None) for p in lc]
    assert min(steered) > 0.01
    # 1e-6: the same float32 sums averaged in another order
    assert g.diff.estimate.value == pytest.approx(float(np.mean(steered)), abs=1e-6)
    assert g.base == pytest.approx(float(np.mean([mass(p.prompt_id, None) for p in lc])), abs=1e-6)
    assert ("LongControl", "steer-germane − steer-matched", "keys") in rows
