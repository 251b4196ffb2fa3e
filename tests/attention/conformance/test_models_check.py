"""`probe models --check PATH`: whether the probe supports a model, from its config.json alone (no weights: the model
is built on the meta device to find its attention layers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe.cli import main
from tests.attention.conformance.models import tiny_config


def check(tmp_path: Path, capsys, model_type: str) -> tuple[int, str]:
    folder = tmp_path / model_type
    tiny_config(model_type).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]  # no weights to load
    rc = main(["models", "--check", str(folder)])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi3", "gpt_oss", "deepseek_v3"])
def test_a_verified_type_is_supported_and_its_measures_named(tmp_path, capsys, model_type):
    rc, out = check(tmp_path, capsys, model_type)
    assert rc == 0, out
    assert f"model type: {model_type}" in out and "supported: yes" in out
    assert "layers: 2; attention in all of them" in out
    assert "AR_k" in out and "value-weighted shares" in out and "knockout and steer" in out


def test_learned_sinks_are_named(tmp_path, capsys):
    assert "learned sinks" in check(tmp_path, capsys, "gpt_oss")[1]


def test_a_hybrid_names_its_attention_layers_and_the_layers_it_will_not_measure(tmp_path, capsys):
    rc, out = check(tmp_path, capsys, "jamba")
    assert rc == 0 and "attention in 1: 1" in out
    assert "not measured: layer 0 has no attention" in out


def test_a_type_without_value_weighted_measures_says_so(tmp_path, capsys):
    rc, out = check(tmp_path, capsys, "qwen3_next")
    assert rc == 0 and "not measured: value-weighted shares" in out


def test_a_refused_type_says_why_and_exits_1(tmp_path, capsys):
    rc, out = check(tmp_path, capsys, "bloom")
    assert rc == 1
    assert "supported: no" in out and "AttentionInterface" in out


@pytest.mark.parametrize("arg, message", [
    ("{tmp}/nowhere", "no config.json there"),
    ("some-org/some-model", "not in the local hub cache"),
])
def test_no_config_is_a_clear_error(tmp_path, capsys, monkeypatch, arg, message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", "--check", arg.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unreadable_config_names_the_file(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-type"}')
    assert main(["models", "--check", str(tmp_path)]) == 2
    assert f"{tmp_path / 'config.json'}: transformers cannot read" in capsys.readouterr().err


def test_learned_sinks_take_mass_from_the_keys_and_no_key_mass_reports_it():
    """gpt-oss's sink logits: the rows on the keys sum to less than one, as its eager weights do; a higher sink
    logit takes more of its head's mass, and a row's P_ext (a share of that row's mass on keys) stays."""
    import torch

    from probe.attention import probe_tokenized
    from tests.attention.conformance.checks import prompt
    from tests.attention.conformance.models import build

    from probe.probe_options import ProbeOptions

    model = build("gpt_oss")
    tp = prompt()
    last = ProbeOptions(query="last")  # one query row: its P_ext is a ratio of its own masses, whatever the sink takes
    before = probe_tokenized(model, tp, last)
    assert (before.no_key_mass > 1e-4).any() and (before.no_key_mass >= -1e-6).all()
    with torch.no_grad():
        model.model.layers[0].self_attn.sinks[0] += 3.0  # the sink's odds x e^3 in layer 0, head 0
    after = probe_tokenized(model, tp, last)
    assert float(after.no_key_mass[0, 0]) > float(before.no_key_mass[0, 0]) + 0.1
    assert (after.no_key_mass[0, 1:] == before.no_key_mass[0, 1:]).all()  # the other heads' sinks are theirs
    assert abs(float(after.p_ext[0, 0]) - float(before.p_ext[0, 0])) < 1e-5
