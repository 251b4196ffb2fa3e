"""Tiny random-weight models of every causal-LM model type of the installed transformers, built from each type's own
config class: 2-4 layers (every layer kind the architecture mixes, one each at least), a hidden size of 64, 4 query
heads over 2 key/value heads where the config has both, a vocabulary of 128, 4 experts of which 2 are routed, MLA
with a value head width (12) unlike the query's (16), state-space widths of 8; float32, eval mode.

The shrinking is generic: every size a config names is capped by :data:`SIZES` (its own attribute names), a
per-layer pattern (``layer_types``, ``layers_block_type`` …) keeps one layer of each kind it holds, and a sub-config
(text, vision, audio) is shrunk the same way. :data:`PATCHES` holds what a few config classes need beyond that,
each with its reason.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

VOCAB = 128
SIZES: dict[str, Any] = {
    # widths
    "vocab_size": VOCAB, "hidden_size": 64, "n_embd": 64, "d_model": 64, "embed_dim": 64, "dim": 64,
    "intermediate_size": 96, "ffn_dim": 96, "n_inner": 96, "decoder_ffn_dim": 96, "encoder_ffn_dim": 96,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "num_key_value_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 16, "kv_channels": 16, "rotary_dim": 8, "max_position_embeddings": 512, "n_positions": 512,
    "n_ctx": 512, "sliding_window": 12, "attention_chunk_size": 12, "window_size": 12,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "moe_topk": 2, "top_k": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    # multi-head latent attention: a value head width unlike the query's
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12,
    # state-space and linear-attention layers
    "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_expand": 1,
    "mamba_d_conv": 4, "ssm_state_size": 8, "state_size": 8, "n_groups": 1, "mamba_headdim": 16,
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "time_step_rank": 8, "expand": 1, "conv_kernel": 4, "attention_head_dim": 16, "mamba_headdim": 16,
    "n_mamba_heads": 4,
    # vision / audio towers of composite models (never run: text only)
    "image_size": 32, "patch_size": 8, "num_channels": 3, "projection_dim": 64, "vision_feature_layer": -1,
    "initializer_range": 0.2,
}
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers")
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
               "cls_token_id", "mask_token_id", "unk_token_id")
# Sizes set even where the default config leaves them None (a default that builds no working model).
FILL_WHEN_NONE = ("num_experts_per_tok",)
MAX_LAYERS = 4
# What a config class needs beyond the generic shrinking (its own attribute names), and why.
PATCHES: dict[str, dict[str, Any]] = {
    # attention every `attn_layer_period` layers from `attn_layer_offset`: one attention and one Mamba layer
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "zamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # the default config lists no attention layer at all
    "bamba": {"attn_layer_indices": [1]},
    "zamba2": {"hybrid_layer_ids": [1]},
}


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal-LM class, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _pattern(values: list, n_layers: int) -> list:
    """A per-layer pattern of ``n_layers`` entries holding each kind of ``values`` (in order of first appearance)."""
    kinds = list(dict.fromkeys(str(v) if isinstance(v, (list, dict)) else v for v in values))
    lookup = {str(v) if isinstance(v, (list, dict)) else v: v for v in values}
    return [lookup[kinds[i % len(kinds)]] for i in range(n_layers)]


def shrink(config: PreTrainedConfig, keep_layers: bool = False) -> PreTrainedConfig:
    """A config of the same class with every size capped (module docstring); ``keep_layers`` keeps the depth and
    the per-layer patterns (the layers are those of the model the config describes). Only what changes is passed to
    the class, so every value it derives (head widths, layer patterns) is derived again."""
    d = config.to_dict()
    over: dict[str, Any] = {}
    for key, value in SIZES.items():
        if key not in d:
            continue
        if key == "initializer_range":
            over[key] = value
        elif isinstance(d[key], int) and not isinstance(d[key], bool):
            over[key] = min(d[key], value)
        elif d[key] is None and key in FILL_WHEN_NONE:
            over[key] = value
    if "qk_rope_head_dim" in d and "head_dim" in d:
        over["head_dim"] = over.get("qk_rope_head_dim", d["head_dim"])  # MLA: the rotary part's width
    if over.get("num_key_value_heads") and d.get("num_key_value_heads") == d.get("num_attention_heads"):
        over["num_key_value_heads"] = over.get("num_attention_heads", 4)  # keep MHA models MHA
    if "mamba_d_ssm" in d:  # the Mamba mixer's width: heads x head width
        over["mamba_d_ssm"] = over.get("mamba_n_heads", 4) * over.get("mamba_d_head", 16)
    depth_key = next((k for k in LAYER_COUNTS if isinstance(d.get(k), int)), None)
    depth = d.get(depth_key) if depth_key else None
    patterns = {k: v for k, v in d.items() if isinstance(v, list) and v and depth and len(v) == depth
                and all(isinstance(x, (str, int)) for x in v) and k not in ("architectures",)}
    if not keep_layers:
        kinds = max((len(set(map(str, v))) for v in patterns.values()), default=1)
        n_layers = max(2, min(MAX_LAYERS, kinds))
        for key in LAYER_COUNTS:
            if isinstance(d.get(key), int):
                over[key] = n_layers
        for key, values in patterns.items():
            over[key] = _pattern(values, n_layers)
        over.update(PATCHES.get(getattr(config, "model_type", ""), {}))
    vocab = over.get("vocab_size", d.get("vocab_size"))
    for i, key in enumerate(SPECIAL_IDS):
        value = d.get(key)
        if isinstance(value, int) and vocab is not None and value >= vocab:
            over[key] = i % 4
        elif isinstance(value, list) and vocab is not None:
            over[key] = [x if x < vocab else 2 for x in value]
    for key in d:  # sub-configs: text, vision, audio ...
        sub = getattr(config, key, None)
        if isinstance(sub, PreTrainedConfig) and key not in over:
            over[key] = shrink(sub, keep_layers).to_dict()
    return type(config)(**over)


def tiny_config(model_type: str) -> PreTrainedConfig:
    """The conformance suite's config of ``model_type`` (module docstring)."""
    return shrink(CONFIG_MAPPING[model_type]())


def build(model_type: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A tiny random-weight causal LM of ``model_type`` in eval mode, seeded by its name (the same in every process)."""
    config = tiny_config(model_type)
    torch.manual_seed(zlib.crc32(model_type.encode()) % 10_000)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


__all__ = ["SIZES", "VOCAB", "build", "causal_lm_types", "shrink", "tiny_config"]
