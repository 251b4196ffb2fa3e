"""``compare_runs``: several analysed runs (or several models) side by side in one self-contained page.

Each run's ``analysis.json`` is read (analysing first where missing or stale); models are named
``<run>: <model>`` and the per-run tables and figures are drawn on the merged list. Nothing is re-estimated.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from probe.analysis.tables import MARK_LEGEND, taxonomy_marks
from probe.errors import ProbeError
from probe.report import figures as F
from probe.report.html import esc, fig_png, figure_block, page
from probe.report.render import FIGURES_DIR, REPORT_FILE, _fresh_analysis, h_tables_html, table1_html
from probe.report.summary import model_summary

log = logging.getLogger(__name__)

_PER_MODEL_LISTS = ("cells", "h1", "h2", "h3", "taxonomy", "attention_behaviour")


def merge_analyses(named: list[tuple[str, dict]]) -> dict:
    """One analysis dict holding several runs' estimates, each model renamed ``<run>: <model>``.

    Args:
        named: (run label, analysis dict) pairs.

    Returns:
        A dict with the per-model lists of an analysis (``cells``, ``h1``, ``h2``, ``h3``, ``taxonomy``,
        ``attention_behaviour``), ``models`` and the first run's ``config``.

    Raises:
        ProbeError: the runs were analysed with different α (their significance marks would not compare).
    """
    alphas = {a["config"]["alpha"] for _, a in named}
    if len(alphas) > 1:
        raise ProbeError(f"runs analysed with different alpha {sorted(alphas)}; re-analyse them with one alpha")
    merged: dict = {k: [] for k in _PER_MODEL_LISTS}
    merged.update(models=[], config=named[0][1]["config"], attention_cells=[])
    for label, analysis in named:
        rename = {m: f"{label}: {m}" for m in analysis["models"]}
        merged["models"] += [rename[m] for m in analysis["models"]]
        for key in _PER_MODEL_LISTS:
            for row in analysis.get(key, []):
                row = copy.deepcopy(row)
                row["model"] = rename[row["model"]]
                merged[key].append(row)
    return merged


def compare_runs(run_dirs: list[Path], out: Path) -> Path:
    """Write ``out/report.html`` and ``out/figures/*.png`` comparing several run folders.

    Args:
        run_dirs: run folders (each analysed first where needed).
        out: output folder.

    Returns:
        Path of the comparison page.

    Raises:
        ProbeError: no run folder given.
    """
    if not run_dirs:
        raise ProbeError("compare: give at least one run folder")
    labels: list[str] = []
    for d in run_dirs:
        label = Path(d).name
        labels.append(label if label not in labels else f"{label}#{len(labels)}")
    named = [(lab, _fresh_analysis(Path(d))) for lab, d in zip(labels, run_dirs)]
    merged = merge_analyses(named)
    marks = taxonomy_marks(merged)
    out = Path(out)
    (out / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    figs = [
        ("saturation_curve", "EM vs load per model and run, 95% CIs.", F.draw_saturation_curve(merged, marks)),
        ("em_by_condition", "EM per condition × load, all models and runs.", F.draw_em_by_condition(merged, marks)),
        ("h1_forest", "H1 slope β per model and run (Saturation; Control as load 0), 95% CI.",
         F.draw_forest([(f"{m}{marks.get(m, '')}", h["beta"], h["ci_low"], h["ci_high"])
                        for m in merged["models"] for h in merged["h1"]
                        if h["model"] == m and h["condition"] == "Saturation"],
                       "β (EM per pp of load)", "H1 across runs")),
        ("h3_forest", "H3 Pearson r (pooled over loads) per model and run, Fisher-z 95% CI.",
         F.draw_forest([(m, h["r"], h["ci_low"], h["ci_high"]) for m in merged["models"] for h in merged["h3"]
                        if h["model"] == m and h["load"] is None], "Pearson r (S_sim vs degradation)",
                       "H3 across runs")),
    ]
    blocks: list[str] = []
    for stem, caption, fig in figs:
        if fig is None:
            continue
        png = fig_png(fig)
        (out / FIGURES_DIR / f"{stem}.png").write_bytes(png)
        blocks.append(figure_block(png, caption, stem))
    runs = "".join(f"<li><b>{esc(lab)}</b>: <code>{esc(d)}</code>, {a['n_trials']} trials, trials sha256 "
                   f"{esc(a['inputs']['trials_sha256'][:12])}…</li>" for (lab, a), d in zip(named, run_dirs))
    summary = "".join(
        f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>" for s in model_summary(merged, m)) + "</ul>"
        for m in merged["models"])
    body = (f"<h1>ICE-Probe comparison of {len(run_dirs)} run(s)</h1><ul>{runs}</ul>"
            f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(merged)}"
            f"<p class=\"note\">{esc(MARK_LEGEND)}</p>"
            f"<h2>Figures</h2>{''.join(blocks)}<h2>Summary</h2>{summary}"
            f"<h2>Statistics</h2>{h_tables_html(merged)}")
    path = out / REPORT_FILE
    path.write_text(page("ICE-Probe comparison", body), encoding="utf-8")
    log.info("%s: comparison of %d runs", path, len(run_dirs))
    return path
