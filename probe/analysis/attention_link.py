"""Attention records of a run, aggregated per cell, and their link to behaviour (SPEC §4, §6).

Attention records are written by :meth:`probe.attention.result.SegmentAttention.save` where
:meth:`probe.runfolder.RunFolder.attention_record` says; a trial links to its prompt's record by (model, prompt_id)
through that method only (no file name is built here).

Two products:

- :func:`summarise_attention`: per model × condition × load, the mean over prompts of P_ext[layer, head], of the
  enrichment P_ext / chance[layer, head] (NaN-aware: Control prompts have chance 0), of the chance level per
  layer, and of the head-averaged residue AR_k[layer, target]. Targets are named by kind and order (``germane 1``,
  ``germane 2``, …, ``question``) so prompts with the same layout average position by position. The arrays go to
  ``attention_summary.npz`` (members named in each :class:`AttentionCell`); the report draws them without
  recomputing anything.
- :func:`attention_behaviour`: per layer, a logistic fit (statsmodels Binomial GLM, standard errors clustered by
  question; :func:`probe.analysis.glm.fit_logit`, normal reference) of *wrong answer* on the head-mean P_ext of the
  trial's prompt, over the scored trials whose prompt
  has extraneous segments (Saturation, Residue: P_ext is 0 by construction elsewhere, so including them would
  test the condition, not attention). Layers whose Holm-adjusted p is below α with a positive coefficient are
  named as the layers whose distraction tracks failure. Because P_ext rises with load by construction (its
  chance level is the extraneous share), each layer is also fitted with load (pp) and a Residue indicator as
  covariates (``adjusted``; ``tracking_layers_adjusted``): a layer named there tracks failure beyond what the
  load and placement explain. ``odds_ratio_per_10pp_p_ext`` = exp(0.1·coef): the odds ratio of a wrong answer
  per 10 percentage points of P_ext (P_ext is a share, so 0.1 of it).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import statsmodels.api as sm
from statsmodels.stats.multitest import multipletests

from probe.analysis.estimates import finite
from probe.analysis.glm import exp_or_none, fit_logit
from probe.runfolder import RunFolder

log = logging.getLogger(__name__)

MIN_TRIALS_PER_LAYER_FIT = 10
EXTRANEOUS_CONDITIONS = ("Saturation", "Residue")


@dataclass(frozen=True)
class AttentionRecord:
    """The arrays the analysis uses from one probe record (:class:`probe.attention.result.SegmentAttention`).

    Attributes:
        p_ext: (layer, head) P_ext; enrichment: (layer, head) P_ext / chance; chance: (layer,) chance level.
        ar_k_mean: (layer, target) head-mean AR_k, or None; ar_targets: target names (``germane 1``, …,
            ``question``).
        seg_mass: (layer, head, kind) segment mass; kinds: the kind of each last-axis entry.
    """

    p_ext: np.ndarray
    enrichment: np.ndarray
    chance: np.ndarray
    ar_k_mean: np.ndarray | None
    ar_targets: tuple[str, ...]
    seg_mass: np.ndarray
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class AttentionCell:
    """Mean attention of the prompts of one model × condition × load that have a probe record.

    Attributes:
        model, condition, load: the cell.
        n_prompts: prompts with a record; n_layers, n_heads: their shape.
        p_ext_mean, enrichment_mean: grand means over layers and heads (None where undefined, e.g. Control
            enrichment).
        ar_targets: names of the AR_k targets (columns of the ``ar_k`` array).
        p_ext_key, enrichment_key, chance_key: members of ``attention_summary.npz`` holding the (layer, head) mean
            P_ext, the (layer, head) mean enrichment and the (layer,) mean chance level.
        ar_k_key: member holding the (layer, target) mean head-mean AR_k; None without AR_k.
    """

    model: str
    condition: str
    load: int
    n_prompts: int
    n_layers: int
    n_heads: int
    p_ext_mean: float | None
    enrichment_mean: float | None
    ar_targets: tuple[str, ...]
    p_ext_key: str
    enrichment_key: str
    chance_key: str
    ar_k_key: str | None


@dataclass(frozen=True)
class PExtLogit:
    """Binomial GLM (logit) of a wrong answer on head-mean P_ext (and covariates), clustered by question.

    Attributes:
        coef: log-odds of a wrong answer per unit of P_ext (P_ext is a share in [0, 1]); se, ci_low, ci_high, p:
            its SE, CI and p (normal reference); p_holm: p Holm-adjusted across layers (None where not fitted).
        odds_ratio_per_10pp_p_ext: exp(0.1 · coef), the odds ratio of a wrong answer per 10 percentage points of
            P_ext (None where it would overflow).
        reason: why there is no estimate, else None.
    """

    coef: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    p_holm: float | None
    odds_ratio_per_10pp_p_ext: float | None
    reason: str | None


@dataclass(frozen=True)
class LayerFit:
    """One layer's attention ↔ behaviour fit: the :class:`PExtLogit` fields, and the fit adjusted for load and
    placement (``adjusted``: P_ext with load (pp) and a Residue indicator as covariates; None where no covariate
    varies).

    Attributes:
        layer: 0-based layer; n: trials with a finite P_ext at this layer.
    """

    layer: int
    n: int
    coef: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    p_holm: float | None
    odds_ratio_per_10pp_p_ext: float | None
    reason: str | None
    adjusted: PExtLogit | None


@dataclass(frozen=True)
class AttentionBehaviour:
    """Does head-mean P_ext of a layer predict a wrong answer? One model (:func:`attention_behaviour`).

    Attributes:
        model: the model; n_trials: scored Saturation/Residue trials with a record; conditions: those conditions.
        layers: one :class:`LayerFit` per layer.
        tracking_layers: layers with Holm-adjusted p < alpha and a positive coefficient; tracking_layers_adjusted:
            the same for the adjusted fits.
        reason: why no layer could be fitted, else None; method: one line on how.
    """

    model: str
    n_trials: int
    conditions: tuple[str, ...]
    layers: tuple[LayerFit, ...]
    tracking_layers: tuple[int, ...]
    tracking_layers_adjusted: tuple[int, ...]
    reason: str | None
    method: str


def read_attention(run: RunFolder, model: str, prompt_id: str) -> AttentionRecord | None:
    """The probe record of (model, prompt id) in a run folder, or None when there is none.

    This is the one place that knows the record's layout (:class:`probe.attention.result.SegmentAttention`); the
    file is found by :meth:`probe.runfolder.RunFolder.attention_record` only.
    """
    path = run.attention_record(model, prompt_id)
    if not path.is_file():
        return None
    from probe.attention.result import SegmentAttention

    sa = SegmentAttention.load(path)
    counters: dict[str, int] = {}
    names: list[str] = []
    for i in sa.ar_targets:
        kind = sa.segment_kinds[i]
        counters[kind] = counters.get(kind, 0) + 1
        names.append("question" if kind == "question" and counters[kind] == 1 else f"{kind} {counters[kind]}")
    return AttentionRecord(
        p_ext=np.asarray(sa.p_ext, dtype=np.float64),
        enrichment=np.asarray(sa.enrichment, dtype=np.float64),
        chance=np.asarray(sa.chance, dtype=np.float64),
        ar_k_mean=None if sa.ar_k_mean is None else np.asarray(sa.ar_k_mean, dtype=np.float64),
        ar_targets=tuple(names),
        seg_mass=np.asarray(sa.seg_mass, dtype=np.float64),
        kinds=tuple(sa.kinds),
    )


def summarise_attention(
    run: RunFolder, df: pd.DataFrame
) -> tuple[list[AttentionCell], dict[str, np.ndarray], pd.DataFrame]:
    """Per-cell attention means, and each trial's head-mean P_ext per layer.

    Args:
        run: the run folder.
        df: trial table.

    Returns:
        (cells, arrays, per_trial): one :class:`AttentionCell` per model × condition × load with a record;
        ``arrays`` maps the cells' npz member names (``ice_cell<i>_<what>``) to float32 arrays; ``per_trial`` has
        ``trial_id`` and ``p_ext_layer`` (a (layer,) array of head-mean P_ext) for every trial whose prompt has a
        record.
    """
    prompts = df[["model", "prompt_id", "condition", "load"]].drop_duplicates(["model", "prompt_id"])
    records: dict[tuple[str, str], AttentionRecord] = {}
    for model, pid in zip(prompts["model"], prompts["prompt_id"]):
        rec = read_attention(run, str(model), str(pid))
        if rec is not None:
            records[(str(model), str(pid))] = rec
    cells: list[AttentionCell] = []
    arrays: dict[str, np.ndarray] = {}
    if not records:
        return cells, arrays, pd.DataFrame(columns=["trial_id", "p_ext_layer"])
    for (model, cond, load), g in prompts.groupby(["model", "condition", "load"], sort=True):
        recs = [records[(str(model), str(p))] for p in g["prompt_id"] if (str(model), str(p)) in records]
        if not recs:
            continue
        shapes = {r.p_ext.shape for r in recs}
        if len(shapes) != 1:
            log.warning("%s %s %s: attention records of different shapes %s; cell skipped", model, cond, load, shapes)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices (Control enrichment) stay NaN
            p_ext = np.nanmean(np.stack([r.p_ext for r in recs]), axis=0)
            enrichment = np.nanmean(np.stack([r.enrichment for r in recs]), axis=0)
            chance = np.nanmean(np.stack([r.chance for r in recs]), axis=0)
        key = f"ice_cell{len(cells)}"  # npz members are named by position; the cell carries its labels
        for what, arr in (("p_ext", p_ext), ("enrichment", enrichment), ("chance", chance)):
            arrays[f"{key}_{what}"] = arr.astype(np.float32)
        names: list[str] = []
        ar_key = None
        ar = [r for r in recs if r.ar_k_mean is not None and r.ar_k_mean.shape[1] > 0]
        if ar:
            for r in ar:
                names += [t for t in r.ar_targets if t not in names]
            names.sort(key=lambda t: (t == "question", t))
            mat = np.full((len(ar), p_ext.shape[0], len(names)), np.nan)
            for i, r in enumerate(ar):
                assert r.ar_k_mean is not None
                for j, t in enumerate(r.ar_targets):
                    mat[i, :, names.index(t)] = r.ar_k_mean[:, j]
            ar_key = f"{key}_ar_k"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                arrays[ar_key] = np.nanmean(mat, axis=0).astype(np.float32)  # (layer, target)
        cells.append(AttentionCell(
            model=str(model), condition=str(cond), load=int(load), n_prompts=len(recs),
            n_layers=int(p_ext.shape[0]), n_heads=int(p_ext.shape[1]),
            p_ext_mean=finite(np.nanmean(p_ext)) if np.isfinite(p_ext).any() else None,
            enrichment_mean=finite(np.nanmean(enrichment)) if np.isfinite(enrichment).any() else None,
            ar_targets=tuple(names), p_ext_key=f"{key}_p_ext", enrichment_key=f"{key}_enrichment",
            chance_key=f"{key}_chance", ar_k_key=ar_key,
        ))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        layer_means = {k: np.nanmean(r.p_ext, axis=1) for k, r in records.items()}  # (layer,)
    keyed = df[["trial_id", "model", "prompt_id"]]
    per_trial = pd.DataFrame({
        "trial_id": keyed["trial_id"],
        "p_ext_layer": [layer_means.get((str(m), str(p))) for m, p in zip(keyed["model"], keyed["prompt_id"])],
    })
    per_trial = per_trial[per_trial["p_ext_layer"].notna()]
    return cells, arrays, per_trial


def _logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, alpha: float) -> PExtLogit:
    """Binomial GLM of ``y`` on ``X`` (constant first, the tested variable second), clustered by ``groups``."""
    fit = fit_logit(y, X, groups)
    if not fit.ok:
        return PExtLogit(None, None, None, None, None, None, None, fit.reason)
    c = fit.coefficient(1, alpha)
    return PExtLogit(coef=finite(c.estimate), se=finite(c.se), ci_low=finite(c.ci_low), ci_high=finite(c.ci_high),
                     p=finite(c.p), p_holm=None, odds_ratio_per_10pp_p_ext=exp_or_none(0.1 * c.estimate),
                     reason=None)


def _logit_layer(layer: int, x: np.ndarray, y: np.ndarray, groups: np.ndarray, covariates: np.ndarray,
                 alpha: float) -> LayerFit:
    ok = np.isfinite(x)
    x, y, groups, covariates = x[ok], y[ok], groups[ok], covariates[ok]
    out = LayerFit(layer=layer, n=int(len(x)), coef=None, se=None, ci_low=None, ci_high=None, p=None, p_holm=None,
                   odds_ratio_per_10pp_p_ext=None, reason=None, adjusted=None)
    if len(x) < MIN_TRIALS_PER_LAYER_FIT:
        return replace(out, reason=f"{len(x)} trials with P_ext; need at least {MIN_TRIALS_PER_LAYER_FIT}")
    if y.min() == y.max():
        return replace(out, reason="no variance in outcome (every trial " + ("wrong" if y[0] else "right") + ")")
    if np.ptp(x) == 0:
        return replace(out, reason="no variance in P_ext")
    alone = _logit(y, sm.add_constant(x, has_constant="add"), groups, alpha)
    out = replace(out, coef=alone.coef, se=alone.se, ci_low=alone.ci_low, ci_high=alone.ci_high, p=alone.p,
                  odds_ratio_per_10pp_p_ext=alone.odds_ratio_per_10pp_p_ext, reason=alone.reason)
    keep = [j for j in range(covariates.shape[1]) if np.ptp(covariates[:, j]) > 0]
    if keep:
        X = np.column_stack([np.ones(len(x)), x, covariates[:, keep]])
        out = replace(out, adjusted=_logit(y, X, groups, alpha))
    return out


METHOD = "per-layer Binomial GLM of wrong answer on head-mean P_ext, clustered by task_id; Holm across layers"


def attention_behaviour(df: pd.DataFrame, per_trial: pd.DataFrame, model: str, alpha: float = 0.05
                        ) -> AttentionBehaviour:
    """Does head-mean P_ext of a layer predict a wrong answer? One logistic fit per layer (module docstring).

    Args:
        df: trial table.
        per_trial: ``trial_id`` → ``p_ext_layer`` from :func:`summarise_attention`.
        model: model name.
        alpha: test level (Holm-adjusted across layers).

    Returns:
        The model's :class:`AttentionBehaviour`.
    """
    out = AttentionBehaviour(model=model, n_trials=0, conditions=EXTRANEOUS_CONDITIONS, layers=(),
                             tracking_layers=(), tracking_layers_adjusted=(), reason=None, method=METHOD)
    d = df[(df["model"] == model) & df["is_scored"] & df["condition"].isin(EXTRANEOUS_CONDITIONS)]
    d = d.merge(per_trial, on="trial_id", how="inner")
    if d.empty:
        return replace(out, reason="no scored Saturation/Residue trial with an attention record")
    mat = np.stack(d["p_ext_layer"].to_list())  # (trial, layer)
    wrong = (d["em"].to_numpy() < 0.5).astype(float)
    groups = d["task_id"].to_numpy()
    covariates = np.column_stack([d["load"].to_numpy(dtype=float),
                                  (d["condition"] == "Residue").to_numpy(dtype=float)])
    layers = [_logit_layer(li, mat[:, li], wrong, groups, covariates, alpha) for li in range(mat.shape[1])]
    fitted = [i for i, r in enumerate(layers) if r.p is not None]
    if fitted:
        adj = multipletests([layers[i].p for i in fitted], alpha=alpha, method="holm")[1]
        for i, pa in zip(fitted, adj):
            layers[i] = replace(layers[i], p_holm=finite(pa))
    adjusted = [i for i, r in enumerate(layers) if r.adjusted is not None and r.adjusted.p is not None]
    if adjusted:
        adj = multipletests([layers[i].adjusted.p for i in adjusted], alpha=alpha, method="holm")[1]  # type: ignore[union-attr]
        for i, pa in zip(adjusted, adj):
            layers[i] = replace(layers[i], adjusted=replace(layers[i].adjusted, p_holm=finite(pa)))  # type: ignore[type-var]
    tracking = tuple(layers[i].layer for i in fitted
                     if layers[i].p_holm is not None and layers[i].p_holm < alpha and layers[i].coef > 0)  # type: ignore[operator]
    tracking_adj = tuple(layers[i].layer for i in adjusted if (a := layers[i].adjusted) is not None
                         and a.p_holm is not None and a.p_holm < alpha and a.coef > 0)  # type: ignore[operator]
    reason = None
    if not fitted:
        reasons = {r.reason for r in layers}
        reason = "no layer could be fitted: " + "; ".join(sorted(str(x) for x in reasons))
    return replace(out, n_trials=int(len(d)), layers=tuple(layers), tracking_layers=tracking,
                   tracking_layers_adjusted=tracking_adj, reason=reason)
