"""``analyze_run``: trial (and attention) records of a run folder -> ``analysis.json`` plus tables.

Reads ``trials.jsonl`` (and ``prompts.jsonl``, ``attention/`` where present) and never touches a generation
model. Writes into the run folder:

- ``analysis.json``: every estimate (cells, H1, H2, H3, power, attention ↔ behaviour, taxonomy) with the gates
  and the sha256 of the trial file it came from;
- ``attention_summary.npz``: per-cell mean attention arrays (when attention records exist), named in
  ``analysis.json`` under ``attention_cells``;
- ``analysis.md`` and ``tables/*.csv``.
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

from probe.analysis.attention_link import SUMMARY_FILE, attention_behaviour, summarise_attention
from probe.analysis.estimates import cell_summaries
from probe.analysis.frame import TRIALS_FILE, fill_s_sim, load_run_frame
from probe.analysis.hypotheses import fit_load_trend, h2_comparisons, similarity_degradation
from probe.analysis.tables import render_main_table, write_tables
from probe.analysis.taxonomy import classify_model
from probe.config import AnalysisSection, config_from_dict
from probe.errors import ConfigError, ProbeError

log = logging.getLogger(__name__)

ANALYSIS_FILE = "analysis.json"
MANIFEST_FILE = "manifest.json"
H1_CONDITIONS = ("Saturation", "Residue", "LongControl")


def _run_config(run_dir: Path) -> tuple[AnalysisSection, str | None]:
    path = run_dir / "config.toml"
    if not path.is_file():
        return AnalysisSection(), None
    try:
        cfg = config_from_dict(tomllib.loads(path.read_text(encoding="utf-8")), str(path))
    except (ConfigError, tomllib.TOMLDecodeError) as e:
        return AnalysisSection(), f"{path} could not be read ({e}); default analysis gates used"
    return cfg.analysis, None


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
        cfg: the analysis gates; None reads ``[analysis]`` of the run's ``config.toml`` (defaults if absent).
        fill_similarity: compute S_sim from ``prompts.jsonl`` with ``cfg.embedder`` for Saturation/Residue
            trials that lack it (needed for H3).

    Returns:
        The analysis dict (as written to ``analysis.json``).

    Raises:
        ProbeError: the folder holds no trial records.
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    if cfg is None:
        cfg, note = _run_config(run_dir)
        if note:
            notes.append(note)
    df, prompts = load_run_frame(run_dir)
    if fill_similarity:
        df, note = fill_s_sim(df, prompts, cfg.embedder)
        if note:
            notes.append(note)
    models = sorted(df["model"].unique().tolist())
    seed = 0
    h1 = [fit_load_trend(df, m, c, cfg.alpha) for m in models for c in H1_CONDITIONS
          if (df[df["model"] == m]["condition"] == c).any()]
    h2 = [row for m in models for row in h2_comparisons(df, m, cfg.alpha, cfg.n_bootstrap, seed)]
    h3 = [row for m in models for row in similarity_degradation(df, m, cfg.alpha)
          if (df[df["model"] == m]["condition"] == "Residue").any()]
    att_cells, att_arrays, per_trial = summarise_attention(run_dir, df)
    attention = [attention_behaviour(df, per_trial, m, cfg.alpha) for m in models] if att_cells else []
    if att_arrays:
        np.savez_compressed(run_dir / SUMMARY_FILE, **att_arrays)
    elif (run_dir / "attention").is_dir():
        notes.append("attention/ holds no record matching a trial (model, prompt_id)")
    sat = {h["model"]: h for h in h1 if h["condition"] == "Saturation"}
    taxonomy = [classify_model(df, m, sat.get(m), cfg) for m in models]
    trials_path = run_dir / TRIALS_FILE
    analysis = {
        "run_dir": str(run_dir),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {"trials": str(trials_path), "trials_sha256": hashlib.sha256(trials_path.read_bytes()).hexdigest(),
                   "n_prompts": len(prompts)},
        "config": dataclasses.asdict(cfg),
        "n_trials": int(len(df)),
        "n_scored": int(df["is_scored"].sum()),
        "n_error": int(df["error"].notna().sum()),
        "n_skipped": int(df["skipped"].sum()),
        "models": models,
        "cells": cell_summaries(df, cfg.alpha),
        "h1": h1,
        "h2": h2,
        "h3": h3,
        "attention_cells": att_cells,
        "attention_summary_file": SUMMARY_FILE if att_arrays else None,
        "attention_behaviour": attention,
        "taxonomy": taxonomy,
        "notes": notes,
        "methods": METHODS,
        "import": _import_summary(run_dir),
    }
    analysis = _clean(analysis)
    (run_dir / ANALYSIS_FILE).write_text(json.dumps(analysis, indent=1, allow_nan=False), encoding="utf-8")
    write_tables(analysis, run_dir)
    log.info("%s: analysis of %d trials, %d models written", run_dir, len(df), len(models))
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
        The text of :func:`probe.analysis.tables.render_main_table` (cells only: no H1 or taxonomy lines).
    """
    df, _ = load_run_frame(Path(run_dir))
    return render_main_table({"cells": cell_summaries(df, alpha)})


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
}
