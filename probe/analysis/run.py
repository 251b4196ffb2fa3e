"""``analyze_run``: trial (and attention) records of a run folder -> ``analysis.json`` plus tables.

Reads ``trials.jsonl`` (and ``prompts.jsonl``, ``attention/`` where present) and never touches a generation
model. Writes into the run folder:

- ``analysis.json``: every estimate (cells, H1, H2, H3, power, attention ↔ behaviour, taxonomy) with the gates
  and the sha256 of the trial file it came from;
- ``attention_summary.npz``: per-cell mean attention arrays (when attention records exist), named in
  ``analysis.json`` under ``attention_cells``;
- ``analysis.md`` and ``tables/*.csv``.

CogniLoad trials (family ``cogniload``, recorded on each trial) have no ICE condition or load: the ICE estimates
(cells, H1-H3, attention cells, taxonomy) leave them out, and a ``cogniload`` section holds theirs instead: the
GLM and thresholds of :func:`probe.analysis.cogniload.analyze_cogniload`, accuracy cells per model (overall and
per level of d, N and rho, with the same clustered CIs as the ICE cells) and the needle/hay attention enrichment of
:func:`probe.analysis.cogniload_attention.cogniload_attention`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from probe.analysis.attention_link import SUMMARY_FILE, attention_behaviour, summarise_attention
from probe.analysis.cogniload import FAMILY as COGNILOAD_FAMILY
from probe.analysis.cogniload import analyze_cogniload
from probe.analysis.cogniload_attention import cogniload_attention
from probe.analysis.estimates import cell_summaries
from probe.analysis.frame import TRIALS_FILE, fill_s_sim, load_run_frame
from probe.analysis.hypotheses import fit_load_trend, h2_comparisons, similarity_degradation
from probe.analysis.tables import render_main_table, write_tables
from probe.analysis.taxonomy import classify_model
from probe.config import AnalysisSection, config_from_dict
from probe.errors import ConfigError, ProbeError
from probe.records import load_trials

log = logging.getLogger(__name__)

ANALYSIS_FILE = "analysis.json"
MANIFEST_FILE = "manifest.json"
H1_CONDITIONS = ("Saturation", "Residue", "LongControl")
COGNILOAD_KNOBS = ("d", "N", "rho")
DEFAULT_SEED = 0


def _run_config(run_dir: Path) -> tuple[AnalysisSection, int, str | None]:
    """The run's analysis gates and experiment seed; defaults (and why, when config.toml is unreadable) otherwise."""
    path = run_dir / "config.toml"
    if not path.is_file():
        return AnalysisSection(), DEFAULT_SEED, None
    try:
        cfg = config_from_dict(tomllib.loads(path.read_text(encoding="utf-8")), str(path))
    except (ConfigError, tomllib.TOMLDecodeError) as e:
        return AnalysisSection(), DEFAULT_SEED, f"{path} could not be read ({e})"
    return cfg.analysis, cfg.experiment.seed, None


def is_cogniload(df: pd.DataFrame) -> pd.Series:
    """Rows of a trial table whose trials belong to the CogniLoad family (the ``family`` each record carries)."""
    return df["family"] == COGNILOAD_FAMILY


def cogniload_cells(df: pd.DataFrame, meta: dict[str, dict], alpha: float = 0.05) -> dict[str, dict]:
    """Accuracy of each model's CogniLoad trials, overall and per level of d, N and rho.

    Each cell is a :func:`probe.analysis.estimates.cell_summaries` row (EM mean, SEM, CI clustered by puzzle,
    truncation and uninterpretable rates, errors, skipped) over the trials at that level, pooled over the other
    knobs; ``load`` is None for the overall cell and ``level`` names the knob's value in the others. Where every
    puzzle of a cell was answered once (the usual case) the CI is the Wilson interval (see ``_binomial_ci``).

    Args:
        df: trial table of CogniLoad trials.
        meta: ``trial_id`` -> the trial's ``meta`` (``d``, ``N``, ``rho``).
        alpha: 1 − confidence level.

    Returns:
        ``{model: {"overall": cell, "d": [cell per level], "N": [...], "rho": [...]}}``.
    """
    out: dict[str, dict] = {}
    if df.empty:
        return out
    knobs = {k: df["trial_id"].map(lambda tid, k=k: (meta.get(tid) or {}).get(k)) for k in COGNILOAD_KNOBS}
    for model in sorted(df["model"].unique().tolist()):
        rows = df["model"] == model
        overall = cell_summaries(df[rows].assign(load=0), alpha)[0]
        entry: dict = {"overall": _binomial_ci({**overall, "load": None}, alpha)}
        for k in COGNILOAD_KNOBS:
            known = rows & knobs[k].notna()
            cells = cell_summaries(df[known].assign(load=knobs[k][known].astype(int)), alpha)
            entry[k] = [_binomial_ci({**c, "level": c["load"], "load": None}, alpha) for c in cells]
        out[model] = entry
    return out


