"""The ICE family's analysis (family ``ice``): cells, H1–H3 and their power, what the model wrote, attention ↔
behaviour, retrieval heads, hop tracking and the taxonomy, each probe record read once (docs/method.md#hypotheses)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field


from probe.analysis.attention_link import (
    AttentionBehaviour,
    AttentionCell,
    AttentionRecord,
    ResidueAttention,
    attention_behaviour,
    attention_record,
    linked_measures,
    residue_attention,
    summarise_attention,
)
from probe.analysis.estimates import Cell, cell_summaries, is_strict
from probe.analysis.families import FamilyAnalysis, FamilyData, FamilyOutput
from probe.analysis.frame import probe_records
from probe.analysis.hops import HopTracker, HopTracking
from probe.analysis.hypotheses import (
    H1Fit,
    H3Correlation,
    PairedComparison,
    fit_load_trend,
    h2_comparisons,
    similarity_degradation,
)
from probe.analysis.retrieval import RetrievalHeads, analyze_retrieval
from probe.analysis.writing import WritingCell, writing_cells, writing_columns
from probe.attention.retrieval import TrialRetrieval, trial_retrieval
from probe.analysis.taxonomy import Taxonomy, classify_model
from probe.codec import OMIT

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
        writing: :class:`probe.analysis.writing.WritingCell` per model × condition × load: what the model wrote
            (length, one-sentence share, which fact the answer line restates) and its tests against Control (and,
            for Saturation and Residue, against LongControl at the same load).
        h2_strict: H2's comparisons on strict EM (a trial counts only when correct *and* decided by a box or an
            answer line), their own BH families; empty where a trial's scoring rule is not recorded.
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
    retrieval: tuple[RetrievalHeads, ...] = field(default=(), metadata={OMIT: True})
    hop_tracking: HopTracking | None = field(default=None, metadata={OMIT: True})
    writing: tuple[WritingCell, ...] = field(default=(), metadata={OMIT: True})
    h2_strict: tuple[PairedComparison, ...] = field(default=(), metadata={OMIT: True})

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


@dataclass
class _ProbeReads:
    """What the ICE analysis keeps of each probe record, taken in one read of every record."""

    attention: dict[tuple[str, str], AttentionRecord]
    retrieval: dict[tuple[str, str], TrialRetrieval]
    hops: HopTracker


def read_probe_records(data: FamilyData) -> _ProbeReads:
    """Read each probe record of the family's baseline trials once, one in memory at a time, and hand its parts to
    the attention link, the retrieval heads and hop tracking (in the trials' order)."""
    trial_of = {(t.model, t.prompt_id): t for t in data.trials}
    out = _ProbeReads({}, {}, HopTracker(data.tasks or {}, data.prompts))
    for key, sa in probe_records(data.run, trial_of, data.prompts):
        out.attention[key] = attention_record(sa)
        if sa.answer is not None:
            trial = trial_of[key]
            if trial.is_scored:
                out.retrieval[key] = trial_retrieval(sa.answer)
            out.hops.add(trial, sa.answer)
    return out


def analyze_ice(data: FamilyData) -> FamilyOutput:
    """Every ICE estimate of a run's ``ice`` trials (docs/method.md#hypotheses).

    Args:
        data: the family's trials, the run folder, settings and seed.

    Returns:
        The :class:`IceResult` and notes.
    """
    cfg = data.settings
    df = data.frame
    notes: list[str] = []
    no_sim = df["s_sim"].isna() & df["condition"].isin(S_SIM_CONDITIONS) & df["is_scored"]
    if no_sim.any():
        notes.append(f"S_sim missing for {int(no_sim.sum())} Saturation/Residue trials (their prompts were built "
                     "without the embedder: [analysis] embedder)")
    reads = read_probe_records(data)
    models = sorted(df["model"].unique().tolist())
    has = {(m, c) for m, c in zip(df["model"], df["condition"])}
    h1 = [fit_load_trend(df, m, c, cfg.alpha) for m in models for c in H1_CONDITIONS if (m, c) in has]
    h2 = [row for m in models for row in h2_comparisons(df, m, cfg.alpha, data.seed, cfg.equivalence_margin)]
    h2_strict: list[PairedComparison] = []
    scored = df[df["is_scored"]]
    if len(scored) and scored["extraction"].notna().all():  # strict EM: correct and decided by a box or answer line
        strict = df.assign(em=df["em"].astype(float) * is_strict(df))
        h2_strict = [row for m in models
                     for row in h2_comparisons(strict, m, cfg.alpha, data.seed, cfg.equivalence_margin)]
    h3 = [row for m in models if (m, "Residue") in has for row in similarity_degradation(df, m, cfg.alpha)]
    att_cells, per_trial = summarise_attention(reads.attention, df)
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
        retrieval = analyze_retrieval(reads.retrieval, df, models, alpha=cfg.alpha, seed=data.seed)
    sat = {h.model: h for h in h1 if h.condition == "Saturation"}
    taxonomy = [classify_model(df, m, sat.get(m), cfg) for m in models]
    hops, hop_notes = reads.hops.result(cfg.alpha, data.seed, has_tasks=data.tasks is not None)
    notes += hop_notes
    writing = writing_cells(writing_columns(df, data.trials, data.tasks), cfg.alpha, data.seed)
    result = IceResult(models=tuple(models), cells=tuple(cell_summaries(df, cfg.alpha)), h1=tuple(h1), h2=tuple(h2),
                       h3=tuple(h3), residue_attention=tuple(residue), attention_cells=tuple(att_cells),
                       attention_behaviour=tuple(attention), taxonomy=tuple(taxonomy), hop_tracking=hops,
                       retrieval=tuple(retrieval), writing=tuple(writing), h2_strict=tuple(h2_strict))
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

ANALYSIS = FamilyAnalysis(name=FAMILY, result_type=IceResult, analyze=analyze_ice, tabulate=tabulate_ice,
                          methods=METHODS)
