"""Retrieval heads end to end: a probed run with the answer capture on (tiny random Llama) is analysed into
``families.ice.retrieval`` (the score map equal to a count over the run's records), reported, and its heads serve
``heads = {top_k = K, by = "retrieval"}`` for a second run on other questions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from probe.runner import run_experiment
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts
from probe.config import config_from_dict
from probe.errors import ConfigError

pytestmark = pytest.mark.integration


def cfg_of(tmp_path: Path, card: Path, name: str, seed: int, interventions: list | None = None):
    return config_from_dict({
        "experiment": {"name": name, "seed": seed, "models": [str(card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 3, "hops": 2}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 12, "batch_size": 3},
        "probe": {"enabled": True, "answer": True},
        "analysis": {"embedder": ""},
        "interventions": interventions or [],
    })


def test_a_probed_run_with_answer_capture_gets_retrieval_heads(tmp_path, tiny_card) -> None:
    from probe.analysis import analyze_run, read_analysis
    from probe.attention.result import SegmentAttention
    from probe.attention.retrieval import trial_retrieval
    from probe.runner.resolve import resolve_interventions
    from probe.records import load_trials
    from probe.report.render import render_report
    from probe.runfolder import RunFolder

    run_dir = run_experiment(cfg_of(tmp_path, tiny_card, "sel", 5), progress=False)
    run = RunFolder(run_dir)
    analysis = analyze_run(run_dir)
    ice = analysis.families["ice"]
    assert len(ice.retrieval) == 1 and ice.retrieval[0].reason is None
    r = ice.retrieval[0]
    assert r.control is not None and {c.condition for c in r.cells} == {"Control", "Saturation"}
    assert read_analysis(run_dir) == analysis
    # the Control map equals copied / copyable summed over the Control records, counted here
    trials = [t for t in load_trials(run.trials) if t.condition == "Control" and t.intervention is None]
    recs = [SegmentAttention.load(run.attention_record(t.model, t.prompt_id)).answer for t in trials]
    assert all(a is not None for a in recs)
    trs = [trial_retrieval(a) for a in recs]
    got = r.control.score.values  # as read back from the files: the analysis read back equals it (above)
    copyable = sum(t.copyable for t in trs)
    assert r.control.n_copyable == copyable and r.control.n_tokens == sum(t.n_tokens for t in trs) > 0
    if copyable:
        np.testing.assert_allclose(got, sum(t.copied for t in trs) / copyable, rtol=1e-6)
    else:  # a random model over SmolLM2's 49k-token vocabulary rarely writes a germane token: no score, no error
        assert np.isnan(got).all()
    html = Path(render_report(run_dir)).read_text()
    assert "Retrieval heads" in html and "not computed" not in html
    assert json.loads(run.analysis.read_text())["families"]["ice"]["retrieval"][0]["model"] == "tiny-llama"
    # the heads as an intervention's selection for a run on other questions
    top = {"name": "ret", "kind": "knockout", "heads": {"top_k": 2, "from": str(run_dir), "by": "retrieval"}}
    cfg = cfg_of(tmp_path, tiny_card, "test", 17, [top])
    prepare_run_dir(cfg)
    prompts = build_run_prompts(cfg, progress=False)["tiny-llama"]
    if copyable:
        resolved = resolve_interventions(cfg, "tiny-llama", 2, 4, prompts)
        sel = resolved[0].selection
        assert sel is not None and sel.by == "retrieval" and len(resolved[0].heads or ()) == 2
    else:
        with pytest.raises(ConfigError, match="copyable token"):
            resolve_interventions(cfg, "tiny-llama", 2, 4, prompts)


def test_a_compared_run_keeps_every_table_of_every_section_retrieval_included(tmp_path, tiny_card) -> None:
    """Several runs' results merge by one generic rule (every model renamed ``<run>: <model>``, every row kept):
    each CSV table of the merged result has the rows of both runs, and the comparison page shows the retrieval
    heads of each (the ICE merge written by hand dropped them)."""
    from probe.analysis import analyze_run
    from probe.report import compare_runs, report_section

    runs = [run_experiment(cfg_of(tmp_path, tiny_card, name, seed), progress=False)
            for name, seed in (("one", 5), ("two", 6))]
    analyses = [analyze_run(r) for r in runs]
    section = report_section("ice")
    merged = section.merged([(r.name, a.families["ice"]) for r, a in zip(runs, analyses)])
    alone = [dict(section.tables(a.families["ice"])) for a in analyses]
    together = dict(section.tables(merged))
    for name in {n for t in alone for n in t}:
        assert len(together.get(name, [])) == sum(len(t.get(name, [])) for t in alone), name
    assert {r.model for r in merged.retrieval} == {"one: tiny-llama", "two: tiny-llama"}
    page = compare_runs(runs, tmp_path / "cmp").read_text()
    assert "one: tiny-llama: top" in page and "two: tiny-llama: top" in page
