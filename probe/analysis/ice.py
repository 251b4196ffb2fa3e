"""The ICE family's analysis (family ``ice``; docs/method.md#hypotheses): cells, H1-H3, power, attention ↔ behaviour,
taxonomy.

Registered with :mod:`probe.analysis.families`; gets the run's ``ice`` trials (multi-hop questions under the
Control, LongControl, Saturation and Residue conditions, and any condition a user's own segments name) and returns
an :class:`IceResult`:

- ``cells``: EM per model × condition × load (:mod:`probe.analysis.estimates`);
- ``h1`` (Saturation, Residue and LongControl against Control), ``h2``, ``h3`` and their power
  (:mod:`probe.analysis.hypotheses`); H2's Monte Carlo sign flips (above 16 questions) are seeded with the
  experiment's seed;
- ``attention_cells``, ``attention_behaviour`` (per-layer and per-head tests, logistic robustness fits) and
  ``residue_attention`` (H3 in attention) when probe records exist (:mod:`probe.analysis.attention_link`; the cell
  arrays and the per-head grids are held in the results, and written to ``attention_summary.npz``);
- ``taxonomy`` per model (:mod:`probe.analysis.taxonomy`);
- ``hop_tracking`` when probe records hold attention while the answer was written (:mod:`probe.analysis.hops`:
  which fact the model read while it named each hop's answer; None otherwise, and then absent from the file).
- ``retrieval`` per model when probe records hold an answer capture (:mod:`probe.analysis.retrieval`: retrieval
  heads and the lookback ratio; empty, and absent from ``analysis.json``, otherwise).

S_sim missing from a Saturation or Residue trial (and its prompt record) is computed from ``prompts.jsonl`` with the
``[analysis] embedder`` when the analysis is allowed to (``fill_similarity``); where that is impossible a note says
so and H3 has a reason instead of an estimate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from probe.analysis.attention_link import (
    AttentionBehaviour,
    AttentionCell,
    ResidueAttention,
    attention_behaviour,
    linked_measures,
    residue_attention,
    summarise_attention,
)
from probe.analysis.estimates import Cell, cell_summaries
from probe.analysis.families import FamilyAnalysis, FamilyData, FamilyOutput, register_family_analysis
from probe.analysis.hops import HopTracking, analyze_hops
from probe.analysis.hypotheses import (
    H1Fit,
    H3Correlation,
    PairedComparison,
    fit_load_trend,
    h2_comparisons,
    similarity_degradation,
)
from probe.analysis.retrieval import RetrievalHeads, analyze_retrieval
from probe.analysis.results import OMIT_EMPTY, OPTIONAL
from probe.analysis.taxonomy import Taxonomy, classify_model
from probe.errors import ProbeError
from probe.types import Prompt

log = logging.getLogger(__name__)

FAMILY = "ice"
H1_CONDITIONS = ("Saturation", "Residue", "LongControl")
# conditions whose prompts have extraneous segments (docs/method.md#task-similarity-s_sim)
S_SIM_CONDITIONS = ("Saturation", "Residue")


@dataclass(frozen=True)
class IceResult:
    """The ICE family's result (``Analysis.families["ice"]``).

    Attributes:
        models: models with ICE trials, sorted.
        cells: :class:`probe.analysis.estimates.Cell` per model × condition × load.
        h1: :class:`probe.analysis.hypotheses.H1Fit` per model and condition present (Saturation, Residue,
            LongControl).
        h2: :class:`probe.analysis.hypotheses.PairedComparison` per model, comparison and load.
        h3: :class:`probe.analysis.hypotheses.H3Correlation` per model with Residue trials (pooled, then per load).
        residue_attention: :class:`probe.analysis.attention_link.ResidueAttention` per model and AR_k target (H3 in
            attention; empty without probe records).
        attention_cells: :class:`probe.analysis.attention_link.AttentionCell` per cell and measure with probe
            records.
        attention_behaviour: :class:`probe.analysis.attention_link.AttentionBehaviour` per model and linked
            measure (``measure``; empty without probe records).
        taxonomy: :class:`probe.analysis.taxonomy.Taxonomy` per model.
        retrieval: :class:`probe.analysis.retrieval.RetrievalHeads` per model (empty without answer captures).
        hop_tracking: :class:`probe.analysis.hops.HopTracking`, or None when no trial's probe record holds
            attention while the answer was written.
    """

    models: tuple[str, ...]
    cells: tuple[Cell, ...]
    h1: tuple[H1Fit, ...]
    h2: tuple[PairedComparison, ...]
    h3: tuple[H3Correlation, ...]
    residue_attention: tuple[ResidueAttention, ...]
    attention_cells: tuple[AttentionCell, ...]
    attention_behaviour: tuple[AttentionBehaviour, ...]
    taxonomy: tuple[Taxonomy, ...]
    retrieval: tuple[RetrievalHeads, ...] = field(default=(), metadata={OMIT_EMPTY: True})
    hop_tracking: HopTracking | None = field(default=None, metadata={OPTIONAL: True})

    def h1_of(self, model: str, condition: str = "Saturation") -> H1Fit | None:
        """The H1 fit of (model, condition), or None."""
        return next((h for h in self.h1 if h.model == model and h.condition == condition), None)

    def taxonomy_of(self, model: str) -> Taxonomy | None:
        """The model's taxonomy, or None."""
        return next((t for t in self.taxonomy if t.model == model), None)

    def attention_of(self, model: str, measure: str = "p_ext") -> AttentionBehaviour | None:
        """The model's attention ↔ behaviour fits of ``measure``, or None."""
        return next((a for a in self.attention_behaviour if a.model == model and a.measure == measure), None)

    def residue_attention_of(self, model: str) -> tuple[ResidueAttention, ...]:
        """The model's H3-in-attention rows (one per AR_k target)."""
        return tuple(r for r in self.residue_attention if r.model == model)


