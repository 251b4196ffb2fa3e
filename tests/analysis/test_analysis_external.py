"""Trial files written by other tools: mapping, condition aliases, errors and truncation recognised, re-scoring."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from probe.analysis import analyze_external, read_analysis
from probe.records_import import (ExternalTrialsError, ends_mid_sentence, has_final_answer, load_external_trials,
                                  parse_mapping)
from probe.errors import ConfigError, ProbeError, UnknownNameError

FIXTURES = Path(__file__).parent.parent / "fixtures"
SMALL = FIXTURES / "external_trials.csv"
MAP = "model=llm,condition=cond,load=pct,replication=rep,run=batch,output=text,gold=truth"
PAPER = FIXTURES / "ice-paper-published-outputs.csv"  # the raw outputs published with the ICE paper's public code


def by_key(trials):
    return {(t.model, t.condition, t.load, t.meta["source_replication"]): t for t in trials}


def test_small_file_rows_are_classified_as_constructed():
    trials, summary = load_external_trials(SMALL, MAP)
    t = by_key(trials)
    assert len(trials) == 10 and summary.n_rows == 10
    assert t[("tool-a", "Control", 0, 0)].em == 1.0
    assert t[("tool-a", "Control", 0, 1)].em == 0.0 and not t[("tool-a", "Control", 0, 1)].truncated
    err = t[("tool-a", "Saturation", 20, 0)]
    assert err.error.startswith("API_ERROR") and err.em is None and not err.is_scored
    cut = t[("tool-a", "Saturation", 20, 1)]
    assert cut.truncated and cut.uninterpretable and cut.em == 0.0
    assert t[("tool-a", "LongControl", 0, 0)].em == 1.0
    empty = t[("tool-a", "Residue", 50, 0)]
    assert empty.skipped and empty.em is None
    refusal = t[("tool-a", "Residue", 50, 1)]
    assert not refusal.truncated and not refusal.uninterpretable and refusal.em == 0.0
    assert t[("tool-b", "Control", 0, 0)].em == 1.0
    assert t[("tool-b", "Saturation", 20, 0)].truncated and t[("tool-b", "Saturation", 20, 1)].truncated
    assert (summary.n_error, summary.n_skipped, summary.n_truncated) == (1, 1, 3)
    assert summary.truncation_rule.startswith("text")


def test_token_rule_uses_counts_and_the_limit():
    mapping = MAP + ",completion_tokens=n_out"
    trials, summary = load_external_trials(SMALL, mapping, max_new_tokens=25)
    with SMALL.open() as fh:
        rows = list(csv.DictReader(io.StringIO(fh.read().lstrip("\n"))))
    expected = {(r["llm"], r["rep"], r["text"][:20]) for r in rows
                if int(r["n_out"]) >= 25 and r["text"] and not r["text"].startswith("API_ERROR")}
    got = {(t.model, str(t.meta["source_replication"]), (t.output or "")[:20]) for t in trials if t.truncated}
    assert got == expected and len(got) == 5
    assert summary.truncation_rule.startswith(">= 25 output tokens")


def test_toml_mapping_with_condition_aliases(tmp_path):
    rows = "model,condition,output,gold\nm,Sat,\\boxed{7},7\nm,Control,\\boxed{7},7\n"
    f = tmp_path / "t.csv"
    f.write_text(rows)
    mapping, aliases = parse_mapping(FIXTURES / "external_mapping.toml")
    assert aliases == {"Sat": "Saturation"} and mapping["model"] == "llm"
    trials, _ = load_external_trials(f, {"model": "model", "condition": "condition", "output": "output", "gold": "gold"},
                                     aliases=aliases)
    assert [t.condition for t in trials] == ["Saturation", "Control"]
    with pytest.raises(UnknownNameError, match="condition 'Sat'"):
        load_external_trials(f)


def test_bad_mappings_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="no column 'nope'"):
        load_external_trials(SMALL, MAP + ",task_id=nope")
    with pytest.raises(UnknownNameError, match="mapping field 'modle'"):
        parse_mapping("modle=llm")
    with pytest.raises(ConfigError, match="no column for"):
        load_external_trials(SMALL, "model=llm")


def test_text_rule_helpers():
    assert has_final_answer("so \\boxed{3}") and has_final_answer("**Answer:** 3") and not has_final_answer("it is 3")
    assert ends_mid_sentence("and then we") and ends_mid_sentence("x = \\[ 3") and ends_mid_sentence("ended **")
    assert not ends_mid_sentence("That is all.") and not ends_mid_sentence("**Done.**")


def test_analyze_external_writes_a_run_folder(tmp_path):
    analysis, path = analyze_external(SMALL, MAP, tmp_path / "ext")
    assert path == tmp_path / "ext" / "analysis.json" and path.is_file()
    assert analysis.imported.n_error == 1 and analysis.n_error == 1 and analysis.n_skipped == 1
    assert read_analysis(tmp_path / "ext") == analysis  # the import summary round-trips through analysis.json
    manifest = json.loads((tmp_path / "ext" / "manifest.json").read_text())
    assert manifest["imported_from"]["sha256"] == analysis.imported.sha256
    cells = analysis.families["ice"].cells
    a_control = next(c for c in cells if c.model == "tool-a" and c.condition == "Control")
    assert a_control.em_mean == 0.5 and a_control.n == 2
    sat = next(c for c in cells if c.model == "tool-a" and c.condition == "Saturation")
    assert sat.n == 1 and sat.n_error == 1 and sat.truncated_rate == 1.0
    assert analysis.seed == 0 and analysis.seed_source == "argument"


@pytest.mark.parametrize("cell", ["", "nan", " NaN ", "null"])
def test_a_blank_or_nan_load_is_an_error_naming_file_line_and_column(tmp_path, cell):
    rows = SMALL.read_text().lstrip("\n").splitlines(keepends=True)
    # the Saturation row on the file's line 4 (after one blank line and the header) loses its load
    bad = [r if not r.startswith("tool-a,ContextSaturation,20,1") else r.replace(",20,1,", f",{cell},1,", 1)
           for r in rows]
    assert bad != rows
    f = tmp_path / "blank.csv"
    f.write_text("\n" + "".join(bad))
    line = 1 + next(i for i, r in enumerate(bad, 1) if r.startswith("tool-a,ContextSaturation,") and ",1,b1," in r)
    with pytest.raises(ExternalTrialsError, match=rf"blank\.csv:{line}: column 'pct' \(load\)"):
        load_external_trials(f, MAP)


def test_a_latin_1_file_is_named_with_its_line_and_byte(tmp_path):
    text = SMALL.read_text().replace("tool-b,Control,0,0", "tool-b,Contröl,0,0", 1)
    assert "Contröl" in text
    f = tmp_path / "latin.csv"
    f.write_bytes(text.encode("latin-1"))
    line = 1 + text.split("Contröl")[0].count("\n")
    with pytest.raises(ProbeError, match=rf"latin\.csv:{line}: not UTF-8 text: byte 0xf6 .*save the file as UTF-8"):
        load_external_trials(f, MAP)


def test_a_blank_load_of_a_control_row_needs_no_number(tmp_path):
    text = SMALL.read_text().replace("tool-b,Control,0,0", "tool-b,Control,,0")
    f = tmp_path / "control.csv"
    f.write_text(text)
    trials, _ = load_external_trials(f, MAP)
    assert next(t for t in trials if t.model == "tool-b" and t.condition == "Control").load == 0


def test_paper_outputs_errors_and_truncation_are_recognised(tmp_path):
    with PAPER.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(io.StringIO(fh.read().lstrip("\n"))))
    n_api = sum(r["output"].startswith("API_ERROR") for r in rows)
    analysis, _ = analyze_external(PAPER, None, tmp_path / "paper")
    imp = analysis.imported
    assert imp.preset == "ice-paper" and imp.n_rows == len(rows) == 720
    assert imp.n_error == analysis.n_error == n_api == 205
    trials = [json.loads(x) for x in (tmp_path / "paper" / "trials.jsonl").read_text().splitlines()]
    # gemini-2.0-flash answers completely: its re-scored EM equals the published accuracy on every scorable row
    flash = [t for t in trials if t["model"] == "gemini-2.0-flash" and t["error"] is None]
    assert len(flash) == 95 and all(t["em"] == float(t["meta"]["source_em"]) == 1.0 for t in flash)
    assert not any(t["truncated"] for t in flash)
    tax = {t.model: t.label for t in analysis.families["ice"].taxonomy}
    assert tax["gpt-5"] == tax["gemini-1.5-pro"] == "unscorable"
    for model in ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct",
                  "mistralai/Mistral-7B-Instruct-v0.2", "gpt-4.1"):
        mine = [t for t in trials if t["model"] == model]
        assert sum(t["truncated"] for t in mine) / len(mine) > 0.8, model
        assert tax[model] == "confounded"
    # replications of the different source files are distinct pairs, so H2 pairs are not ambiguous
    assert not any("ambiguous" in (r.test.reason or "") for r in analysis.families["ice"].h2)
    llama = next(r for r in analysis.families["ice"].h2 if r.model.endswith("3-8B-Instruct") and r.a == "LongControl")
    assert llama.test.n_pairs == 30