def _binomial_ci(cell: dict, alpha: float) -> dict:
    """A cell whose puzzles were each answered once gets the Wilson interval of its proportion.

    With one trial per cluster the clustered CI is the iid t-interval of a 0/1 mean, which leaves [0, 1] at
    small n; the Wilson score interval (statsmodels ``proportion_confint``) is the binomial interval for that case.
    """
    n = cell["n"]
    if n >= 1 and cell["n_clusters"] == n and cell["em_mean"] is not None:
        lo, hi = proportion_confint(int(round(cell["em_mean"] * n)), n, alpha=alpha, method="wilson")
        cell.update(em_ci_low=float(lo), em_ci_high=float(hi),
                    ci_method="wilson (each puzzle answered once: binomial proportion)")
    return cell


def _trial_meta(run_dir: Path, ids: set[str]) -> tuple[list, dict[str, dict]]:
    """The CogniLoad trial records of a run folder (by ``trial_id`` in ``ids``) and their ``meta``."""
    trials = [t for t in load_trials(run_dir / TRIALS_FILE) if t.trial_id in ids]
    return trials, {t.trial_id: dict(t.meta or {}) for t in trials}


def _clean(x: object) -> object:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def analyze_run(run_dir: str | Path, cfg: AnalysisSection | None = None, *, fill_similarity: bool = True) -> dict:
    """Analyse a run folder and write ``analysis.json``, ``analysis.md`` and ``tables/*.csv`` into it.

    Args:
        run_dir: the run folder (``outputs/<name>``) holding ``trials.jsonl``.
        cfg: the analysis gates; None reads ``[analysis]`` of the run's ``config.toml`` (defaults if absent). The
            CogniLoad bootstrap always takes its seed from ``[experiment]`` of ``config.toml`` (0 if absent).
        fill_similarity: compute S_sim from ``prompts.jsonl`` with ``cfg.embedder`` for Saturation/Residue
            trials that lack it (needed for H3).

    Returns:
        The analysis dict (as written to ``analysis.json``).

    Raises:
        ProbeError: the folder holds no trial records.
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    run_cfg, run_seed, note = _run_config(run_dir)
    if note:
        notes.append(f"{note}; " + ("default analysis gates and " if cfg is None else "") + f"seed {run_seed} used")
    cfg = run_cfg if cfg is None else cfg
    df_all, prompts = load_run_frame(run_dir)
    cl_rows = is_cogniload(df_all)
    df = df_all[~cl_rows]  # the ICE estimates see ICE trials only
    if fill_similarity:
        df, note = fill_s_sim(df, prompts, cfg.embedder)
        if note:
            notes.append(note)
    models = sorted(df_all["model"].unique().tolist())
    ice_models = sorted(df["model"].unique().tolist())
    seed = 0
    h1 = [fit_load_trend(df, m, c, cfg.alpha) for m in ice_models for c in H1_CONDITIONS
          if (df[df["model"] == m]["condition"] == c).any()]
    h2 = [row for m in ice_models for row in h2_comparisons(df, m, cfg.alpha, cfg.n_bootstrap, seed)]
    h3 = [row for m in ice_models for row in similarity_degradation(df, m, cfg.alpha)
          if (df[df["model"] == m]["condition"] == "Residue").any()]
    att_cells, att_arrays, per_trial = summarise_attention(run_dir, df)
    attention = [attention_behaviour(df, per_trial, m, cfg.alpha) for m in ice_models] if att_cells else []
    cogniload = None
    if cl_rows.any():
        cl_trials, meta = _trial_meta(run_dir, set(df_all.loc[cl_rows, "trial_id"]))
        cogniload = analyze_cogniload(cl_trials, cfg.n_bootstrap, run_seed)
        cogniload["cells"] = cogniload_cells(df_all[cl_rows], meta, cfg.alpha)
        cogniload["attention"] = cogniload_attention(run_dir, cl_trials, cfg.alpha)
    if att_arrays:
        np.savez_compressed(run_dir / SUMMARY_FILE, **att_arrays)
    elif (run_dir / "attention").is_dir() and not (cogniload or {}).get("attention"):
        notes.append("attention/ holds no record matching a trial (model, prompt_id)")
    sat = {h["model"]: h for h in h1 if h["condition"] == "Saturation"}
    taxonomy = [classify_model(df, m, sat.get(m), cfg) for m in ice_models]
    trials_path = run_dir / TRIALS_FILE
    analysis = {
        "run_dir": str(run_dir),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {"trials": str(trials_path), "trials_sha256": hashlib.sha256(trials_path.read_bytes()).hexdigest(),
                   "n_prompts": len(prompts)},
        "config": dataclasses.asdict(cfg),
        "n_trials": int(len(df_all)),
        "n_scored": int(df_all["is_scored"].sum()),
        "n_error": int(df_all["error"].notna().sum()),
        "n_skipped": int(df_all["skipped"].sum()),
        "n_cogniload": int(cl_rows.sum()),
        "models": models,
        "cells": cell_summaries(df, cfg.alpha),
        "h1": h1,
        "h2": h2,
        "h3": h3,
        "attention_cells": att_cells,
        "attention_summary_file": SUMMARY_FILE if att_arrays else None,
        "attention_behaviour": attention,
        "taxonomy": taxonomy,
        "cogniload": cogniload,
        "notes": notes,
        "methods": METHODS,
        "import": _import_summary(run_dir),
    }
    analysis = _clean(analysis)
    (run_dir / ANALYSIS_FILE).write_text(json.dumps(analysis, indent=1, allow_nan=False), encoding="utf-8")
    write_tables(analysis, run_dir)
    log.info("%s: analysis of %d trials, %d models written", run_dir, len(df_all), len(models))
    return analysis


def _import_summary(run_dir: Path) -> dict | None:
    """The import summary of a run folder made from another tool's file (None for the toolkit's own runs)."""
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return manifest.get("imported_from") if isinstance(manifest, dict) else None


def main_table(run_dir: str | Path, alpha: float = 0.05) -> str:
    """The EM table of a run folder as text, computed from its trials without writing anything.

    Args:
        run_dir: the run folder.
        alpha: 1 − confidence level.

    Returns:
        The text of :func:`probe.analysis.tables.render_main_table` (cells only, CogniLoad accuracy included: no
        H1, taxonomy or threshold lines).
    """
    run_dir = Path(run_dir)
    df, _ = load_run_frame(run_dir)
    cl_rows = is_cogniload(df)
    analysis: dict = {"cells": cell_summaries(df[~cl_rows], alpha)}
    if cl_rows.any():
        _, meta = _trial_meta(run_dir, set(df.loc[cl_rows, "trial_id"]))
        analysis["cogniload"] = {"cells": cogniload_cells(df[cl_rows], meta, alpha)}
    return render_main_table(analysis)


def load_analysis(run_dir: str | Path) -> dict:
    """Read ``analysis.json`` of a run folder.

    Raises:
        ProbeError: the run has not been analysed.
    """
    path = Path(run_dir) / ANALYSIS_FILE
    if not path.is_file():
        raise ProbeError(f"{path}: not found; run `probe analyze {run_dir}` first")
    return json.loads(path.read_text(encoding="utf-8"))


METHODS = {
    "cells": "EM mean; SEM = scipy.stats.sem over scored trials; 95% CI = OLS of EM on a constant, SE clustered by "
             "task_id (t, G-1 df); one question -> iid; no variance -> Wilson interval",
    "h1": "OLS EM ~ load (pp), Control trials as load 0, SE clustered by task_id (t, G-1 df); Binomial GLM (logit) "
          "with the same clustering as robustness",
    "h2": "exact McNemar on pairs (task_id, replication), equal load where both conditions carry one",
    "h3": "per question degradation = mean EM(Control) - mean EM(Residue); Pearson r with mean S_sim of its Residue "
          "trials, Fisher-z CI (scipy pearsonr.confidence_interval), Spearman rho",
    "power": "H1: observed power of the Wald test at the fitted beta (statsmodels NormalIndPower, noncentrality "
             "|b|/SE) and the beta detectable with 80% power; H2: simulation, multinomial redraw of pairs at the "
             "observed discordant shares, exact McNemar, share with p < alpha",
    "attention": "per layer Binomial GLM of wrong answer on head-mean P_ext (Saturation, Residue trials), clustered "
                 "by task_id; Holm across layers",
    "errors": "skipped trials and backend errors are counted, never scored as wrong",
    "cogniload": "CogniLoad trials are kept out of every ICE estimate; per model binomial GLM (logit) of correct "
                 "on d, log10 N, rho, rho^2 (AIC against the fit without rho^2; d x N and d x rho interactions), "
                 "SE clustered by puzzle when a puzzle was answered more than once; ECL50/NT50/ID50 where the fitted "
                 "P(correct) crosses 0.5 with the other variables at their means, percentile bootstrap CIs over "
                 "puzzles; accuracy per knob level with Wilson CIs (CIs clustered by puzzle where puzzles repeat)",
    "cogniload_attention": "needle (germane statements) and hay (extraneous statements) enrichment per layer: "
                           "per-token attention share of the group from the probe's query set over the per-token "
                           "chance share (the record's P_ext chance scaled to the group's tokens), head mean per "
                           "prompt, mean over prompts with a 95% t-interval; means per level of rho, N and d",
}
