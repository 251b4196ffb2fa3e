"""Attention measures as a registry: a toy measure added in one place (this file's fixture) is computed by the
engine, stored in the record, held to its eager reference (the tests' check and ``probe bench gpu-check``'s),
analysed against behaviour and reported, with no other file edited."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import torch

from probe.attention import Measure, measures, probe_tokenized, reference_segment_attention, register_measure
from probe.attention.measure import MEASURES, EagerAttention, LayerContext
from probe.attention.segments import RowBlock
from probe.attention.result import SegmentAttention
from probe.errors import UnknownNameError
from probe.registry import DuplicateEntryError
from tests.attention.test_attention import _build, make_prompt

TOY = "germane_mass"


class GermaneMass:
    """Mean mass of the query set on germane keys, per head: the toy measure's reducer, written from scratch."""

    def __init__(self, ctx: LayerContext) -> None:
        plan = ctx.plan
        germane = np.array([k == "germane" for k in plan.segment_kinds])[plan.seg_of_token]
        self.is_germane = torch.as_tensor(germane, dtype=torch.float32, device=ctx.tensors.device)
        self.total = torch.zeros(ctx.n_heads, dtype=torch.float64, device=ctx.tensors.device)
        self.n_queries = len(plan.query_positions)

    def add(self, block: RowBlock, probs: torch.Tensor, values: torch.Tensor | None, key_start: int) -> None:
        if block.query_index is not None:
            keys = self.is_germane[key_start:key_start + probs.shape[-1]]
            self.total += (probs[:, block.query_index] * keys).sum(dim=(1, 2), dtype=torch.float64)

    def finish(self) -> np.ndarray:
        return (self.total / self.n_queries).cpu().numpy()


def germane_reference(e: EagerAttention) -> np.ndarray:
    """The same from eager attention: a loop over layers, heads and queries."""
    keys = [k for (a, b), kind in zip(e.seg_bounds, e.seg_kinds) if kind == "germane" for k in range(a, b)]
    return np.array([[np.mean([att[h, q, keys].sum() for q in e.queries]) for h in range(att.shape[0])]
                     for att in e.attentions])


@pytest.fixture
def toy() -> Iterator[Measure]:
    """The one place the toy measure is added: one registry entry."""
    m = register_measure(Measure(id=TOY, axes=("layer", "head"), value_range=(0.0, 1.0),
                                 description="mass of the query set on germane segments",
                                 reference=germane_reference, reducer=GermaneMass, label="germane mass"))
    yield m
    MEASURES.unregister(TOY)


def test_the_built_in_measures_are_registered_once_and_a_typo_is_named() -> None:
    ids = [m.id for m in measures()]
    assert ids[:4] == ["seg_mass_segment", "seg_mass", "p_ext", "ar_k"]
    with pytest.raises(DuplicateEntryError):
        register_measure(measures()[2])
    from probe.attention import measure

    with pytest.raises(UnknownNameError, match="p_ext"):
        measure("p_exd")
    with pytest.raises(ValueError, match="exactly one of reducer and derive"):
        Measure(id="bad", axes=("layer", "head"), value_range=(0.0, 1.0), description="", reference=lambda e: e)


def test_a_toy_measure_is_computed_stored_and_checked_against_its_reference(toy: Measure, tmp_path) -> None:
    model = _build("llama-gqa3")
    tp = make_prompt(4, layout="saturation", n_tokens=61)
    got = probe_tokenized(model, tp)
    ref = reference_segment_attention(model, tp)
    assert got[TOY].shape == (2, model.config.num_attention_heads)
    diffs = got.max_differences(ref)
    assert diffs[TOY] <= 1e-4 and max(diffs.values()) <= 1e-4
    # an independent sum: the germane kind's column of the per-kind mass
    np.testing.assert_allclose(got[TOY], got.mass_of("germane"), atol=1e-6)
    back = SegmentAttention.load(got.save(tmp_path / "p.npz"))
    np.testing.assert_array_equal(back[TOY], got[TOY])

    from benchmarks.gpu_check import _max_diff, format_gpu_check

    assert _max_diff(got, ref)[0] == max(v for k, v in diffs.items() if k != "chance")
    from benchmarks.gpu_check import GpuCheckReport

    assert TOY in format_gpu_check(GpuCheckReport(device="cpu"))


