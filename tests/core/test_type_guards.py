"""Checks that replaced silent assumptions when probe/ was brought under the static type check: each refuses,
by name, what used to fail deep inside numpy or float()."""

from __future__ import annotations

import numpy as np
import pytest

from probe.analysis.estimates import key_int
from probe.attention import build_plan
from probe.attention.reduce import LayerAggregates, assemble_result
from probe.probe_options import ProbeOptions
from probe.errors import HookError
from probe.types import Span, TokenizedPrompt


def test_a_layer_without_its_residue_is_refused() -> None:
    tp = TokenizedPrompt(input_ids=tuple(range(9)), spans=(Span("sink", 0, 1), Span("extraneous", 1, 4),
                                                          Span("germane", 4, 6), Span("question", 6, 9)))
    plan = build_plan(tp, ProbeOptions())
    assert plan.compute_residue and plan.ar_targets
    n_heads, n_seg = 2, len(plan.segment_kinds)
    full = LayerAggregates({"seg_mass_segment": np.full((n_heads, n_seg), 1 / n_seg),
                            "ar_k": np.zeros((n_heads, len(plan.ar_targets)))}, 0.5)
    assert assemble_result(plan, [full, full]).ar_k.shape == (2, n_heads, len(plan.ar_targets))
    silent = LayerAggregates({"seg_mass_segment": full.arrays["seg_mass_segment"]}, 0.5)
    with pytest.raises(HookError, match="1 of 2 layers reported no attentional residue"):
        assemble_result(plan, [full, silent])


def test_group_keys_become_ints_or_are_refused() -> None:
    assert key_int(np.int64(20)) == 20 and key_int(80.0) == 80 and type(key_int(np.int64(3))) is int
    with pytest.raises(TypeError, match="'20'"):
        key_int("20")
