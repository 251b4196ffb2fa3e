"""Models that do not fit one device: layers dispatched by accelerate (``device_map``) probe and generate exactly as
the same weights on one device.

The tiny random Llama of ``conftest.tiny_card`` (its query and key projections scaled up, so that attention is
peaked rather than nearly uniform) is loaded once plainly and three more times through the loader's
``device_map`` / ``max_memory`` / ``offload_folder`` card fields: two hand-written layouts that keep some modules on
the CPU and offload others to disk (their weights live on the ``meta`` device and accelerate's hooks load them at
each forward; one layout offloads the input embedding itself), and ``device_map = "auto"`` with a CPU memory cap
that forces the model to disk. Every probe array must equal the plain model's to 1e-5 and greedy generation must
give the same tokens. A copy of the plain model with one attention weight changed
shows that the comparison would see a layer computed from the wrong weights.
"""

from __future__ import annotations

import copy
import json
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from probe.attention import SegmentAttention, probe_tokenized
from probe.config import GenerationSection
from probe.probe_options import ProbeOptions
from probe.prompts.tokenize import encode_prompt
from probe.compat import input_device
from probe.loading import LoadedModel, ModelCard, get_card, load_model
from probe.backends import LocalBackend
from probe.types import Prompt, Segment

pytestmark = pytest.mark.integration

ATOL = 1e-5
SHARPEN = 30.0
PIECES = (
    ("instruction", "Answer the question. Think step by step, then give the final answer in \\boxed{}."),
    ("extraneous", "The recipe calls for two cups of flour, a pinch of salt and warm water left to rest."),
    ("germane", "Marta Ilves was born in the town of Kessel."),
    ("extraneous", "In 1887 the observatory installed a refracting telescope whose lens was ground in Munich."),
    ("germane", "The town of Kessel lies on the river Oder."),
    ("extraneous", "The tournament was postponed twice because of heavy rain on the clay courts."),
    ("question", "Question: On which river lies the birthplace of Marta Ilves?"),
)
# Every module of the 2-layer model placed by hand: "disk" modules are offloaded and loaded by hooks per forward.
LAYOUTS = {
    "layer1-on-disk": {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                       "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"},
    "embedding-on-disk": {"model.embed_tokens": "disk", "model.layers.0": "disk", "model.layers.1": "cpu",
                          "model.norm": "disk", "model.rotary_emb": "cpu", "lm_head": "cpu"},
}


def make_prompt(pieces: tuple[tuple[str, str], ...], prompt_id: str) -> Prompt:
    """A prompt whose segments are ``pieces`` joined by blank lines (character offsets computed here)."""
    text, segments = "", []
    for i, (kind, piece) in enumerate(pieces):
        if text:
            text += "\n\n"
        segments.append(Segment(kind, len(text), len(text) + len(piece), label=f"{kind}{i}"))
        text += piece
    return Prompt(prompt_id=prompt_id, task_id=prompt_id, source="synthetic", condition="Saturation", load=50,
                  achieved_load=50.0, replication=0, text=text, segments=tuple(segments))


PROMPTS = [
    make_prompt(PIECES, "saturation"),
    make_prompt((PIECES[0], PIECES[1], PIECES[3], PIECES[5], PIECES[2], PIECES[4], PIECES[6]), "residue"),
]