def fill_s_sim(df: pd.DataFrame, prompts: dict[str, Prompt], embedder_name: str) -> tuple[pd.DataFrame, str | None]:
    """Compute S_sim for Saturation/Residue trials that lack it, from their prompt records.

    The question is the prompt's ``question`` segment text; the extraneous texts are its ``extraneous``
    segments (docs/method.md#task-similarity-s_sim).

    Returns:
        The table with ``s_sim`` filled where possible, and a note (None when nothing was missing).
    """
    need = df["s_sim"].isna() & df["prompt_id"].isin(list(prompts)) & df["condition"].isin(S_SIM_CONDITIONS)
    if not need.any():
        return df, None
    try:
        from probe.prompts.similarity import get_embedder

        embedder = get_embedder(embedder_name)
    except ProbeError as e:
        return df, f"S_sim missing for {int(need.sum())} trials and not computable here: {e}"
    cache: dict[str, float | None] = {}
    for pid in df.loc[need, "prompt_id"].unique():
        p = prompts[pid]
        question = " ".join(p.segment_text(s) for s in p.segments if s.kind == "question")
        extraneous = [p.segment_text(s) for s in p.segments if s.kind == "extraneous"]
        cache[pid] = embedder.s_sim(question, extraneous) if question else None
    df = df.copy()
    df.loc[need, "s_sim"] = df.loc[need, "prompt_id"].map(lambda pid: np.nan if cache[pid] is None else cache[pid])
    return df, f"S_sim computed from prompts.jsonl with {embedder_name} for {int(need.sum())} trials"


def analyze_ice(data: FamilyData) -> FamilyOutput:
    """Every ICE estimate of a run's ``ice`` trials (module docstring).

    Args:
        data: the family's trials, the run folder, settings and seed.

    Returns:
        The :class:`IceResult` and notes.
    """
    cfg = data.settings
    df = data.frame
    notes: list[str] = []
    if data.fill_similarity:
        df, note = fill_s_sim(df, data.prompts, cfg.embedder)
        if note:
            notes.append(note)
    models = sorted(df["model"].unique().tolist())
    has = {(m, c) for m, c in zip(df["model"], df["condition"])}
    h1 = [fit_load_trend(df, m, c, cfg.alpha) for m in models for c in H1_CONDITIONS if (m, c) in has]
    h2 = [row for m in models for row in h2_comparisons(df, m, cfg.alpha, data.seed)]
    h3 = [row for m in models if (m, "Residue") in has for row in similarity_degradation(df, m, cfg.alpha)]
    att_cells, per_trial = summarise_attention(data.run, df)
    attention: list[AttentionBehaviour] = []
    residue: list[ResidueAttention] = []
    if att_cells:
        for m in models:
            for measure in [m for m in linked_measures() if any(c.measure == m.id for c in att_cells)]:
                attention.append(attention_behaviour(df, per_trial, m, cfg.alpha, measure=measure.id, seed=data.seed))
            if (m, "Residue") in has:
                residue += residue_attention(df, per_trial, m, cfg.alpha)
    retrieval: list[RetrievalHeads] = []
    if att_cells:
        retrieval = analyze_retrieval(data.run, df, models, alpha=cfg.alpha, seed=data.seed)
    sat = {h.model: h for h in h1 if h.condition == "Saturation"}
    taxonomy = [classify_model(df, m, sat.get(m), cfg) for m in models]
    hops, hop_notes = analyze_hops(data.run, data.trials, data.prompts, cfg.alpha, seed=data.seed)
    notes += hop_notes
    result = IceResult(models=tuple(models), cells=tuple(cell_summaries(df, cfg.alpha)), h1=tuple(h1), h2=tuple(h2),
                       h3=tuple(h3), residue_attention=tuple(residue), attention_cells=tuple(att_cells),
                       attention_behaviour=tuple(attention), taxonomy=tuple(taxonomy), hop_tracking=hops,
                       retrieval=tuple(retrieval))
    return FamilyOutput(result=result, notes=tuple(notes),
                        n_attention_records=sum({(c.model, c.condition, c.load): c.n_prompts
                                                 for c in att_cells}.values()))


