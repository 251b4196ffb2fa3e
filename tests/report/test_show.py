"""``probe show``: attention per token (checked against eager attention) and the page that draws it."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import probe
from probe.cli import main
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError, ProbeError
from tests.fixtures.experiment import tiny_experiment

pytestmark = pytest.mark.integration


def _eager_token_mass(model, tp, query: str) -> np.ndarray:
    """(layer, head, T) mean over the query rows of eager ``output_attentions``, computed directly."""
    import torch

    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(torch.tensor([list(tp.input_ids)]), output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    n = len(tp.input_ids)
    if query == "last":
        rows = [n - 1]
    else:
        rows = sorted({t for s in tp.spans if s.kind == "question" for t in range(s.start, s.end)} | {n - 1})
    return np.stack([a[0, :, rows, :].double().mean(dim=1).numpy() for a in out.attentions])


@pytest.fixture(scope="module")
def tiny_lm(tiny_card: Path):
    return probe.load_model(str(tiny_card), device="cpu")


@pytest.mark.parametrize("query", ["question", "last"])
def test_attention_per_token_equals_eager_attention_and_sums_to_the_segment_masses(tiny_lm, query: str) -> None:
    from probe.attention.tokens import token_attention
    from probe.prompt_view import segment_sums

    task = probe.load_tasks("synthetic", n=1, seed=3)[0]
    tp = tiny_lm.tokenize(tiny_lm.build_prompt(task, "Saturation", load=50))
    opts = ProbeOptions(query=query)
    per_token = token_attention(tiny_lm.model, tp, opts)
    assert per_token.seg_mass_segment.shape == (2, 4, len(tp.input_ids))
    np.testing.assert_allclose(per_token.seg_mass_segment, _eager_token_mass(tiny_lm.model, tp, query), atol=1e-5)
    ordinary = tiny_lm.probe(tp, opts)
    np.testing.assert_allclose(segment_sums(per_token.seg_mass_segment, tp), ordinary.seg_mass_segment, atol=1e-5)
    np.testing.assert_allclose(per_token.p_ext, ordinary.p_ext, atol=1e-6)
    np.testing.assert_array_equal(per_token.chance, ordinary.chance)


def test_attention_per_token_refuses_a_query_set_it_cannot_split(tiny_lm) -> None:
    from probe.attention.tokens import token_attention

    task = probe.load_tasks("synthetic", n=1)[0]
    tp = tiny_lm.tokenize(tiny_lm.build_prompt(task, "Control"))
    with pytest.raises(ConfigError, match="'segment:2'"):
        token_attention(tiny_lm.model, tp, ProbeOptions(query="segment:2"))


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory, tiny_card: Path):
    out = tmp_path_factory.mktemp("show-run")
    return probe.run({
        "experiment": {"name": "show", "seed": 2, "models": [str(tiny_card)], "output_dir": str(out)},
        "tasks": [{"source": "synthetic", "n": 1, "hops": 2}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 3, "batch_size": 2},
        "probe": {"enabled": True},
        "analysis": {"embedder": ""},
    }, progress=False)


def _titles(page: str) -> list[tuple[int, float]]:
    """(token index, mass) of every shaded token of a page, from the tokens' hover titles."""
    return [(int(t), float(m)) for t, m in re.findall(r'title="token (\d+) · .*? · mass ([0-9.e-]+)', page)]


def test_show_page_shades_every_token_by_its_mass_and_lists_the_recorded_segment_masses(probed_run, tiny_lm) -> None:
    from probe.prompt_view import view_prompt

    pid = next(p for p, pr in probed_run.prompts.items() if pr.condition == "Saturation")
    path = probe.show(probed_run, pid, layer=1, head=2, model=tiny_lm)
    assert path == probed_run.folder.show_page("tiny-llama", pid, 1, 2) and path.is_file()
    page = path.read_text(encoding="utf-8")
    view = view_prompt(probed_run, pid, model=tiny_lm)
    mass = view.token_mass(1, 2)
    titles = _titles(page)
    assert [t for t, _ in titles] == list(range(len(view.tokenized.input_ids)))
    np.testing.assert_allclose([m for _, m in titles], mass, atol=1e-5)
    # the run's record is used for the segment masses, and the recomputation agrees with it
    assert view.record is not None and "from the run's record" in view.record_note
    record = probed_run.attention(pid)
    for i, span in enumerate(view.tokenized.spans):
        if span.kind != "sink":
            assert f'id="seg-{i}"' in page
            assert f"mass {record.seg_mass_segment[1, 2, i]:.4f}" in page
    assert "layer 1, head 2" in page
    assert "<script" not in page.lower() and "src=" not in page  # self-contained, no scripts
    # default selection: the mean over layers and heads
    mean_page = probe.show(probed_run, pid, model=tiny_lm).read_text(encoding="utf-8")
    np.testing.assert_allclose([m for _, m in _titles(mean_page)],
                               view.per_token.seg_mass_segment.mean(axis=(0, 1)), atol=1e-5)
    assert "mean over 2 layers, mean over 4 heads" in mean_page
    with pytest.raises(ProbeError, match="layer 2: tiny-llama has layers 0..1"):
        probe.show(probed_run, pid, layer=2, model=tiny_lm)
    with pytest.raises(ProbeError, match="head 4: tiny-llama has heads 0..3"):
        probe.show(probed_run, pid, head=4, model=tiny_lm)


