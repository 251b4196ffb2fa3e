"""The attention probe engine: how each layer and head distributes attention over a prompt's segments; its entry
points and measures are specified in docs/probes.md."""

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
