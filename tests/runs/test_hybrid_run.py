"""A hybrid attention / state-space model (a tiny Jamba: one Mamba layer, one attention layer) and a model with learned
sinks (a tiny gpt-oss) through the whole pipeline: probe run with the answer capture and a knockout, analysis,
report. The layer without attention is NaN in every record and named in the report's by-layer figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.experiment import tiny_experiment

pytestmark = pytest.mark.integration


def _card(root: Path, model_type: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from probe.loading import get_card, load_tokenizer
    from tests.attention.conformance.models import tiny_config

    tok = load_tokenizer(get_card("smollm2-135m-instruct"))
    cfg = tiny_config(model_type)
    cfg.vocab_size, cfg.max_position_embeddings = len(tok), 4096
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / model_type)
    tok.save_pretrained(root / model_type)
    card = root / f"tiny-{model_type}.toml"
    card.write_text(f'name = "tiny-{model_type}"\nsource = "local"\npath = "{root / model_type}"\n'
                    'dtype = "float32"\ncontext_window = 4096\n')
    return card


def test_a_hybrid_and_a_sink_model_run_analyse_and_report(tmp_path):
    from probe.attention.result import SegmentAttention
    from probe.cli import main
    from probe.records import load_trials
    from probe.runfolder import RunFolder

    cards = [_card(tmp_path, "jamba"), _card(tmp_path, "gpt_oss")]
    exp = tiny_experiment(tmp_path / "exp.toml", cards, generation={"max_new_tokens": 4},
                          probe={"enabled": True, "answer": True},
                          interventions=[{"name": "ko-ext", "kind": "knockout", "keys": "extraneous"}])
    assert main(["run", str(exp), "--analyze", "--report"]) == 0
    run = RunFolder(tmp_path / "outputs" / "tiny")
    trials = load_trials(run.trials)
    assert {t.model for t in trials} == {"tiny-jamba", "tiny-gpt_oss"} and all(t.error is None for t in trials)
    for t in trials:
        rec = SegmentAttention.load(run.attention_record(t.model, t.prompt_id, t.intervention))
        assert rec.answer is not None
        if t.model == "tiny-jamba":  # layer 0 is a Mamba layer: no attention, NaN; layer 1 measured
            assert np.isnan(rec.p_ext[0]).all() and np.isfinite(rec.p_ext[1]).all()
            assert np.isnan(rec.answer.mass[:, 0]).all() and np.isfinite(rec.answer.mass[:, 1]).all()
        else:  # learned sinks: some mass goes to no key, none below zero
            assert np.isfinite(rec.p_ext).all() and (rec.no_key_mass > 0).any()
    captions = json.loads(run.figure_index.read_text())
    assert run.report.is_file() and captions
    from probe.report.ice_figures import no_attention_note

    assert no_attention_note({0}) == "; layer 0 has no attention (not measured)"