def test_a_toy_measure_is_analysed_and_reported(toy: Measure, tmp_path) -> None:
    from probe.analysis import analyze_run, read_analysis
    from probe.attention import KEY_KINDS
    from probe.attention.measures.mass import by_kind
    from probe.report import render_report, write_tables
    from probe.runfolder import RunFolder
    from tests.fixtures.synthetic_run import Plan, make_run

    run = tmp_path / "run"
    plan = Plan(n_tasks=8, n_reps=2, loads=(20, 80), attention=True, attention_effect=1.0, n_layers=3, n_heads=2,
                seed=4)
    make_run(run, plan)
    folder = RunFolder(run)
    for path in folder.attention_root.rglob("*.npz"):  # the fixture's records, with the toy measure written in
        sa = SegmentAttention.load(path)
        sa.measures[TOY] = by_kind(sa.seg_mass_segment.astype(np.float64), sa.segment_kinds)[..., KEY_KINDS.index("germane")].astype(np.float32)
        sa.save(path)
    analysis = analyze_run(run)
    ice = analysis.families["ice"]
    toy_rows = [a for a in ice.attention_behaviour if a.measure == TOY]
    assert len(toy_rows) == 1 and toy_rows[0].layer_tests is not None and toy_rows[0].reason is None
    assert toy_rows[0].label == "germane mass" and not toy_rows[0].has_chance
    assert "germane mass per head" in toy_rows[0].heads.measure  # no chance level: the value itself per head
    cells = [c for c in ice.attention_cells if c.measure == TOY]
    assert cells and all(c.enrichment is None and c.chance is None for c in cells)
    # the analysis' cell mean, as read back from the run folder, is the mean of the records' arrays
    sat = next(c for c in read_analysis(run).families["ice"].attention_cells
               if c.measure == TOY and c.condition == "Saturation" and c.load == 80)
    stored = sat.values.values
    df = pd.read_json(run / "trials.jsonl", lines=True)
    pids = df[(df["condition"] == "Saturation") & (df["load"] == 80)]["prompt_id"].unique()
    mean = np.mean([SegmentAttention.load(folder.attention_record("model-a", p))[TOY] for p in pids], axis=0)
    np.testing.assert_allclose(stored, mean, rtol=1e-6)
    # the p_ext analysis is that of a run without the toy measure
    p_ext = [a for a in ice.attention_behaviour if a.measure == "p_ext"]
    assert len(p_ext) == 1 and p_ext[0].layer_tests is not None
    render_report(run)
    write_tables(analysis, run)
    layers_csv = pd.read_csv(run / "tables" / "attention_layers.csv")
    assert set(layers_csv["measure"]) == {"p_ext", TOY}
    assert (folder.figures / f"{TOY}_layers_model-a.png").is_file()
    assert "germane mass" in (run / "report.html").read_text(encoding="utf-8")


def test_the_gram_of_a_layer_is_kept_until_its_weight_changes() -> None:
    """The value-weighted measures compute each layer's W_O^h W_O^hᵀ once (not per prompt and batch), and again
    after an in-place edit of the output projection (an independent product of the edited weight)."""
    from probe.attention.measures.value import module_gram

    attn = torch.nn.Module()
    attn.o_proj = torch.nn.Linear(8, 6, bias=False)
    first = module_gram(attn, 2, torch.device("cpu"))
    assert module_gram(attn, 2, torch.device("cpu")) is first
    with torch.no_grad():
        attn.o_proj.weight.mul_(3.0)
    w = attn.o_proj.weight.detach().T.reshape(2, 4, 6)  # head h: rows h*4 .. h*4+3 of W_O
    expected = torch.stack([w[h] @ w[h].T for h in range(2)])
    torch.testing.assert_close(module_gram(attn, 2, torch.device("cpu")), expected, rtol=1e-6, atol=1e-6)
