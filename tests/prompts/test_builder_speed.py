"""The fast prompt builder against the original one: byte-identical prompts.jsonl (golden hashes computed with the
builder that tokenized every candidate whole), and each shortcut against its plain reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from probe.config import load_config
from probe.errors import SpanError
from probe.prompts.builder import Piece, assemble
from probe.prompts.tokenize import PieceCounter, chat_frame, encode_prompt, encode_prompt_reference
from probe.records import read_jsonl
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts
from probe.types import Prompt, Segment

FIXTURES = Path(__file__).parent.parent / "fixtures" / "builder"
GOLDEN = json.loads((FIXTURES / "golden.json").read_text())


@pytest.fixture(scope="module")
def tokenizers():
    from probe.loading import get_card, load_tokenizer

    return {n: load_tokenizer(get_card(n)) for n in ("smollm2-135m-instruct", "gemma-3-270m")}


def _build(design: str, tmp_path: Path) -> Path:
    cfg = load_config(FIXTURES / f"{design}.toml", overrides={"experiment": {"output_dir": str(tmp_path)}})
    prepare_run_dir(cfg)
    build_run_prompts(cfg, progress=False)
    return cfg.run_dir / "prompts.jsonl"


@pytest.mark.integration
@pytest.mark.parametrize("design", [pytest.param("ice-small", marks=pytest.mark.slow), "ice-3hop", "cogniload-small"])
def test_prompts_are_byte_identical_to_the_original_builder(design: str, tmp_path: Path) -> None:
    path = _build(design, tmp_path)
    assert sum(1 for _ in read_jsonl(path)) == GOLDEN["n_prompts"][design]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["sha256"][design]


def _hash_without_s_sim(path: Path) -> str:
    rows = []
    for d in read_jsonl(path):
        assert d["s_sim"] is None or -1.0 <= d["s_sim"] <= 1.0
        rows.append(json.dumps({k: v for k, v in d.items() if k != "s_sim"}, sort_keys=True))
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


@pytest.mark.integration
def test_stratified_prompts_are_unchanged(tmp_path: Path) -> None:
    """The stratified strategy's prompts (pool, sample, tercile, sentences) as first built from the shared pool;
    S_sim values are left out of the hash (the embedder's float arithmetic may differ in the last bits across
    CPUs) and checked for range."""
    path = _build("ice-stratified", tmp_path)
    assert sum(1 for _ in read_jsonl(path)) == GOLDEN["n_prompts"]["ice-stratified"]
    assert _hash_without_s_sim(path) == GOLDEN["sha256_without_s_sim"]["ice-stratified"]


@pytest.mark.integration
def test_fast_tokenization_equals_the_reference(tokenizers, tmp_path: Path) -> None:
    """Vectorised token ownership = the per-token loop, on ICE and CogniLoad prompts, with and without a chat
    template, in two tokenizers."""
    prompts = [Prompt.from_dict(d) for d in read_jsonl(_build("ice-3hop", tmp_path))][::2]
    prompts += [Prompt.from_dict(d) for d in read_jsonl(_build("cogniload-small", tmp_path))][::4]
    for p in prompts:
        for tok, use_template in ((tokenizers["smollm2-135m-instruct"], True), (tokenizers["gemma-3-270m"], False)):
            assert encode_prompt(p, tok, use_template) == encode_prompt_reference(p, tok, use_template)


@pytest.mark.integration
@pytest.mark.parametrize("cut", [2, 0])
def test_fast_tokenization_refuses_what_the_reference_refuses(tokenizers, cut: int) -> None:
    tok = tokenizers["smollm2-135m-instruct"]
    text, segs = assemble("Read.", [Piece("germane", "Alpha beta.", "hop0")], "Why?")
    if cut:  # split "Alpha": one token's characters belong to two segments
        at = segs[1].char_start + cut
        bad = segs[:1] + (Segment("germane", segs[1].char_start, at, "a"), Segment("extraneous", at, segs[1].char_end,
                                                                                  "b"))
        want = "spans more than one segment"
    else:  # leave "Alpha beta." out of every segment
        bad = segs[:1] + segs[2:]
        want = "lies between segments"
    p = Prompt("x", "t", "synthetic", "Saturation", 50, 0.0, 0, text, bad + segs[2:] if cut else bad)
    for fn in (encode_prompt, encode_prompt_reference):
        with pytest.raises(SpanError, match=want):
            fn(p, tok)


@pytest.mark.integration
def test_piece_counts_add_up_to_the_whole_prompt(tokenizers, tmp_path: Path) -> None:
    """Where the counter vouches for pieces, every segment of a built prompt has the count of its text alone."""
    smol, gemma = PieceCounter(tokenizers["smollm2-135m-instruct"]), PieceCounter(tokenizers["gemma-3-270m"])
    assert smol.is_separable and not gemma.is_separable  # Gemma's BPE merges across newlines
    assert not smol.countable(" leading space") and not smol.countable("<|im_end|> inside")
    prompts = [Prompt.from_dict(d) for d in read_jsonl(_build("ice-3hop", tmp_path))]
    checked = 0
    for p in prompts:
        tp = encode_prompt(p, tokenizers["smollm2-135m-instruct"])
        spans = [s for s in tp.spans if s.kind != "sink"]
        for seg, span in zip(p.segments, spans):
            text = p.segment_text(seg)
            if smol.countable(text):
                assert span.n_tokens == smol.count(text), (p.prompt_id, text)
                checked += 1
    assert checked > 1000


class _Template:
    """A stand-in tokenizer whose chat template renders the user text through ``fn``."""

    chat_template = "stand-in"

    def __init__(self, fn):
        self.fn = fn

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "<s>[user]" + self.fn(messages[0]["content"]) + "[/user][assistant]"


def test_chat_frame_only_for_templates_that_copy_the_message() -> None:
    assert chat_frame(_Template(lambda t: t)) == ("<s>[user]", "[/user][assistant]")
    assert chat_frame(_Template(str.strip)) is None
    assert chat_frame(_Template(lambda t: t.replace("\\", "\\\\"))) is None
