"""The run folder's names: prompt ids round-trip any task id, and file stems are safe, bounded and distinct."""

from __future__ import annotations

import pytest

from probe.runfolder import (MAX_STEM, PromptIdError, PromptKey, RunFolder, make_prompt_id, parse_prompt_id,
                             record_stem, stem_name)

AWKWARD_IDS = [
    "syn2-0007", "a/b c:d", "a|b", "100%", "%7C", "a~b", "..", ".hidden", "Zürich-Ω-東京", "x" * 200,
    "ü" * 200, "tab\tand\nnewline", "back\\slash", "L5", "r1|L2", "@tok",
]


@pytest.mark.parametrize("task_id", AWKWARD_IDS)
@pytest.mark.parametrize("tokenizer", [None, "smollm2-135m-instruct", "org/model|x"])
def test_prompt_ids_round_trip_any_task_id(task_id: str, tokenizer: str | None) -> None:
    key = PromptKey(task_id, "Saturation", 50, 1, tokenizer)
    assert parse_prompt_id(key.prompt_id) == key
    assert make_prompt_id(task_id, "Saturation", 50, 1, tokenizer) == key.prompt_id


def test_ordinary_ids_stay_readable() -> None:
    assert make_prompt_id("syn2-0007", "Residue", 80, 0) == "syn2-0007|Residue|L80|r0"
    assert record_stem("syn2-0007|Residue|L80|r0") == "syn2-0007~Residue~L80~r0"


@pytest.mark.parametrize("bad", ["", "a|b|c", "a|Control|50|r0", "a|Control|L5|0", "|Control|L0|r0",
                                 "a|Control|L0|r0|tok"])
def test_strings_outside_the_grammar_are_refused(bad: str) -> None:
    with pytest.raises(PromptIdError, match="is not a prompt id"):
        parse_prompt_id(bad)


def test_file_stems_are_safe_bounded_and_distinct() -> None:
    ids = {make_prompt_id(t, c, ld, r) for t in AWKWARD_IDS for c in ("Control", "Residue") for ld in (0, 50)
           for r in (0, 1)}
    stems = {record_stem(i) for i in ids}
    assert len(stems) == len(ids)
    for s in stems:
        assert len(s.encode()) <= MAX_STEM and "/" not in s and "\\" not in s and not s.startswith(".")
        assert s.isascii() and s.isprintable()


def test_short_stems_read_back_as_their_ids() -> None:
    for task_id in AWKWARD_IDS[:10]:
        pid = make_prompt_id(task_id, "Control", 0, 0)
        stem = record_stem(pid)
        if len(stem.encode()) < MAX_STEM:
            assert stem_name(stem) == pid


def test_run_folder_paths(tmp_path) -> None:
    run = RunFolder(tmp_path / "demo")
    assert run.trials.name == "trials.jsonl" and run.prompts.name == "prompts.jsonl"
    assert run.attention_record("m/x", "a/b|Control|L0|r0").relative_to(run.root).parts == (
        "attention", "m%2Fx", "a%2Fb~Control~L0~r0.npz")
    run.root.mkdir()
    assert not run.has_attention()


@pytest.mark.parametrize("kind", ["folder", "dangling link"])
def test_a_lock_path_that_is_not_a_file_is_named(tmp_path, kind):
    """``run.lock`` as a folder or a link to nowhere: refused with what it is and what to do (were an
    IsADirectoryError / FileNotFoundError traceback)."""
    from probe.errors import ProbeError
    from probe.runfolder import RunLock

    run = RunFolder(tmp_path / "r")
    run.root.mkdir()
    if kind == "folder":
        run.lock.mkdir()
    else:
        run.lock.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ProbeError, match=r"run\.lock: is a (folder|link), where the run's lock file belongs.*remove"):
        RunLock(run).acquire()


def test_trial_files_an_earlier_data_parallel_run_left_are_named_not_ignored(tmp_path):
    """Data-parallel processes write shard folders now; a ``trials.rank<r>.jsonl`` left by an earlier version's run
    is refused with what to do, so its trials are neither run again silently nor lost."""
    from probe.records import RecordError, check_records

    run = RunFolder(tmp_path / "dp")
    run.root.mkdir()
    check_records(run)
    (run.root / "trials.rank1.jsonl").write_text("")
    with pytest.raises(RecordError, match=r"trials.rank1.jsonl: a trial file .* append each such file to"):
        check_records(run)