@pytest.fixture(scope="module")
def sharp_card(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conftest model with its query and key projections scaled up (x SHARPEN each), saved as a new folder.

    At its initial scale a random model attends almost uniformly, and probe arrays of models with different
    weights would differ by little more than the tolerance; scaled, attention is peaked and layer-specific.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(get_card(str(tiny_card)).path or "")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
            layer.self_attn.k_proj.weight.mul_(SHARPEN)
    root = tmp_path_factory.mktemp("tiny-sharp")
    model.save_pretrained(root / "model")
    AutoTokenizer.from_pretrained(src).save_pretrained(root / "model")
    card = root / "tiny-sharp.toml"
    card.write_text(Path(tiny_card).read_text().replace(str(src), str(root / "model"))
                    .replace('name = "tiny-llama"', 'name = "tiny-sharp"'))
    return card


@pytest.fixture(scope="module")
def plain(sharp_card: Path) -> LoadedModel:
    return load_model(get_card(str(sharp_card)), device="cpu")


def dispatched_card(base: ModelCard, tmp: Path, layout: str) -> ModelCard:
    """``base`` with a layout that offloads part of the model to disk (``tmp/offload``)."""
    if layout == "auto-capped":
        # a CPU cap below what accelerate reserves (the largest module twice over: the embedding and the LM head
        # are 6 MB each, the layers tiny): it offloads the whole model ({"": "disk"}) and streams every module
        # from disk through one hook per forward, executing on the CPU
        cfg = json.loads((Path(base.path or "") / "config.json").read_text())
        emb_bytes = 4 * cfg["vocab_size"] * cfg["hidden_size"]
        return replace(base, name=f"tiny-{layout}", device_map="auto",
                       max_memory={"cpu": f"{emb_bytes * 1.05 / 1e3:.0f}KB"}, offload_folder=str(tmp / "offload"))
    return replace(base, name=f"tiny-{layout}", device_map=dict(LAYOUTS[layout]), offload_folder=str(tmp / "offload"))


def assert_same_probe(a: SegmentAttention, b: SegmentAttention, atol: float = ATOL) -> None:
    for f in fields(SegmentAttention):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "measures":  # every measure both hold: an offloaded layer leaves out the value-weighted ones
            assert {"seg_mass", "seg_mass_segment", "p_ext", "ar_k"} <= set(x) & set(y)
            for k in set(x) & set(y):
                np.testing.assert_allclose(y[k], x[k], rtol=0, atol=atol, err_msg=k)
        elif isinstance(x, np.ndarray):
            assert x.shape == y.shape, f.name
            np.testing.assert_allclose(y, x, rtol=0, atol=atol, err_msg=f.name)
        else:
            assert x == y, f.name


def max_difference(a: SegmentAttention, b: SegmentAttention) -> float:
    """Over every measure both hold (an offloaded model leaves out the value-weighted ones) and the chance level."""
    common = [k for k in a.measures if k in b.measures]
    assert {"seg_mass", "seg_mass_segment", "p_ext"} <= set(common)
    return max(float(np.nanmax(np.abs(x - y))) for x, y in
               [(a[k], b[k]) for k in common] + [(a.chance, b.chance)])


def offloaded_modules(model: torch.nn.Module) -> set[str]:
    """Top-level placed modules whose weights are not materialised (offloaded, loaded by hooks)."""
    return {name.rsplit(".", 1)[0] for name, p in model.named_parameters() if p.device.type == "meta"}


@pytest.mark.parametrize("layout", [*LAYOUTS, "auto-capped"])
def test_dispatched_model_probes_and_generates_like_one_device(plain, tmp_path, layout):
    card = dispatched_card(plain.card, tmp_path, layout)
    loaded = load_model(card)
    model = loaded.model
    placement = model.hf_device_map
    assert "disk" in placement.values(), placement  # the layout really offloads
    assert offloaded_modules(model), "offloaded weights must sit on the meta device"
    if layout == "embedding-on-disk":
        assert model.get_input_embeddings().weight.device.type == "meta"
    assert input_device(model) == torch.device("cpu")
    for name in offloaded_modules(model):  # each offloaded module's hook loads its weights at every forward
        hook = model.get_submodule(name)._hf_hook
        assert hook.offload and hook.weights_map is not None, name

    opts = ProbeOptions(query="question", gamma=0.5, block_size=16)
    for prompt in PROMPTS:
        tp = encode_prompt(prompt, plain.tokenizer)
        assert encode_prompt(prompt, loaded.tokenizer) == tp
        assert_same_probe(probe_tokenized(plain.model, tp, opts), probe_tokenized(model, tp, opts))
        # a probe over prompt + answer reads the answer's keys too
        answer = (tp.input_ids[5], tp.input_ids[9], tp.input_ids[2])
        gen_opts = ProbeOptions(query="generated", block_size=16)
        assert_same_probe(probe_tokenized(plain.model, tp, gen_opts, generated_ids=answer),
                          probe_tokenized(model, tp, gen_opts, generated_ids=answer))

    gen = GenerationSection(max_new_tokens=6, batch_size=2)
    ref = {p.prompt_id: g for p, g in LocalBackend(plain).generate(PROMPTS, gen)}
    out = {p.prompt_id: g for p, g in LocalBackend(loaded).generate(PROMPTS, gen)}
    for prompt in PROMPTS:
        assert out[prompt.prompt_id].output_ids == ref[prompt.prompt_id].output_ids
        assert out[prompt.prompt_id].text == ref[prompt.prompt_id].text
    # the probe riding on the dispatched model's batched prefill gives the one-device, one-prompt probe
    probed = {p.prompt_id: g for p, g in LocalBackend(loaded).generate(PROMPTS, gen, probe=opts)}
    for prompt in PROMPTS:
        assert probed[prompt.prompt_id].output_ids == ref[prompt.prompt_id].output_ids
        tp = encode_prompt(prompt, plain.tokenizer)
        assert_same_probe(probed[prompt.prompt_id].attention, probe_tokenized(plain.model, tp, opts))
    # and the same as plain transformers generate on one device, one prompt at a time
    for prompt in PROMPTS:
        ids = torch.tensor([encode_prompt(prompt, plain.tokenizer).input_ids])
        with torch.inference_mode():
            seq = plain.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                       do_sample=False, temperature=None, top_p=None, top_k=None)
        assert tuple(seq[0, ids.shape[1] :].tolist()) == ref[prompt.prompt_id].output_ids


def test_comparison_sees_a_layer_with_other_weights(plain):
    """The 1e-5 comparison is not vacuous: one changed key projection in layer 1 moves the probe arrays."""
    other = copy.deepcopy(plain.model)
    with torch.no_grad():
        other.model.layers[1].self_attn.k_proj.weight.mul_(1.5)
    opts = ProbeOptions(query="question", block_size=16)
    tp = encode_prompt(PROMPTS[0], plain.tokenizer)
    assert max_difference(probe_tokenized(plain.model, tp, opts), probe_tokenized(other, tp, opts)) > 100 * ATOL


def test_card_device_map_table_reaches_the_loader(sharp_card, tmp_path):
    """A card TOML with a ``device_map`` table and ``max_memory`` loads as written (what a 70B card uses)."""
    src = Path(sharp_card).read_text()
    card_path = tmp_path / "tiny-dispatched.toml"
    layout = ", ".join(f'"{k}" = "{v}"' for k, v in LAYOUTS["layer1-on-disk"].items())
    card_path.write_text(src.replace('name = "tiny-sharp"', 'name = "tiny-dispatched"')
                         + f'device_map = {{ {layout} }}\noffload_folder = "{tmp_path / "off"}"\n')
    card = get_card(str(card_path))
    assert card.device_map == LAYOUTS["layer1-on-disk"]
    loaded = load_model(card)
    assert loaded.model.hf_device_map == LAYOUTS["layer1-on-disk"]
