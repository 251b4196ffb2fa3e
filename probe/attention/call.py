"""One attention layer's call, as the engine's attention function receives it and hands it on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from probe.attention.edits import BatchEdit


@dataclass(frozen=True)
class LayerCall:
    """What one attention layer computed with, for the probe (:class:`probe.attention.capture.Capture`) and the
    answer capture (:class:`probe.attention.decode.AnswerRows`).

    Attributes:
        layer: the layer's index.
        query: (B, H, W, D) query states after rotary embedding (W = 1 in a decode step).
        key: (B, H_kv, K, D) key states (the cache's last K positions in a decode step).
        value: (B, H_kv, K, Dv) value states, or None where the layer gave none.
        mask: (B or 1, 1, W, K) bool (True = may attend) or additive float mask, or None (causal).
        scaling: multiplier of q·kᵀ.
        softcap: logit soft-capping value, or None.
        edit: the intervention acting on this batch (its bias is added to the scores of the layers it edits), or
            None.
        module: the layer's attention module (its output projection, for the value-weighted measures), or None.
        sinks: (H,) learned sink logits (gpt-oss's ``s_aux``): one more logit per head in each row's softmax that
            no key carries, so a row's weights on the keys sum to 1 minus the mass given to no key; or None.
    """

    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor | None
    mask: torch.Tensor | None
    scaling: float
    softcap: float | None = None
    edit: BatchEdit | None = None
    module: torch.nn.Module | None = None
    sinks: torch.Tensor | None = None


__all__ = ["LayerCall"]
