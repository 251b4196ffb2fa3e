"""The TransformerLens path on the architectures the conformance suite verifies: a ``TransformerBridge`` booted
offline over the suite's tiny model of each type, probed through its ``hook_pattern`` hooks, held to the model's
own eager attention (:func:`probe.attention.reference_segment_attention`, computed before the bridge replaces the
attention modules) at 1e-5 on every registered measure. A hybrid model's state-space layers are NaN, as the engine
reports them; a bridge that exposes no pattern hook for a layer with attention is refused, naming the hook.

docs/probes.md lists the types this module tests (:data:`LENS_TYPES`); a test fails when the two disagree."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from probe.attention import probe_transformer_lens, reference_segment_attention
from probe.errors import HookError
from probe.probe_options import ProbeOptions
from tests.attention.conformance.checks import TOL, prompt
from tests.attention.conformance.models import VOCAB, build

ROOT = Path(__file__).resolve().parents[3]
# The purpose's named types that TransformerLens 4's bridge has an adapter for (DeepSeek-V2/V3's adapter fails on
# the suite's tiny MLA config inside TransformerLens; Nemotron-H's and Zamba2's expose no pattern hook: below).
LENS_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "phi3", "mixtral",
              "qwen2_moe", "qwen3_moe", "gpt_oss", "olmo2", "olmo3", "granite", "smollm3", "cohere2", "glm4",
              "starcoder2", "stablelm", "falcon", "opt", "gptj", "llama4_text", "jamba", "bamba", "falcon_h1",
              "qwen3_next")


def _bridge(model_type: str):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast

    model = build(model_type)
    model.config.architectures = [type(model).__name__]  # how the bridge picks its adapter
    vocab = {f"t{i}": i for i in range(VOCAB)}
    # a fresh tokenizer per bridge (booting edits it), without a BOS token (the bridge would fetch one by name)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0",
                                  pad_token="t1", eos_token="t2")
    tp = prompt()
    options = ProbeOptions(residue=True)
    reference = reference_segment_attention(model, tp, options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bridge's own deprecation notes
        bridge = TransformerBridge.boot_transformers(f"tiny-{model_type}", hf_model=model, tokenizer=tok,
                                                     device="cpu")
    return bridge, tp, options, reference


@pytest.mark.parametrize("model_type", LENS_TYPES)
def test_the_lens_path_is_held_to_eager(model_type: str) -> None:
    bridge, tp, options, reference = _bridge(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lens = probe_transformer_lens(bridge, tp, options)
    assert set(lens.measures) == set(reference.measures)
    for name, want in reference.measures.items():
        np.testing.assert_allclose(lens.measures[name], want, atol=TOL, rtol=0, equal_nan=True, err_msg=name)
        assert np.isfinite(want).any(), name  # the comparison held real numbers


@pytest.mark.parametrize("model_type", ["zamba2", "nemotron_h"])
def test_a_bridge_without_the_pattern_hook_is_refused_by_name(model_type: str) -> None:
    bridge, tp, options, _ = _bridge(model_type)
    with pytest.raises(HookError, match=r"no hook blocks\.\d+\.attn\.hook_pattern .*probe the Hugging Face model "
                                        r"with the engine"):
        probe_transformer_lens(bridge, tp, options)


def test_docs_list_the_types_the_lens_path_is_tested_on() -> None:
    text = (ROOT / "docs" / "probes.md").read_text(encoding="utf-8")
    listed = re.search(r"Tested on these model types \(tests/attention/conformance/test_lens\.py\): ([^.]+)\.", text)
    assert listed is not None, "docs/probes.md: the TransformerLens section lists no types"
    assert tuple(t.strip(" `\n") for t in listed.group(1).split(",")) == LENS_TYPES
