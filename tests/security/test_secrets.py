"""An API key never reaches a record, a log line or an error message: a key that no HTTP header can carry (a line
break, a control character, non-ASCII) is refused when the backend is built, without quoting it; any other failure
that could quote the key (a transport error, a server that echoes the request) is recorded by type and a message with
the key taken out."""

from __future__ import annotations

import logging
import re

import pytest

from probe.backends.openai import EndpointError, OpenAIBackend, scrub_secret
from probe.errors import ConfigError
from tests.backends.test_openai_backend import FAST, Action, make_card, make_prompt, run, server  # noqa: F401

KEYS_NO_HEADER_CAN_CARRY = {
    "two-line file": "sk-first-line-AAAA\nsecond-line-BBBB",
    "crlf": "sk-crlf-CCCC\r\nDDDD-dddd",
    "inner tab": "sk-tab\tDDDD-EEEE",
    "non-ascii": "sk-ünïcode-FFFF",
    "escape": "sk-esc\x1bGGGG",  # (an environment variable cannot hold NUL)
}


def pieces(key: str) -> list[str]:
    """Every run of 4+ letters, digits, "-" or "_" of the key: none may appear anywhere."""
    return re.findall(r"[A-Za-z0-9_-]{4,}", key)


@pytest.mark.parametrize("label", list(KEYS_NO_HEADER_CAN_CARRY))
def test_a_key_no_header_can_carry_is_refused_without_quoting_it(monkeypatch, caplog, label):
    key = KEYS_NO_HEADER_CAN_CARRY[label]
    monkeypatch.setenv("PROBE_TEST_API_KEY", key)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError, match="PROBE_TEST_API_KEY") as info:
        OpenAIBackend(make_card("http://127.0.0.1:9/v1", api_key_env="PROBE_TEST_API_KEY"), retry=FAST)
    for text in (str(info.value), caplog.text):
        for p in pieces(key):
            assert p not in text


def test_a_transport_error_is_recorded_by_type_without_the_key(monkeypatch, caplog):
    key = 'sk-quo"ted\'-HHHH-IIII'  # quotes are legal in a header value: the request is sent
    monkeypatch.setenv("PROBE_TEST_API_KEY", key)
    caplog.set_level(logging.DEBUG)
    backend = OpenAIBackend(make_card("http://127.0.0.1:9/v1", api_key_env="PROBE_TEST_API_KEY", max_retries=1),
                            retry=FAST)
    g = run(backend, [make_prompt(1)])["p1"]
    assert g.error is not None and "ConnectError" in g.error
    for text in (g.error, caplog.text):
        assert "HHHH" not in text and key not in text


def test_a_server_echoing_the_key_has_it_taken_out_of_the_record_and_the_error(server, monkeypatch, caplog):
    url, script = server
    key = "sk-echoed-JJJJ-KKKK"
    monkeypatch.setenv("PROBE_TEST_API_KEY", key)
    caplog.set_level(logging.DEBUG)
    backend = OpenAIBackend(make_card(url, api_key_env="PROBE_TEST_API_KEY", max_retries=1), retry=FAST)
    script.default = Action(status=400, body={"error": {"message": f"bad header Bearer {key}"}})
    errors = [run(backend, [make_prompt(1)])["p1"].error]
    script.default = Action(status=503, body=f"upstream said: Authorization: Bearer {key}")
    errors.append(run(backend, [make_prompt(2)])["p2"].error)
    assert all(errors) and all("JJJJ" not in e for e in errors), errors
    assert "JJJJ" not in caplog.text
    script.default = Action(status=401, body={"error": {"message": f"Incorrect API key provided: {key}"}})
    with pytest.raises(EndpointError) as info:
        run(backend, [make_prompt(3)])
    assert "JJJJ" not in str(info.value) and "401" in str(info.value)


@pytest.mark.parametrize("key", ["sk-abcd\nefgh-1234", "sk-ünï-5678", 'sk-"q\'-9999'])
def test_scrub_takes_out_the_key_in_every_form_an_error_may_quote_it(key):
    quoted = [key, repr(key), repr(key.encode("utf-8")), key.encode("unicode_escape").decode(),
              f"Illegal header value {('Bearer ' + key).encode('utf-8')!r}"]
    for text in quoted:
        out = scrub_secret(f"before {text} after", key)
        for p in pieces(key):
            assert p not in out, (text, out)
        assert out.startswith("before") and out.endswith("after")


# --- which variable a card may send, and which card a model came from ---------------------------------------------


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL", "HOME", "openai_api_key"])
def test_a_card_may_not_send_a_variable_that_is_not_an_api_key(monkeypatch, name):
    monkeypatch.setenv(name, "sk-not-for-this-server-LLLL")
    monkeypatch.delenv("ICE_PROBE_KEY_VARS", raising=False)
    with pytest.raises(ConfigError, match=rf"api_key_env = '{name}' is not an API key variable.*ICE_PROBE_KEY_VARS"):
        OpenAIBackend(make_card("http://127.0.0.1:9/v1", api_key_env=name), retry=FAST)


def test_a_variable_the_user_allows_may_be_sent(server, monkeypatch):
    url, script = server
    monkeypatch.setenv("MY_GATEWAY_TOKEN", "tok-MMMM")
    monkeypatch.setenv("ICE_PROBE_KEY_VARS", "OTHER, MY_GATEWAY_TOKEN")
    run(OpenAIBackend(make_card(url, api_key_env="MY_GATEWAY_TOKEN"), retry=FAST), [make_prompt(1)])
    assert script.requests[0][1]["authorization"] == "Bearer tok-MMMM"


def test_probe_models_marks_a_user_card_that_hides_a_shipped_one(tmp_path, monkeypatch, capsys):
    from probe.cli import main

    (tmp_path / "smollm2-135m-instruct.toml").write_text(
        'name = "smollm2-135m-instruct"\nsource = "api"\nbackend = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'served_model = "x"\n')
    monkeypatch.setenv("ICE_PROBE_MODELS", str(tmp_path))
    assert main(["models"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("smollm2-135m-instruct "))
    assert f"your card {tmp_path / 'smollm2-135m-instruct.toml'} hides the shipped one" in row


def test_the_manifest_records_which_card_file_each_model_came_from(tmp_path, tiny_card):
    import json

    from probe.config import load_config
    from probe.loading import get_card
    from probe.runner.folder import write_manifest
    from tests.fixtures.experiment import tiny_experiment

    cfg = load_config(tiny_experiment(tmp_path / "exp.toml", [tiny_card, "smollm2-135m-instruct"]))
    cards = [get_card(str(tiny_card)), get_card("smollm2-135m-instruct")]
    (tmp_path / "run").mkdir()
    write_manifest(tmp_path / "run", cfg, cards, {})
    models = json.loads((tmp_path / "run" / "manifest.json").read_text())["models"]
    assert models["tiny-llama"]["card_file"] == str(tiny_card) and models["tiny-llama"]["shipped"] is False
    assert models["smollm2-135m-instruct"]["shipped"] is True
    assert models["smollm2-135m-instruct"]["card_file"].endswith("smollm2-135m-instruct.toml")
