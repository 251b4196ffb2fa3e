"""Record files: a half-written last line is an interrupted write and is skipped (then cut on the next append);
any other line that is not a record stops the reader with ``file:line``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from probe.errors import ProbeError
from probe.records import (RecordError, TrialRecord, append_jsonl, iter_jsonl, load_prompts, load_trials,
                           make_trial_id, read_jsonl, write_jsonl)
from probe.types import Prompt, Segment


def trial(i: int, **changes) -> dict:
    rec = TrialRecord(trial_id=make_trial_id("m", f"t{i}|Control|L0|r0"), model="m", prompt_id=f"t{i}|Control|L0|r0",
                      task_id=f"t{i}", source="synthetic", condition="Control", load=0, achieved_load=0.0,
                      replication=0, prompt_tokens=10, output="x", answer="x", gold="x", em=1.0, hop_recall=1.0,
                      truncated=False, uninterpretable=False)
    return {**rec.to_dict(), **changes}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_a_half_written_last_line_is_skipped_then_cut(tmp_path, caplog):
    path = write_lines(tmp_path / "trials.jsonl", [json.dumps(trial(0)) + "\n", json.dumps(trial(1))[:30]])
    with caplog.at_level(logging.WARNING):
        assert [t.task_id for t in load_trials(path)] == ["t0"]
    assert "trials.jsonl:2: ignoring a half-written last line" in caplog.text
    append_jsonl(path, [trial(2)])
    assert [t.task_id for t in load_trials(path)] == ["t0", "t2"]
    assert path.read_text().count("\n") == 2


@pytest.mark.parametrize("lines, line, what", [
    ([json.dumps(trial(0)) + "\n", '{"trial_id": "m::t1", "mo\n', json.dumps(trial(2)) + "\n"], 2, "not valid JSON"),
    ([json.dumps(trial(0)) + "\n", "\n", "[1, 2]\n", json.dumps(trial(2)) + "\n"], 3, "not a JSON object"),
    # a damaged line that ends in a newline was written whole: not an interrupted write, even when it is the last
    ([json.dumps(trial(0)) + "\n", '{"trial_id": \n'], 2, "not valid JSON"),
])
def test_any_other_bad_line_stops_the_reader_naming_file_and_line(tmp_path, lines, line, what):
    path = write_lines(tmp_path / "trials.jsonl", lines)
    for read in (lambda: list(read_jsonl(path)), lambda: load_trials(path)):
        with pytest.raises(RecordError, match=rf"^{path}:{line}: {what}") as err:
            read()
        assert isinstance(err.value, ProbeError) and "restore the file" in str(err.value)


def test_a_line_that_is_not_a_trial_names_the_missing_fields(tmp_path):
    bad = {k: v for k, v in trial(1).items() if k not in ("em", "model")}
    path = write_lines(tmp_path / "trials.jsonl", [json.dumps(trial(0)) + "\n", json.dumps(bad) + "\n"])
    with pytest.raises(RecordError, match=rf"{path}:2: not a trial record \(missing model, em\)"):
        load_trials(path)


def test_prompt_records_read_back_and_a_bad_one_is_named(tmp_path):
    text = "Velt is a town.\n\nQuestion: Where?"
    prompt = Prompt("a/b|Control|L0|r0", "a/b", "jsonl", "Control", 0, 0.0, 0, text,
                    (Segment("germane", 0, 15), Segment("question", 17, len(text))))
    path = tmp_path / "prompts.jsonl"
    assert write_jsonl(path, [prompt.to_dict()]) == 1 and not list(tmp_path.glob("*.tmp"))
    assert load_prompts(path) == [prompt]
    broken = {**prompt.to_dict(), "segments": [{"kind": "germane", "char_start": 5, "char_end": 99}]}
    append_jsonl(path, [broken, {k: v for k, v in prompt.to_dict().items() if k != "text"}])
    with pytest.raises(RecordError, match=rf"{path}:2: not a prompt record \(prompt .*ends past the text"):
        load_prompts(path)


def test_line_numbers_count_blank_lines(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", ["\n", json.dumps({"a": 1}) + "\n", "\n", json.dumps({"a": 2}) + "\n"])
    assert list(iter_jsonl(path)) == [(2, {"a": 1}), (4, {"a": 2})]
    assert list(iter_jsonl(tmp_path / "absent.jsonl")) == []


def test_a_last_line_cut_inside_a_character_is_half_written_and_a_bad_byte_elsewhere_is_named(tmp_path, caplog):
    whole = json.dumps(trial(1, output="Zürich"), ensure_ascii=False).encode("utf-8")
    cut = whole[: whole.index("ü".encode("utf-8")) + 1]  # the crash came between the two bytes of "ü"
    path = tmp_path / "trials.jsonl"
    path.write_bytes((json.dumps(trial(0)) + "\n").encode("utf-8") + cut)
    with caplog.at_level(logging.WARNING):
        assert [t.task_id for t in load_trials(path)] == ["t0"]
    assert "trials.jsonl:2: ignoring a half-written last line" in caplog.text
    append_jsonl(path, [trial(2)])
    assert [t.task_id for t in load_trials(path)] == ["t0", "t2"]
    path.write_bytes(whole.replace("ü".encode("utf-8"), b"\xfc") + b"\n" + (json.dumps(trial(3)) + "\n").encode())
    with pytest.raises(RecordError, match=r"trials.jsonl:1: not UTF-8 text \(byte 0xfc at column \d+\)"):
        load_trials(path)
