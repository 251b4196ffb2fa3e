"""On-paper memory of a probe at context length T, and the largest T that fits a device
(docs/performance.md#long-contexts-on-one-gpu)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a forward pass's memory.

    Attributes:
        n_params: parameter count.
        n_layers / n_heads / n_kv_heads / hidden / intermediate: the transformer's shape.
        dtype_bytes: bytes per element of weights and activations (2 for bfloat16).
    """

    n_params: float
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    intermediate: int
    dtype_bytes: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


    @staticmethod
    def from_config(config: object, dtype_bytes: int) -> "ModelShape":
        """The shape of a Hugging Face (text) config; ``n_params`` is left at 0 (the probe's budget ignores it).

        Args:
            config: a ``PretrainedConfig`` of a decoder (``get_text_config()`` of a multimodal one).
            dtype_bytes: bytes per element of the model's activations.
        """
        hidden = int(getattr(config, "hidden_size"))
        heads = int(getattr(config, "num_attention_heads"))
        kv = getattr(config, "num_key_value_heads", None) or heads
        inter = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
        return ModelShape(n_params=0.0, n_layers=int(getattr(config, "num_hidden_layers")), n_heads=heads,
                          n_kv_heads=int(kv), hidden=hidden, intermediate=int(inter), dtype_bytes=dtype_bytes)

    @property
    def activation_bytes_per_token(self) -> float:
        """Per-token activations of the widest layer (residual stream, q/k/v, the MLP's gate/up product)."""
        d_kv = self.n_kv_heads * self.head_dim
        return float((6 * self.hidden + 2 * (self.hidden + 2 * d_kv) + 3 * self.intermediate) * self.dtype_bytes)


# The probe's row blocks may hold this share of the forward pass's own activations (see ``block_elements``).
SCRATCH_FRACTION = 0.04
# ... and never fewer than this many rows x keys per head (tiny models would otherwise get one-row blocks).
MIN_BLOCK_ELEMENTS = 16 * 1024


def block_elements(shape: ModelShape, n_tokens: int, copies: int = 2) -> int:
    """Most ``rows x keys`` elements per head in one block of probe rows, chosen from the forward's memory.

    A block of B rows ending at position p holds ``copies`` float32 tensors of ``heads x B x (p + 1)`` (scores and
    their softmax). Keeping that within ``SCRATCH_FRACTION`` of the forward's activations over ``n_tokens`` tokens
    keeps the probe's peak within a few per cent of the plain forward's; B then shrinks as p grows, so early
    blocks are long and late ones short, at about the same size in bytes.

    Args:
        shape: the model's sizes.
        n_tokens: length T of the probed sequence.
        copies: float32 copies of a block held at once.

    Returns:
        The element budget per head (at least ``MIN_BLOCK_ELEMENTS``).
    """
    budget = SCRATCH_FRACTION * n_tokens * shape.activation_bytes_per_token
    return max(MIN_BLOCK_ELEMENTS, int(budget / (shape.n_heads * 4 * copies)))


LLAMA3_8B = ModelShape(n_params=8.03e9, n_layers=32, n_heads=32, n_kv_heads=8, hidden=4096, intermediate=14336)


def probe_memory_bytes(
    shape: ModelShape,
    n_tokens: int,
    method: Literal["engine", "output_attentions"] = "engine",
    block_size: int = 256,
    n_segments: int = 100,
    n_row_segments: int = 60,
) -> dict[str, float]:
    """Estimated peak device memory (bytes) of probing ``n_tokens`` tokens, by component.

    Args:
        shape: the model's sizes.
        n_tokens: context length T.
        method: ``engine`` or ``output_attentions``.
        block_size: query rows per block (engine).
        n_segments: segments of the prompt (engine's one-hot).
        n_row_segments: segments whose mean row is accumulated for the cosine residue (engine).

    Returns:
        Components in bytes and their ``total``.
    """
    b = shape.dtype_bytes
    t = float(n_tokens)
    d_kv = shape.n_kv_heads * shape.head_dim
    parts = {
        "weights": shape.n_params * b,
        "activations": t * shape.activation_bytes_per_token,
    }
    if method == "output_attentions":
        parts["attention_weights"] = shape.n_layers * shape.n_heads * t * t * b
        parts["softmax_in_flight"] = shape.n_heads * t * t * 4
    else:
        parts["keys_float32"] = t * d_kv * 4
        # rows per block: at most block_size, fewer where the block would exceed its share of the activations
        rows_budget = block_elements(shape, n_tokens) / max(t, 1.0)
        parts["row_block"] = 2 * shape.n_heads * min(block_size, n_tokens, rows_budget) * t * 4
        parts["segment_onehot"] = t * n_segments * 4
        parts["residue_rows"] = n_row_segments * shape.n_heads * t * 4
        parts["value_norms"] = t * (d_kv + shape.n_heads) * 4
    parts["total"] = sum(parts.values())
    return parts


def max_probe_context(
    shape: ModelShape,
    budget_bytes: float,
    method: Literal["engine", "output_attentions"] = "engine",
    **kwargs: int,
) -> int:
    """The largest T whose estimated peak memory fits ``budget_bytes`` (bisection on :func:`probe_memory_bytes`).

    Args:
        shape: the model's sizes.
        budget_bytes: device memory available.
        method: ``engine`` or ``output_attentions``.
        **kwargs: ``block_size``, ``n_segments``, ``n_row_segments`` for the engine.

    Returns:
        The largest context length in tokens (0 if even the weights do not fit).
    """
    lo, hi = 0, 1
    while probe_memory_bytes(shape, hi, method, **kwargs)["total"] <= budget_bytes:
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe_memory_bytes(shape, mid, method, **kwargs)["total"] <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo
