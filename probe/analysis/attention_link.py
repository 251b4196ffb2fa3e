"""Attention records of a run, aggregated per cell, and their link to behaviour (SPEC §4, §6).

Attention files are ``attention/<model>/<prompt_id>.npz`` written by
:meth:`probe.attention.result.SegmentAttention.save`; a trial links to its prompt's file by (model, prompt_id).

Two products:

- :func:`summarise_attention`: per model × condition × load, the mean over prompts of P_ext[layer, head], of the
  enrichment P_ext / chance[layer, head] (NaN-aware: Control prompts have chance 0), of the chance level per
  layer, and of the head-averaged residue AR_k[layer, target]. Targets are named by kind and order (``germane 1``,
  ``germane 2``, …, ``question``) so prompts with the same layout average position by position. The arrays go to
  ``attention_summary.npz``; the report draws them without recomputing anything.
- :func:`attention_behaviour`: per layer, a logistic fit (statsmodels Binomial GLM, standard errors clustered by
  question) of *wrong answer* on the head-mean P_ext of the trial's prompt, over the scored trials whose prompt
  has extraneous segments (Saturation, Residue: P_ext is 0 by construction elsewhere, so including them would
  test the condition, not attention). Layers whose Holm-adjusted p is below α with a positive coefficient are
  named as the layers whose distraction tracks failure. Because P_ext rises with load by construction (its
  chance level is the extraneous share), each layer is also fitted with load (pp) and a Residue indicator as
  covariates (``adjusted``; ``tracking_layers_adjusted``): a layer named there tracks failure beyond what the
  load and placement explain.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm
from statsmodels.stats.multitest import multipletests
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

from probe.analysis.estimates import _exp_or_none, _num

log = logging.getLogger(__name__)

ATTENTION_DIR = "attention"
SUMMARY_FILE = "attention_summary.npz"
MIN_TRIALS_PER_LAYER_FIT = 10
EXTRANEOUS_CONDITIONS = ("Saturation", "Residue")


def attention_path(run_dir: Path, model: str, prompt_id: str) -> Path:
    """Where the attention record of (model, prompt_id) lives in a run folder."""
    return run_dir / ATTENTION_DIR / model / f"{prompt_id}.npz"


def read_attention(path: Path) -> dict | None:
    """The arrays the analysis uses from one attention record, or None when the file is absent.

    This is the one place that knows the record's layout (:class:`probe.attention.result.SegmentAttention`).

    Returns:
        Dict with ``p_ext`` (layer, head), ``enrichment`` (layer, head), ``chance`` (layer,), ``ar_k_mean``
        (layer, target) or None, ``ar_targets`` (target names) and ``seg_mass`` (layer, head, kind) with ``kinds``.
    """
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
    return {
        "p_ext": np.asarray(sa.p_ext, dtype=np.float64),
        "enrichment": np.asarray(sa.enrichment, dtype=np.float64),
        "chance": np.asarray(sa.chance, dtype=np.float64),
        "ar_k_mean": None if sa.ar_k_mean is None else np.asarray(sa.ar_k_mean, dtype=np.float64),
        "ar_targets": names,
        "seg_mass": np.asarray(sa.seg_mass, dtype=np.float64),
        "kinds": list(sa.kinds),
    }


def _key(model: str, condition: str, load: int, what: str) -> str:
    # npz member names must be plain file names: index by position, the JSON side carries the labels
    return f"{model}|{condition}|{load}|{what}".replace("/", "%2F")


def summarise_attention(run_dir: Path, df: pd.DataFrame) -> tuple[list[dict], dict[str, np.ndarray], pd.DataFrame]:
    """Per-cell attention means, and each trial's head-mean P_ext per layer.

    Args:
        run_dir: the run folder.
        df: trial table.

    Returns:
        (cells, arrays, per_trial): ``cells`` is one dict per model × condition × load with ``n_prompts``,
        ``n_layers``, ``n_heads``, ``ar_targets``, ``p_ext_mean`` (grand mean), ``enrichment_mean`` (grand mean)
        and the npz member names of its arrays (``p_ext``, ``enrichment``, ``chance``, ``p_ext_layer``,
        ``ar_k``); ``arrays`` maps those names to arrays; ``per_trial`` has ``trial_id`` and ``p_ext_layer``
        (a list of per-layer head-mean P_ext) for every trial whose prompt has a record.
    """
    prompts = df[["model", "prompt_id", "condition", "load"]].drop_duplicates(["model", "prompt_id"])
    records: dict[tuple[str, str], dict] = {}
    for model, pid in zip(prompts["model"], prompts["prompt_id"]):
        rec = read_attention(attention_path(run_dir, str(model), str(pid)))
        if rec is not None:
            records[(str(model), str(pid))] = rec
    cells: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    if not records:
        return cells, arrays, pd.DataFrame(columns=["trial_id", "p_ext_layer"])
    for (model, cond, load), g in prompts.groupby(["model", "condition", "load"], sort=True):
        recs = [records[(str(model), str(p))] for p in g["prompt_id"] if (str(model), str(p)) in records]
        if not recs:
            continue
        shapes = {r["p_ext"].shape for r in recs}
        if len(shapes) != 1:
            log.warning("%s %s %s: attention records of different shapes %s; cell skipped", model, cond, load, shapes)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices (Control enrichment) stay NaN
            p_ext = np.nanmean(np.stack([r["p_ext"] for r in recs]), axis=0)
            enrichment = np.nanmean(np.stack([r["enrichment"] for r in recs]), axis=0)
            chance = np.nanmean(np.stack([r["chance"] for r in recs]), axis=0)
        cell = {"model": str(model), "condition": str(cond), "load": int(load), "n_prompts": len(recs),
                "n_layers": int(p_ext.shape[0]), "n_heads": int(p_ext.shape[1]),
                "p_ext_mean": _num(np.nanmean(p_ext)) if np.isfinite(p_ext).any() else None,
                "enrichment_mean": _num(np.nanmean(enrichment)) if np.isfinite(enrichment).any() else None,
                "ar_targets": []}
        for what, arr in (("p_ext", p_ext), ("enrichment", enrichment), ("chance", chance)):
            cell[what] = _key(str(model), str(cond), int(load), what)
            arrays[cell[what]] = arr.astype(np.float32)
        ar = [r for r in recs if r["ar_k_mean"] is not None and r["ar_k_mean"].shape[1] > 0]
        if ar:
            names: list[str] = []
            for r in ar:
                names += [t for t in r["ar_targets"] if t not in names]
            names.sort(key=lambda t: (t == "question", t))
            mat = np.full((len(ar), p_ext.shape[0], len(names)), np.nan)
            for i, r in enumerate(ar):
                for j, t in enumerate(r["ar_targets"]):
                    mat[i, :, names.index(t)] = r["ar_k_mean"][:, j]
            cell["ar_targets"] = names
            cell["ar_k"] = _key(str(model), str(cond), int(load), "ar_k")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                arrays[cell["ar_k"]] = np.nanmean(mat, axis=0).astype(np.float32)  # (layer, target)
        cells.append(cell)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        layer_means = {k: np.nanmean(r["p_ext"], axis=1) for k, r in records.items()}  # (layer,)
    keyed = df[["trial_id", "model", "prompt_id"]]
    per_trial = pd.DataFrame({
        "trial_id": keyed["trial_id"],
        "p_ext_layer": [layer_means.get((str(m), str(p))) for m, p in zip(keyed["model"], keyed["prompt_id"])],
    })
    per_trial = per_trial[per_trial["p_ext_layer"].notna()]
    return cells, arrays, per_trial


def _logit(y: np.ndarray, X: np.ndarray, groups: np.ndarray, alpha: float) -> dict:
    """Binomial GLM of ``y`` on ``X`` (constant first, the tested variable second), clustered by ``groups``."""
    out: dict = {"coef": None, "se": None, "ci_low": None, "ci_high": None, "p": None, "odds_ratio_per_10pp": None,
                 "reason": None}
    n_clusters = int(pd.Series(groups).nunique())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = sm.GLM(y, X, family=sm.families.Binomial())
            if n_clusters >= 2:
                res = model.fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(pd.Series(groups))[0]})
            else:
                res = model.fit(cov_type="HC1")
        except (np.linalg.LinAlgError, ValueError) as e:
            out["reason"] = f"logistic fit failed: {e}"
            return out
    bad = [w for w in caught if issubclass(w.category, (PerfectSeparationWarning, ConvergenceWarning))]
    if bad or not math.isfinite(float(res.bse[1])):
        out["reason"] = f"logistic fit not usable: {bad[0].message if bad else 'no finite standard error'}"
        return out
    ci = res.conf_int(alpha=alpha)
    coef = float(res.params[1])
    out.update(coef=_num(coef), se=_num(res.bse[1]), ci_low=_num(ci[1, 0]), ci_high=_num(ci[1, 1]),
               p=_num(res.pvalues[1]), odds_ratio_per_10pp=_exp_or_none(0.1 * coef))
    return out


def _logit_layer(x: np.ndarray, y: np.ndarray, groups: np.ndarray, covariates: np.ndarray, alpha: float) -> dict:
    out: dict = {"n": int(len(x)), "coef": None, "se": None, "ci_low": None, "ci_high": None, "p": None,
                 "odds_ratio_per_10pp": None, "reason": None, "adjusted": None}
    ok = np.isfinite(x)
    x, y, groups, covariates = x[ok], y[ok], groups[ok], covariates[ok]
    out["n"] = int(len(x))
    if len(x) < MIN_TRIALS_PER_LAYER_FIT:
        out["reason"] = f"{len(x)} trials with P_ext; need at least {MIN_TRIALS_PER_LAYER_FIT}"
        return out
    if y.min() == y.max():
        out["reason"] = "no variance in outcome (every trial " + ("wrong" if y[0] else "right") + ")"
        return out
    if np.ptp(x) == 0:
        out["reason"] = "no variance in P_ext"
        return out
    out.update(_logit(y, sm.add_constant(x, has_constant="add"), groups, alpha))
    keep = [j for j in range(covariates.shape[1]) if np.ptp(covariates[:, j]) > 0]
    if keep:
        X = np.column_stack([np.ones(len(x)), x, covariates[:, keep]])
        out["adjusted"] = _logit(y, X, groups, alpha)
    return out


def attention_behaviour(df: pd.DataFrame, per_trial: pd.DataFrame, model: str, alpha: float = 0.05) -> dict:
    """Does head-mean P_ext of a layer predict a wrong answer? One logistic fit per layer (module docstring).

    Args:
        df: trial table.
        per_trial: ``trial_id`` → ``p_ext_layer`` from :func:`summarise_attention`.
        model: model name.
        alpha: test level (Holm-adjusted across layers).

    Returns:
        Dict with ``model``, ``n_trials``, ``conditions``, ``layers`` (one dict per layer: ``layer``, ``n``,
        ``coef`` (log-odds of a wrong answer per unit P_ext), ``se``, ``ci_low``, ``ci_high``, ``p``,
        ``p_holm``, ``odds_ratio_per_10pp``, ``reason``, ``adjusted`` (the same for P_ext with load and
        condition covariates)), ``tracking_layers``, ``tracking_layers_adjusted`` and ``reason``.
    """
    out: dict = {"model": model, "n_trials": 0, "conditions": list(EXTRANEOUS_CONDITIONS), "layers": [],
                 "tracking_layers": [], "tracking_layers_adjusted": [], "reason": None,
                 "method": "per-layer Binomial GLM of wrong answer on head-mean P_ext, clustered by task_id; Holm "
                           "across layers"}
    d = df[(df["model"] == model) & df["is_scored"] & df["condition"].isin(EXTRANEOUS_CONDITIONS)]
    d = d.merge(per_trial, on="trial_id", how="inner")
    out["n_trials"] = int(len(d))
    if d.empty:
        out["reason"] = "no scored Saturation/Residue trial with an attention record"
        return out
    mat = np.stack(d["p_ext_layer"].to_list())  # (trial, layer)
    wrong = (d["em"].to_numpy() < 0.5).astype(float)
    groups = d["task_id"].to_numpy()
    covariates = np.column_stack([d["load"].to_numpy(dtype=float),
                                  (d["condition"] == "Residue").to_numpy(dtype=float)])
    layers = [{"layer": li, **_logit_layer(mat[:, li], wrong, groups, covariates, alpha)}
              for li in range(mat.shape[1])]
    fitted = [r for r in layers if r["p"] is not None]
    if fitted:
        adj = multipletests([r["p"] for r in fitted], alpha=alpha, method="holm")[1]
        for r, pa in zip(fitted, adj):
            r["p_holm"] = _num(pa)
    for r in layers:
        r.setdefault("p_holm", None)
    out["layers"] = layers
    out["tracking_layers"] = [r["layer"] for r in fitted if r["p_holm"] < alpha and r["coef"] > 0]
    adjusted = [r for r in layers if (r.get("adjusted") or {}).get("p") is not None]
    if adjusted:
        adj = multipletests([r["adjusted"]["p"] for r in adjusted], alpha=alpha, method="holm")[1]
        for r, pa in zip(adjusted, adj):
            r["adjusted"]["p_holm"] = _num(pa)
    out["tracking_layers_adjusted"] = [r["layer"] for r in adjusted
                                       if r["adjusted"]["p_holm"] < alpha and r["adjusted"]["coef"] > 0]
    if not fitted:
        reasons = {r["reason"] for r in layers}
        out["reason"] = "no layer could be fitted: " + "; ".join(sorted(str(x) for x in reasons))
    return out
