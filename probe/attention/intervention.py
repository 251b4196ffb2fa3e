"""Run a model under an attention intervention: the notebook's entry point (docs/interventions.md#in-a-notebook)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from probe.attention.edits import BatchEdit, row_edit
from probe.attention.engine import left_pad, transformers_model
from probe.attention.implementation import attach_edit, layers_and_heads
from probe.errors import ConfigError
from probe.interventions import Intervention, RowEdit
from probe.compat import input_device
from probe.types import TokenizedPrompt

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class EditedBatch:
    """A left-padded batch ready for ``model(...)`` / ``model.generate(...)`` under an intervention.

    Attributes:
        input_ids: (B, W) int64 ids on the model's input device.
        attention_mask: (B, W) int64 (1 = token).
        pads: left padding of each row.
        rows: the per-prompt edits.
        edit: the :class:`BatchEdit` the attention applies.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pads: list[int]
    rows: list[RowEdit]
    edit: BatchEdit = field(repr=False)


@contextmanager
def apply_intervention(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    spec: Intervention,
    *,
    row_edits: Sequence[RowEdit] | None = None,
    seed: int = 0,
    prompt_ids: Sequence[str] | None = None,
    pad_id: int = 0,
) -> Iterator[EditedBatch]:
    """Run ``model`` under an intervention on a batch of prompts (a notebook's entry point).

    Inside the block, call ``model(batch.input_ids, attention_mask=batch.attention_mask)`` or
    ``model.generate(batch.input_ids, attention_mask=batch.attention_mask, ...)`` with the yielded batch (the prompts
    left-padded in the order given); every layer of ``spec.layers`` (heads ``spec.heads``) attends with the edit.
    The model's attention implementation is restored afterwards, whatever happened.

    Args:
        model: a loaded Hugging Face causal LM of an architecture the probe supports, in eval mode (or a
            ``probe.load_model`` model, whose transformers model is used).
        prompts: the prompts' ids and token spans.
        spec: kind, α, keys, queries, layers, heads.
        row_edits: per prompt, an explicit :class:`RowEdit` (any key mask and first query) instead of the keys and
            queries ``spec`` derives from the spans.
        seed / prompt_ids: seed ``matched-random`` keys (default ids: the prompts' indices).
        pad_id: the id written into padding positions.

    Yields:
        The :class:`EditedBatch`.

    Raises:
        HookError: an unsupported architecture. ConfigError: a layer or head outside the model, mismatched edits.
        SpanError: queries ``answer`` on a prompt without a question.
    """
    model = transformers_model(model)
    if not prompts:
        raise ConfigError("intervention: no prompts")
    if row_edits is None:
        ids = list(prompt_ids) if prompt_ids is not None else [str(i) for i in range(len(prompts))]
        rows = [row_edit(tp, spec, seed, pid) for tp, pid in zip(prompts, ids)]
    else:
        rows = list(row_edits)
    if len(rows) != len(prompts):
        raise ConfigError(f"intervention: {len(prompts)} prompts but {len(rows)} row edits")
    input_ids, mask, pads = left_pad([tp.input_ids for tp in prompts], pad_id)
    n_layers, n_heads = layers_and_heads(model)
    device = input_device(model)
    edit = BatchEdit(rows, pads, spec, n_layers, n_heads, device, lengths=[len(tp.input_ids) for tp in prompts])
    batch = EditedBatch(input_ids.to(device), mask.to(device), pads, rows, edit)
    with attach_edit(model, edit):
        yield batch


__all__ = ["EditedBatch", "apply_intervention"]
