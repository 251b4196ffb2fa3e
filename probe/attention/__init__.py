"""The attention probe engine: how each layer and head distributes attention over a prompt's segments (docs/probes.md).

Public API:

- :func:`probe_tokenized` — probe one tokenized prompt with a Hugging Face model at the speed and memory of its fast
  attention (no L × H × T² tensor); returns a :class:`SegmentAttention` (segment masses by kind and per segment,
  P_ext with chance level and enrichment, sink mass, AR_k).
- :func:`probe_batch` — several prompts in one left-padded forward pass, each result equal to ``probe_tokenized``'s.
- :func:`probe_generation` — a context manager under which ``model.generate`` probes its batch during its own
  prefill (query sets inside the prompt), so a probed run costs no extra forward pass.
- :func:`probe_forced` — prompts with answers written elsewhere (a serving engine): one teacher-forced forward pass
  per batch gives what :func:`probe_generation` captures while the same answers are generated.
- :func:`probe_transformer_lens` — the same measures from a TransformerLens ``TransformerBridge`` via its
  ``hook_pattern`` hooks.
- :func:`measures` — the registered attention measures (:mod:`probe.attention.measure`: each is one entry with its
  reducer and its eager reference; :func:`register_measure` adds one).
- :func:`reference_segment_attention` — the same measures computed plainly from eager ``output_attentions``
  (for tests and short prompts).
- :func:`max_probe_context` — on-paper largest context the engine and ``output_attentions`` can handle.

Example (a notebook, any text with user-given spans)::

    from probe.attention import probe_tokenized
    from probe.types import Span, TokenizedPrompt
    tp = TokenizedPrompt(input_ids=ids, spans=(Span("sink", 0, 1), Span("germane", 1, 9), ...))
    res = probe_tokenized(model, tp)          # ProbeOptions() defaults: query "question", γ = 0.5
    res.p_ext, res.enrichment, res.ar_k_mean
    res.save("outputs/demo/attention/smollm2/p1.npz")
"""

from __future__ import annotations

from probe.compat import check_transformers_version

check_transformers_version()  # before the engine imports transformers' attention internals

from probe.attention.capacity import max_probe_context, probe_memory_bytes
from probe.attention.engine import (is_prompt_query, left_pad, probe_batch, probe_forced, probe_generation,
                                    probe_tokenized)
from probe.attention.implementation import attach_probe
from probe.attention.lens import probe_transformer_lens
from probe.attention.measure import Measure, register_measure
from probe.attention.measures import measure, measures
from probe.attention.plan import ProbePlan, build_plan
from probe.attention.reference import reference_segment_attention
from probe.attention.result import KEY_KINDS, AttentionRecordError, SegmentAttention

__all__ = [
    "KEY_KINDS",
    "AttentionRecordError",
    "Measure",
    "ProbePlan",
    "SegmentAttention",
    "attach_probe",
    "build_plan",
    "max_probe_context",
    "measure",
    "measures",
    "is_prompt_query",
    "left_pad",
    "probe_batch",
    "probe_forced",
    "probe_generation",
    "probe_memory_bytes",
    "probe_tokenized",
    "probe_transformer_lens",
    "register_measure",
    "reference_segment_attention",
]