def tabulate_ice(data: FamilyData) -> IceResult:
    """The ICE cells of a run's ``ice`` trials, without fits (the quick table of ``probe run``)."""
    df = data.frame
    return IceResult(models=tuple(sorted(df["model"].unique().tolist())),
                     cells=tuple(cell_summaries(df, data.settings.alpha)), h1=(), h2=(), h3=(), residue_attention=(),
                     attention_cells=(), attention_behaviour=(), taxonomy=())


METHODS = {
    "cells": "EM mean; SEM = scipy.stats.sem over scored trials; 95% CI = Wilson score interval at the Korn-Graubard "
             "effective sample size (CR1 design effect by question, floored at 1; df adjustment (t_{n-1}/t_{G-1})^2): "
             "inside [0, 1], clustered by question; no interval with one question (docs/statistics.md)",
    "h1": "OLS EM ~ load (pp), Control trials as load 0, CR2 SEs clustered by task_id, t with Bell-McCaffrey df; "
          "Binomial GLM (logit) with the same clustering and reference as robustness (odds_ratio_per_10pp_load = "
          "exp(10 b)); fewer than 6 questions: estimate only, no test",
    "h2": "sign-flip permutation test of the per-question mean paired difference (pairs = task_id x replication, "
          "equal load where both conditions carry one; exact up to 16 questions, else 9,999 seeded Monte Carlo "
          "flips); exact McNemar on the pairs as a secondary column; Benjamini-Hochberg q across the model's "
          "comparisons (one family); fewer than 6 questions: no test",
    "h3": "per question degradation = mean EM(Control) - mean EM(Residue); Pearson r with mean S_sim of its Residue "
          "trials, Fisher-z CI and the p-value of the same pivot (they always agree), Spearman rho; n < 4 refused; "
          "Benjamini-Hochberg q across the model's H3 rows (pooled, per load)",
    "power": "post hoc, on each test's own reference: H1 noncentral t with the Bell-McCaffrey df, noncentrality "
             "|b|/SE, and the |b| detectable with 80% power (MDE); H2 one-sample t of the per-question differences "
             "(G-1 df), power and MDE in EM units",
    "attention": "Saturation and Residue trials; per layer: OLS of head-mean P_ext on [1, failed, load, Residue], "
                 "CR2 clustered by task_id, t with Bell-McCaffrey df, BH across layers (tracking layers: q < alpha, "
                 "more P_ext in failed trials); per head: the same on P_ext enrichment, BH across the layer x head "
                 "grid (distractor heads: q < alpha, positive); logistic robustness per layer (wrong ~ P_ext, alone "
                 "and with load and Residue), CR2, BH across layers; odds_ratio_per_10pp = exp(0.1 b); the same for "
                 "every registered attention measure with one value per layer and head (column measure)",
    "residue_attention": "H3 in attention: per Residue prompt head-mean AR_k of the question target and of the "
                         "last germane segment per layer, OLS on [1, S_sim, load], CR2 clustered by task_id, t with "
                         "Bell-McCaffrey df, BH across layers per target; Pearson r per layer (descriptive)",
    "families": "Benjamini-Hochberg families (q < alpha is called significant): H2 per model; H3 rows per model; "
                "per-layer attention tests per model and measure; the per-head grid per model; H3 in attention per "
                "model and target. H1 is one pre-specified test per condition. A summary sentence quotes only "
                "results that pass their family's correction",
    "minimum": "fewer than 6 questions: every fit and test is descriptive (estimate only, with the reason); EM "
               "intervals from 2 questions on",
}

ANALYSIS = register_family_analysis(FamilyAnalysis(name=FAMILY, result_type=IceResult, analyze=analyze_ice,
                                                   tabulate=tabulate_ice, methods=METHODS))
