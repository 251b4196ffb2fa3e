"""Shared fixtures: a tiny random-weight Llama with the default model's tokenizer, as a model card on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_card(tmp_path_factory) -> Path:
    """A model card (TOML path) for a 2-layer random Llama that uses SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from probe.loading import get_card, load_tokenizer

    root = tmp_path_factory.mktemp("tiny-llama")
    tok = load_tokenizer(get_card("smollm2-135m-instruct"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    card = root / "tiny-llama.toml"
    card.write_text(
        'name = "tiny-llama"\nsource = "local"\n'
        f'path = "{root / "model"}"\ndtype = "float32"\ncontext_window = 4096\n'
    )
    return card