def test_a_record_that_disagrees_with_the_recomputation_is_flagged(probed_run, tiny_lm) -> None:
    from probe.attention.result import SegmentAttention
    from probe.prompt_view import view_prompt

    pid = next(p for p, pr in probed_run.prompts.items() if pr.condition == "Saturation")
    path = probed_run.attention_path(pid)
    original = path.read_bytes()
    index = probed_run.path / "attention_index.jsonl"  # a run written before records were indexed: no hash check,
    listed = index.read_bytes()  # so the recomputation is what catches the record
    try:
        rec = SegmentAttention.load(path)
        rec.measures["seg_mass_segment"] = rec.seg_mass_segment * 0.5
        rec.save(path)
        index.unlink()
        view = view_prompt(probed_run, pid, model=tiny_lm)
        assert "differs from it by up to" in view.record_note
        page = probe.show(probed_run, pid, model=tiny_lm).read_text(encoding="utf-8")
        assert 'class="meta note warn"' in page
    finally:
        path.write_bytes(original)
        index.write_bytes(listed)


def test_show_cli_writes_the_page_and_reports_errors(probed_run, capsys) -> None:
    pid = next(iter(probed_run.prompts))
    out = probed_run.path / "page.html"
    assert main(["show", str(probed_run.path), pid, "--layer", "0", "--head", "1", "--out", str(out)]) == 0
    assert f"page: {out}" in capsys.readouterr().out and out.is_file()
    assert main(["show", str(probed_run.path), pid + "x"]) == 2
    assert "holds no prompt" in capsys.readouterr().err


def test_show_escapes_all_text_and_recomputes_without_a_record(tmp_path: Path, tiny_card: Path, tiny_lm) -> None:
    nasty = '<script>alert("x")</script> & <b>bold</b>'
    line = {"task_id": "t<i>&1", "question": f"Which {nasty}?", "gold": "Q&A",
            "hops": [{"fact": f"The fact {nasty} holds.", "answer": None}],
            "segments": [["germane", f"The fact {nasty} holds."], ["extraneous", "Noise <img src=x> here."]]}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(line) + "\n")
    run = probe.run({
        "experiment": {"name": "esc", "models": [str(tiny_card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "jsonl", "path": str(tmp_path / "tasks.jsonl"), "n": 1}],
        "generation": {"max_new_tokens": 2},
        "analysis": {"embedder": ""},
    }, progress=False)
    pid = next(iter(run.prompts))
    page = probe.show(run, pid, model=tiny_lm).read_text(encoding="utf-8")
    assert "<script" not in page and "<b>bold" not in page and "<img" not in page
    text = re.sub(r"</?span[^>]*>", "", page)  # the tokens' own markup taken out, the escaped text stays
    assert html.escape(nasty) in text and html.escape("Noise <img src=x> here.") in text
    assert html.escape("t<i>&1") in page
    assert "no attention record in the run" in page  # probing was off: masses are recomputed
    assert "Q&amp;A" in page


def test_show_answer_steps_through_the_generated_tokens(tmp_path, tiny_card, capsys):
    """``probe show --answer`` on a run probed with ``answer = true``: one step per generated token, each holding
    that token's attention over the prompt's segments as the record stores it; without the capture it says why."""
    from probe.attention.result import SegmentAttention
    from probe.runfolder import RunFolder

    exp = tiny_experiment(tmp_path / "a.toml", [tiny_card], experiment={"name": "steps"},
                          tasks=[{"source": "synthetic", "n": 1, "hops": 2}],
                          ice={"conditions": ["Control"], "loads": None, "replications": None},
                          generation={"max_new_tokens": 6}, probe={"enabled": True, "answer": True})
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "steps")
    prompt_id = json.loads(run.prompts.read_text().splitlines()[0])["prompt_id"]
    capsys.readouterr()
    assert main(["show", str(run.root), prompt_id, "--answer"]) == 0
    page = Path(capsys.readouterr().out.split("page: ")[1].strip())
    assert page.name.endswith(".answer.html") and page.is_file()
    answer = SegmentAttention.load(run.attention_record("tiny-llama", prompt_id)).answer
    assert answer is not None and len(answer.tokens) > 0
    text = page.read_text()
    assert text.count('class="step"') == len(answer.tokens) or text.count("<details") >= len(answer.tokens)
    for flag, value, what in (("--layer", "99", "layer 99: tiny-llama has layers 0..1"),
                              ("--head", "50", "head 50: tiny-llama has heads 0..3")):  # refused, no traceback
        assert main(["show", str(run.root), prompt_id, "--answer", flag, value]) == 2
        err = capsys.readouterr().err
        assert what in err and "Traceback" not in err

    # a folder from elsewhere with show/ linked out of it: refused, naming the link, and nothing outside changes
    from tests.security.tree import tree_digest

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    shutil.rmtree(run.root / "show")
    (run.root / "show").symlink_to(outside)
    before = tree_digest(outside)
    assert main(["show", str(run.root), prompt_id, "--answer"]) == 2
    assert "is a link" in capsys.readouterr().err and tree_digest(outside) == before

    exp.write_text(exp.read_text().replace("answer = true", "answer = false").replace('"steps"', '"plain"'))
    assert main(["run", str(exp), "-q"]) == 0
    capsys.readouterr()
    assert main(["show", str(tmp_path / "outputs" / "plain"), prompt_id, "--answer"]) == 2
    assert "answer = true" in capsys.readouterr().err
