"""Attention records of a run, aggregated per cell, and their link to behaviour (per layer, per head, logistic
robustness) and to similarity (H3 in attention). Specified in docs/statistics.md#attention--behaviour-per-layer-and-per-head
and docs/statistics.md#h3-in-attention."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pandas as pd
import statsmodels.api as sm

from probe.analysis import inference as inf
from probe.analysis.attention_tests import attention_failure_tests, residue_similarity_tests
from probe.analysis.estimate import Estimate
from probe.analysis.estimates import finite, key_int
from probe.analysis.glm import exp_or_none, fit_logit
from probe.codec import Grid
from probe.analysis.head_tests import HeadHit, HeadTests, fitted_head_tests, with_max_t
from probe.attention.result import SegmentAttention

if TYPE_CHECKING:
    from probe.attention.measure import Measure

log = logging.getLogger(__name__)

MIN_TRIALS_PER_LAYER_FIT = 10
EXTRANEOUS_CONDITIONS = ("Saturation", "Residue")


@dataclass(frozen=True)
class AttentionRecord:
    """The arrays the analysis uses from one probe record (:class:`probe.attention.result.SegmentAttention`).

    Attributes:
        shares: measure id -> (layer, head) array, for every measure on (layer, head) the record holds (``p_ext``).
        enrichment: measure id -> (layer, head) value / chance, for those of them with a chance level.
        chance: (layer,) chance level.
        ar_k_mean: (layer, target) head-mean AR_k, or None; ar_targets: target names (``germane 1``, …,
            ``question``).
        seg_mass: (layer, head, kind) segment mass; kinds: the kind of each last-axis entry.
    """

    shares: dict[str, np.ndarray]
    enrichment: dict[str, np.ndarray]
    chance: np.ndarray
    ar_k_mean: np.ndarray | None
    ar_targets: tuple[str, ...]
    seg_mass: np.ndarray
    kinds: tuple[str, ...]

    @property
    def p_ext(self) -> np.ndarray:
        return self.shares["p_ext"]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.chance.shape) + tuple(next(iter(self.shares.values())).shape[1:])


@dataclass(frozen=True)
class AttentionCell:
    """Mean of one attention measure over the prompts of one model × condition × load that have a probe record.

    Attributes:
        model, condition, load: the cell; measure: the measure's id (``p_ext``, ``ar_k``, …); label: its name in
            sentences and figures (``P_ext``).
        n_prompts: prompts with a record; n_layers, n_heads: their shape.
        mean: grand mean of the cell's array (None where undefined).
        values: the cell's array: (layer, head) mean of a measure on (layer, head), (layer, target) mean head-mean
            AR_k for ``ar_k``.
        enrichment_mean, enrichment: the same for value / chance, for a measure with a chance level (else None).
        chance: the (layer,) mean chance level (None for a measure without one).
        targets: names of the AR_k targets (columns of the ``ar_k`` array; empty for other measures).
    """

    model: str
    condition: str
    load: int
    measure: str
    label: str
    n_prompts: int
    n_layers: int
    n_heads: int
    mean: float | None
    values: Grid
    enrichment_mean: float | None
    enrichment: Grid | None
    chance: Grid | None
    targets: tuple[str, ...]


@dataclass(frozen=True)
class MeasureLogit:
    """Binomial GLM (logit) of a wrong answer on a head-mean attention share (and covariates), clustered by question.

    Attributes:
        estimate: log-odds of a wrong answer per unit of the measure (a share in [0, 1], e.g. P_ext), with its CR2
            SE, CI and p on t(df) Bell–McCaffrey degrees of freedom (none when the fit gives the coefficient only,
            see its ``reason``); q: its BH q-value across the layers of the same fit (one family).
        odds_ratio_per_10pp: exp(0.1 · coefficient), the odds ratio of a wrong answer per 10 percentage points of
            the measure (None where it would overflow).
    """

    estimate: Estimate
    odds_ratio_per_10pp: float | None


@dataclass(frozen=True)
class LayerFit:
    """One layer's logistic robustness fit: the measure alone (``fit``), and the fit adjusted for load and placement
    (``adjusted``: the measure with load (pp) and a Residue indicator as covariates; None where no covariate varies).

    Attributes:
        layer: 0-based layer; n: trials with a finite value of the measure at this layer.
    """

    layer: int
    n: int
    fit: MeasureLogit
    adjusted: MeasureLogit | None


@dataclass(frozen=True)
class LayerTest:
    """One layer of a per-layer test (one coefficient of :func:`probe.analysis.inference.clustered_ols_many`).

    Attributes:
        layer: 0-based layer; n: observations used.
        estimate: the tested coefficient (given also when descriptive) with its CR2 SE clustered by question, CI
            and p on t(df) Bell–McCaffrey degrees of freedom, and its BH q-value across the layers (the family).
    """

    layer: int
    n: int
    estimate: Estimate


@dataclass(frozen=True)
class LayerTests:
    """A per-layer test of one model: one BH family over its layers.

    Attributes:
        measure: what is regressed (e.g. ``head-mean P_ext``); estimand: what the estimate means, with its unit.
        n: observations (trials or prompts); n_questions: questions among them.
        is_test: False when every layer is descriptive (see ``reason``).
        method: the method, in words.
        reason: why there is no test, else None.
        layers: one :class:`LayerTest` per layer.
        significant: layers with q < α (either sign).
    """

    measure: str
    estimand: str
    n: int
    n_questions: int
    is_test: bool
    method: str
    reason: str | None
    layers: tuple[LayerTest, ...]
    significant: tuple[int, ...]


@dataclass(frozen=True)
class AttentionBehaviour:
    """Attention ↔ behaviour of one model and one measure (:func:`attention_behaviour`; docs/statistics.md#attention--behaviour-per-layer-and-per-head).

    Attributes:
        model: the model; measure: the measure's id (``p_ext``); label: its name in sentences (``P_ext``);
            has_chance: whether the per-head test is on the enrichment (value / chance) or on the value;
            n_trials: scored Saturation/Residue trials with a record; n_questions: their questions; conditions:
            those conditions.
        layer_tests: the primary per-layer test (head-mean measure, failed − correct, adjusted for load and
            Residue).
        heads: the per-head test (enrichment, failed − correct, adjusted), BH over the layer × head grid.
        layers: the logistic robustness fits, one :class:`LayerFit` per layer.
        tracking_layers: layers of ``layer_tests`` with q < α and a positive difference (for P_ext: more attention
            on extraneous text in failed trials).
        distractor_heads: heads of ``heads`` with q < α and a positive difference.
        logit_layers, logit_layers_adjusted: layers whose logistic fit (alone; adjusted) has q < α and a positive
            coefficient.
        reason: why nothing could be estimated, else None; method: one line on how.
    """

    model: str
    measure: str
    label: str
    has_chance: bool
    n_trials: int
    n_questions: int
    conditions: tuple[str, ...]
    layer_tests: LayerTests | None
    heads: HeadTests | None
    layers: tuple[LayerFit, ...]
    tracking_layers: tuple[int, ...]
    distractor_heads: tuple[HeadHit, ...]
    logit_layers: tuple[int, ...]
    logit_layers_adjusted: tuple[int, ...]
    reason: str | None
    method: str


@dataclass(frozen=True)
class ResidueAttention:
    """H3 in attention for one model and target: slope of head-mean AR_k on S_sim per layer (:func:`residue_attention`).

    Attributes:
        model: the model; target: ``question`` or ``last germane`` (the prompt's last germane segment).
        n_prompts: Residue prompts with AR_k and S_sim; n_questions: their questions.
        is_load_adjusted: whether load entered the fit (it varies).
        test: the per-layer slopes (AR_k per unit of S_sim), one BH family over the layers.
        pearson_r: per layer, Pearson r of AR_k with S_sim over the prompts (descriptive; None where undefined).
        reason: why there is no estimate, else None.
    """

    model: str
    target: str
    n_prompts: int
    n_questions: int
    is_load_adjusted: bool
    test: LayerTests | None
    pearson_r: tuple[float | None, ...]
    reason: str | None


def linked_measures() -> list[Measure]:
    """The registered attention measures the analysis links to behaviour: those with one value per layer and head."""
    from probe.attention.measures import measures

    return [m for m in measures() if m.is_head_share]


def attention_record(sa: SegmentAttention) -> AttentionRecord:
    """The arrays the attention link uses from one probe record (read once per analysis: :mod:`probe.analysis.ice`).
    """
    counters: dict[str, int] = {}
    names: list[str] = []
    for i in sa.ar_targets:
        kind = sa.segment_kinds[i]
        counters[kind] = counters.get(kind, 0) + 1
        names.append("question" if kind == "question" and counters[kind] == 1 else f"{kind} {counters[kind]}")
    linked = [m for m in linked_measures() if m.id in sa.measures]
    return AttentionRecord(
        shares={m.id: np.asarray(sa[m.id], dtype=np.float64) for m in linked},
        enrichment={m.id: np.asarray(sa.enrichment_of(m.id), dtype=np.float64) for m in linked if m.has_chance},
        chance=np.asarray(sa.chance, dtype=np.float64),
        ar_k_mean=None if sa.ar_k_mean is None else np.asarray(sa.ar_k_mean, dtype=np.float64),
        ar_targets=tuple(names),
        seg_mass=np.asarray(sa.seg_mass, dtype=np.float64),
        kinds=tuple(sa.kinds),
    )


def _nan_mean(arrays: list[np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices (Control enrichment) stay NaN
        return np.nanmean(np.stack(arrays), axis=0)


def _grand_mean(arr: np.ndarray) -> float | None:
    return finite(np.nanmean(arr)) if np.isfinite(arr).any() else None


def summarise_attention(
    records: Mapping[tuple[str, str], AttentionRecord], df: pd.DataFrame
) -> tuple[list[AttentionCell], pd.DataFrame]:
    """Per-cell attention means of every linked measure and of AR_k, and each trial's arrays.

    Args:
        records: (model, prompt id) -> its probe record's arrays (:func:`attention_record`); prompts without one
            are left out.
        df: trial table.

    Returns:
        (cells, per_trial): one :class:`AttentionCell` per model × condition × load × measure with a record
        (the measures of :func:`linked_measures`, then ``ar_k``), each holding its arrays; ``per_trial`` has, for
        every trial whose prompt has a record, ``trial_id``, per linked measure
        ``<measure>_layer`` ((layer,) head-mean) and ``<measure>_heads`` ((layer, head) enrichment, or the values
        for a measure without a chance level), and ``ar_question`` and ``ar_last_germane`` ((layer,) head-mean AR_k
        of the question target and of the prompt's last germane segment; None where the record has none).
    """
    linked = linked_measures()
    prompts = df[["model", "prompt_id", "condition", "load"]].drop_duplicates(["model", "prompt_id"])
    cells: list[AttentionCell] = []
    columns = ["trial_id", *[f"{m.id}_{what}" for m in linked for what in ("layer", "heads")]]
    if not any((str(m), str(p)) in records for m, p in zip(prompts["model"], prompts["prompt_id"])):
        return cells, pd.DataFrame(columns=columns)
    for (model, cond, load), g in prompts.groupby(["model", "condition", "load"], sort=True):
        recs = [records[(str(model), str(p))] for p in g["prompt_id"] if (str(model), str(p)) in records]
        if not recs:
            continue
        shapes = {r.shape for r in recs}
        if len(shapes) != 1:
            log.warning("%s %s %s: attention records of different shapes %s; cell skipped", model, cond, load, shapes)
            continue
        n_layers, n_heads = recs[0].shape[:2]
        chance = Grid(_nan_mean([r.chance for r in recs]))
        base: dict[str, Any] = dict(model=str(model), condition=str(cond), load=key_int(load), n_prompts=len(recs),
                    n_layers=int(n_layers), n_heads=int(n_heads))
        for m in linked:
            if not all(m.id in r.shares for r in recs):
                continue
            mean = _nan_mean([r.shares[m.id] for r in recs])
            enrichment = _nan_mean([r.enrichment[m.id] for r in recs]) if m.has_chance else None
            cells.append(AttentionCell(
                **base, measure=m.id, label=m.name, mean=_grand_mean(mean), values=Grid(mean),
                enrichment_mean=None if enrichment is None else _grand_mean(enrichment),
                enrichment=None if enrichment is None else Grid(enrichment),
                chance=chance if m.has_chance else None, targets=()))
        ar = _ar_cell(recs, base)
        if ar is not None:
            cells.append(ar)
    return cells, _per_trial(records, df, linked)


def _ar_cell(recs: list[AttentionRecord], base: dict[str, Any]) -> AttentionCell | None:
    """The AR_k cell of a cell's records (mean over prompts per layer and target; ``question`` first), or None
    when no record has an AR_k target."""
    ar = [r for r in recs if r.ar_k_mean is not None and r.ar_k_mean.shape[1] > 0]
    if not ar:
        return None
    names: list[str] = []
    for r in ar:
        names += [t for t in r.ar_targets if t not in names]
    names.sort(key=lambda t: (t == "question", t))
    mat = np.full((len(ar), base["n_layers"], len(names)), np.nan)
    for i, r in enumerate(ar):
        assert r.ar_k_mean is not None
        for j, t in enumerate(r.ar_targets):
            mat[i, :, names.index(t)] = r.ar_k_mean[:, j]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ar_mean = np.nanmean(mat, axis=0)  # (layer, target)
    return AttentionCell(**base, measure="ar_k", label="AR_k", mean=_grand_mean(ar_mean), values=Grid(ar_mean),
                         enrichment_mean=None, enrichment=None, chance=None, targets=tuple(names))


def _per_trial(records: Mapping[tuple[str, str], AttentionRecord], df: pd.DataFrame,
               linked: Sequence[Measure]) -> pd.DataFrame:
    """Each trial's arrays (the ``per_trial`` table of :func:`summarise_attention`), trials without a record left
    out."""
    keyed = df[["trial_id", "model", "prompt_id"]]
    keys = [(str(m), str(p)) for m, p in zip(keyed["model"], keyed["prompt_id"])]
    has = [k in records for k in keys]
    columns_data: dict[str, list] = {"trial_id": list(keyed["trial_id"])}
    for m in linked:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            layer_means = {k: np.nanmean(r.shares[m.id], axis=1) for k, r in records.items() if m.id in r.shares}
        columns_data[f"{m.id}_layer"] = [layer_means.get(k) for k in keys]
        columns_data[f"{m.id}_heads"] = [
            (records[k].enrichment if m.has_chance else records[k].shares).get(m.id) if k in records else None
            for k in keys]
    columns_data["ar_question"] = [_target_ar(records[k], "question") if k in records else None for k in keys]
    columns_data["ar_last_germane"] = [_target_ar(records[k], "last germane") if k in records else None
                                       for k in keys]
    per_trial = pd.DataFrame(columns_data)
    return per_trial[np.array(has, dtype=bool)]


def _target_ar(rec: AttentionRecord, target: str) -> np.ndarray | None:
    """(layer,) head-mean AR_k of ``question`` or of the record's ``last germane`` segment; None without one."""
    if rec.ar_k_mean is None or rec.ar_k_mean.shape[1] == 0:
        return None
    if target == "question":
        names = [t for t in rec.ar_targets if t == "question"]
    else:
        germane = [t for t in rec.ar_targets if t.startswith("germane ")]
        names = sorted(germane, key=lambda t: int(t.split()[1]))[-1:]
    if not names:
        return None
    return np.asarray(rec.ar_k_mean[:, rec.ar_targets.index(names[0])], dtype=float)


def _with_q(m: MeasureLogit, q: float) -> MeasureLogit:
    return replace(m, estimate=m.estimate.with_q(finite(q)))


def _positive_hit(e: Estimate, alpha: float) -> bool:
    """A positive estimate with BH q below ``alpha``."""
    return e.q is not None and e.q < alpha and e.value is not None and e.value > 0


def _logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, alpha: float) -> MeasureLogit:
    """Binomial GLM of ``y`` on ``X`` (constant first, the tested variable second), clustered by ``groups``."""
    fit = fit_logit(y, X, groups)
    if not fit.ok:
        return MeasureLogit(Estimate.descriptive(None, fit.reason, fit.se_method), None)
    c = fit.coefficient(1, alpha)
    assert c.value is not None
    return MeasureLogit(replace(c, value=finite(c.value)), odds_ratio_per_10pp=exp_or_none(0.1 * c.value))


def _logit_layer(layer: int, x: np.ndarray, y: np.ndarray, groups: np.ndarray, covariates: np.ndarray,
                 alpha: float, label: str = "P_ext") -> LayerFit:
    ok = np.isfinite(x)
    x, y, groups, covariates = x[ok], y[ok], groups[ok], covariates[ok]

    def none(reason: str) -> LayerFit:
        return LayerFit(layer=layer, n=int(len(x)), fit=MeasureLogit(Estimate.descriptive(None, reason), None),
                        adjusted=None)

    if len(x) < MIN_TRIALS_PER_LAYER_FIT:
        return none(f"{len(x)} trials with {label}; need at least {MIN_TRIALS_PER_LAYER_FIT}")
    if y.min() == y.max():
        return none("no variance in outcome (every trial " + ("wrong" if y[0] else "right") + ")")
    if np.ptp(x) == 0:
        return none(f"no variance in {label}")
    out = LayerFit(layer=layer, n=int(len(x)), fit=_logit(y, sm.add_constant(x, has_constant="add"), groups, alpha),
                   adjusted=None)
    keep = [j for j in range(covariates.shape[1]) if np.ptp(covariates[:, j]) > 0]
    if keep:
        X = np.column_stack([np.ones(len(x)), x, covariates[:, keep]])
        out = replace(out, adjusted=_logit(y, X, groups, alpha))
    return out


def _layer_tests(fits: inf.ManyFits, alpha: float, measure: str, estimand: str, n: int) -> LayerTests:
    """A :class:`LayerTests` from the (layer,) arrays of a :class:`probe.analysis.inference.ManyFits`."""
    layers = tuple(
        LayerTest(layer=i, n=int(fits.n[i]), estimate=fits.estimate_at(i))
        for i in range(fits.estimate.shape[0]))
    return LayerTests(measure=measure, estimand=estimand, n=n, n_questions=fits.n_clusters, is_test=fits.is_test,
                      method=fits.method, reason=fits.reason, layers=layers,
                      significant=tuple(int(i) for i in fits.significant(alpha)[:, 0]))


def method_of(label: str, has_chance: bool = True) -> str:
    """The one-line method of :func:`attention_behaviour` for a measure named ``label``."""
    heads = f"{label} enrichment" if has_chance else label
    return (f"per layer: OLS of head-mean {label} on [1, failed, load, Residue], CR2 clustered by question, t with "
            f"Bell-McCaffrey df, BH across layers; per head: the same on {heads}, BH across the layer x head "
            f"grid; logistic robustness: per-layer Binomial GLM of wrong answer on head-mean {label} (alone; with "
            "load and Residue), CR2 clustered by question, BH across layers")


METHOD = method_of("P_ext")


def attention_behaviour(df: pd.DataFrame, per_trial: pd.DataFrame, model: str, alpha: float = 0.05,
                        measure: str = "p_ext", seed: int = 0) -> AttentionBehaviour:
    """Attention ↔ behaviour of one model and one linked measure: per-layer and per-head tests, logistic fits
    (docs/statistics.md#attention--behaviour-per-layer-and-per-head).

    Args:
        df: trial table.
        per_trial: the per-trial arrays of :func:`summarise_attention`.
        model: model name.
        alpha: test and FDR level.
        measure: the measure's id (one of :func:`linked_measures`).
        seed: seed of the per-head max-T's Monte Carlo sign assignments (the experiment's seed).

    Returns:
        The model's :class:`AttentionBehaviour` (its per-head grids held in it).
    """
    from probe.attention.measures import measure as measure_of

    m = measure_of(measure)
    label = m.name
    layer_col, heads_col = f"{m.id}_layer", f"{m.id}_heads"
    out = AttentionBehaviour(model=model, measure=m.id, label=label, has_chance=m.has_chance, n_trials=0, n_questions=0, conditions=EXTRANEOUS_CONDITIONS,
                             layer_tests=None, heads=None, layers=(), tracking_layers=(), distractor_heads=(),
                             logit_layers=(), logit_layers_adjusted=(), reason=None,
                             method=method_of(label, m.has_chance))
    d = df[(df["model"] == model) & df["is_scored"] & df["condition"].isin(EXTRANEOUS_CONDITIONS)]
    if layer_col in per_trial.columns:
        d = d.merge(per_trial[["trial_id", layer_col, heads_col]], on="trial_id", how="inner")
        d = d[d[layer_col].notna()]
    else:
        d = d.iloc[0:0]
    if d.empty:
        return replace(out, reason=f"no scored Saturation/Residue trial with an attention record of {label}"
                       if m.id != "p_ext" else "no scored Saturation/Residue trial with an attention record")
    shapes = {np.shape(v) for v in d[heads_col]}
    if len(shapes) != 1:
        return replace(out, reason=f"attention records of different shapes {sorted(shapes)}: layers and heads "
                                   "cannot be compared across prompts")
    mat = np.stack(d[layer_col].to_list())  # (trial, layer)
    per_head = np.stack(d[heads_col].to_list())  # (trial, layer, head)
    failed = (d["em"].to_numpy() < 0.5).astype(float)
    groups = d["task_id"].to_numpy()
    load = d["load"].to_numpy(dtype=float)
    residue = (d["condition"] == "Residue").to_numpy(dtype=float)
    covariates = np.column_stack([load, residue])
    layer_fits = attention_failure_tests(mat, failed, load, groups, residue[:, None], alpha)
    layer_tests = _layer_tests(layer_fits, alpha, f"head-mean {label}",
                               f"failed - correct difference in {label} (share) at equal load and placement", len(d))
    head_fits = attention_failure_tests(per_head, failed, load, groups, residue[:, None], alpha)
    what = f"{m.name} enrichment ({m.name} / chance)" if m.has_chance else m.name
    heads = fitted_head_tests(head_fits, alpha, measure=f"{what} per head", n=len(d),
                              estimand="failed - correct difference in " + ("enrichment" if m.has_chance else m.name)
                                       + " at equal load and placement")
    heads = with_max_t(heads, head_fits, per_head, failed, groups, np.column_stack([np.ones(len(d)), covariates]),
                       alpha, seed, "failed - correct contrasts of residuals on load and Residue", over="grid")
    layers = [_logit_layer(li, mat[:, li], failed, groups, covariates, alpha, label) for li in range(mat.shape[1])]
    q_alone = inf.bh_qvalues(np.array([np.nan if r.fit.estimate.p is None else r.fit.estimate.p for r in layers]))
    q_adj = inf.bh_qvalues(np.array([np.nan if r.adjusted is None or r.adjusted.estimate.p is None
                                     else r.adjusted.estimate.p for r in layers]))
    layers = [replace(r, fit=_with_q(r.fit, qa), adjusted=None if r.adjusted is None else _with_q(r.adjusted, qb))
              for r, qa, qb in zip(layers, q_alone, q_adj)]
    tracking = tuple(t.layer for t in layer_tests.layers if _positive_hit(t.estimate, alpha))
    logit = tuple(r.layer for r in layers if _positive_hit(r.fit.estimate, alpha))
    logit_adj = tuple(r.layer for r in layers if r.adjusted is not None and _positive_hit(r.adjusted.estimate, alpha))
    return replace(out, n_trials=int(len(d)), n_questions=int(d["task_id"].nunique()), layer_tests=layer_tests,
                   heads=heads, layers=tuple(layers), tracking_layers=tracking,
                   distractor_heads=tuple(h for h in heads.significant if h.value > 0), logit_layers=logit,
                   logit_layers_adjusted=logit_adj)


TARGETS = ("question", "last germane")


def residue_attention(df: pd.DataFrame, per_trial: pd.DataFrame, model: str, alpha: float = 0.05
                      ) -> list[ResidueAttention]:
    """H3 in attention for one model: per layer, does AR_k of a target grow with the prompt's S_sim?

    One row per Residue prompt with a record, a finite S_sim and AR_k of the target (a prompt's trials share its
    record and S_sim: the first scored or unscored trial stands for it). Per target (``question``, ``last
    germane``): :func:`probe.analysis.attention_tests.residue_similarity_tests` with load as covariate.

    Args:
        df: trial table.
        per_trial: the per-trial arrays of :func:`summarise_attention`.
        model: model name.
        alpha: test and FDR level.

    Returns:
        One :class:`ResidueAttention` per target.
    """
    d = df[(df["model"] == model) & (df["condition"] == "Residue")].merge(per_trial, on="trial_id", how="inner")
    d = d.drop_duplicates("prompt_id")
    out: list[ResidueAttention] = []
    for target in TARGETS:
        col = "ar_question" if target == "question" else "ar_last_germane"
        t = d[d[col].notna() & np.isfinite(d["s_sim"].to_numpy(dtype=float))] if len(d) else d
        empty = ResidueAttention(model=model, target=target, n_prompts=int(len(t)),
                                 n_questions=int(t["task_id"].nunique()) if len(t) else 0, is_load_adjusted=False,
                                 test=None, pearson_r=(), reason=None)
        if d.empty:
            out.append(replace(empty, reason="no Residue prompt with an attention record"))
            continue
        if t.empty:
            why = ("no S_sim recorded for the Residue prompts (nor computable from prompts.jsonl)"
                   if d["s_sim"].isna().all() else f"no AR_k of the {target} target in the records")
            out.append(replace(empty, reason=why))
            continue
        shapes = {np.shape(v) for v in t[col]}
        if len(shapes) != 1:
            out.append(replace(empty, reason=f"AR_k of different depths {sorted(shapes)} across prompts"))
            continue
        ar = np.stack(t[col].to_list())  # (prompt, layer)
        res = residue_similarity_tests(ar, t["s_sim"].to_numpy(dtype=float), t["task_id"].to_numpy(),
                                           t["load"].to_numpy(dtype=float), alpha)
        test = _layer_tests(res.fits, alpha, f"head-mean AR_k of the {target} target",
                            "change in AR_k per unit of S_sim" + (" at equal load" if res.is_load_adjusted else ""),
                            int(len(t)))
        out.append(replace(empty, is_load_adjusted=res.is_load_adjusted, test=test,
                           pearson_r=tuple(finite(v) for v in res.pearson_r)))
    return out
