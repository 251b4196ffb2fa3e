"""``render_report``: a run folder's ``analysis.json`` (+ attention summary) -> ``report.html`` and figures.

The report reads estimates; it recomputes none. Where ``analysis.json`` is missing or was made from another
version of ``trials.jsonl`` (its sha256 differs), the analysis stage is run first. The ICE parts (Table 1, figures,
statistics) appear when the run has ICE trials, the CogniLoad section (:mod:`probe.report.cogniload`) when it has
CogniLoad trials.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from probe.analysis import analyze_run, load_analysis
from probe.analysis.frame import TRIALS_FILE
from probe.analysis.tables import MARK_LEGEND, taxonomy_marks
from probe.errors import ProbeError
from probe.report import cogniload as CL
from probe.report import figures as F
from probe.report.html import esc, fig_png, figure_block, page, table
from probe.report.summary import cogniload_summary, model_summary
from probe.types import CONDITIONS

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
FIGURES_DIR = "figures"


def _fresh_analysis(run_dir: Path) -> dict:
    trials = run_dir / TRIALS_FILE
    if not trials.is_file():
        raise ProbeError(f"{trials}: no trial records; nothing to report")
    sha = hashlib.sha256(trials.read_bytes()).hexdigest()
    try:
        analysis = load_analysis(run_dir)
    except ProbeError:
        log.info("%s: no analysis.json yet; analysing first", run_dir)
        return analyze_run(run_dir)
    if analysis.get("inputs", {}).get("trials_sha256") != sha:
        log.info("%s: trials.jsonl changed since the analysis; analysing again", run_dir)
        return analyze_run(run_dir)
    return analysis


def load_attention_arrays(run_dir: Path, analysis: dict) -> dict[str, np.ndarray]:
    """The per-cell attention arrays named in ``analysis['attention_cells']`` (empty when there are none)."""
    name = analysis.get("attention_summary_file")
    if not name:
        return {}
    path = run_dir / name
    if not path.is_file():
        raise ProbeError(f"{path}: named in analysis.json but missing; run `probe analyze {run_dir}` again")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _em_cell(c: dict | None) -> str:
    if c is None:
        return "—"
    if c["em_mean"] is None:
        return f'<span class="note">n=0 ({c["n_error"]} err, {c["n_skipped"]} skip)</span>'
    sem = "—" if c["em_sem"] is None else f"{c['em_sem']:.3f}"
    extra = []
    if c["truncated_rate"]:
        extra.append(f"trunc {100 * c['truncated_rate']:.0f}%")
    if c["n_error"]:
        extra.append(f"{c['n_error']} err")
    tail = f'<br><span class="note">{", ".join(extra)}</span>' if extra else ""
    return f"{c['em_mean']:.3f} ({sem})<br><span class=\"note\">n={c['n']}</span>{tail}"


def table1_html(analysis: dict) -> str:
    """Table 1: EM mean (SEM) per model (rows, with taxonomy marks) × condition and load (columns)."""
    keys = sorted({(c["condition"], c["load"]) for c in analysis["cells"]},
                  key=lambda k: (CONDITIONS.index(k[0]) if k[0] in CONDITIONS else 99, k[1]))
    by = {(c["model"], c["condition"], c["load"]): c for c in analysis["cells"]}
    marks = taxonomy_marks(analysis)
    header = ["model"] + [esc(c if c == "Control" else f"{c} {ld}%") for c, ld in keys]
    rows = [[esc(f"{m}{marks.get(m, '')}")] + [_em_cell(by.get((m, c, ld))) for c, ld in keys]
            for m in analysis["models"]]
    return table(header, rows) + f'<p class="note">{esc(MARK_LEGEND)}. SEM over trials; n = scored trials.</p>'


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _p(x: float | None) -> str:
    return "—" if x is None else ("&lt;0.001" if x < 0.001 else f"{x:.3f}")


def h_tables_html(analysis: dict) -> str:
    """H1, H2, H3 and taxonomy tables."""
    alpha = analysis["config"]["alpha"]

    def sig(p: float | None) -> str:
        return _p(p) if p is None or p >= alpha else f'<span class="sig">{_p(p)}</span>'

    h1 = table(["model", "condition", "β (EM/pp)", "95% CI", "p", "logit coef", "logit p", "power", "MDE80", "n",
                "questions", "note"],
               [[esc(h["model"]), esc(h["condition"]), _fmt(h["beta"], "+.5f"),
                 "—" if h["ci_low"] is None else f"[{h['ci_low']:+.5f}, {h['ci_high']:+.5f}]", sig(h["p"]),
                 _fmt((h.get("logit") or {}).get("coef"), "+.4f"), _p((h.get("logit") or {}).get("p")),
                 _fmt((h.get("power") or {}).get("power"), ".2f"), _fmt((h.get("power") or {}).get("mde_80"), ".4f"),
                 str(h["n"]), str(h["n_clusters"]), esc(h["reason"] or (h.get("logit") or {}).get("reason") or "")]
                for h in analysis["h1"]], left=2)
    h2 = table(["model", "a vs b", "load", "pairs", "EM a", "EM b", "a only", "b only", "p", "power", "note"],
               [[esc(r["model"]), esc(f"{r['a']} vs {r['b']}"), str(r["load"]), str(r["n_pairs"]),
                 _fmt(r["em_a"], ".3f"), _fmt(r["em_b"], ".3f"), esc(r["n_a_only"]), esc(r["n_b_only"]), sig(r["p"]),
                 _fmt((r.get("power") or {}).get("power"), ".2f"),
                 esc("; ".join(x for x in (r.get("note"), r.get("reason")) if x))]
                for r in analysis["h2"]], left=2)
    h3 = table(["model", "Residue load", "questions", "Pearson r", "95% CI (Fisher z)", "p", "Spearman ρ", "p (ρ)",
                "note"],
               [[esc(r["model"]), "pooled" if r["load"] is None else str(r["load"]), str(r["n_tasks"]),
                 _fmt(r["r"], "+.3f"), "—" if r["ci_low"] is None else f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]",
                 sig(r["p"]), _fmt(r["spearman_rho"], "+.3f"), _p(r["spearman_p"]), esc(r["reason"] or "")]
                for r in analysis["h3"]], left=2)
    tax = table(["model", "label", "Control EM", "trunc./uninterp.", "gates", "reason"],
                [[esc(t["model"]), esc(t["label"]), _fmt(t["control_em"], ".3f"),
                  "—" if t["confound_rate_observed"] is None else f"{100 * t['confound_rate_observed']:.0f}%",
                  esc(f"EM<{t['gates']['brittle_em']}, rate>{t['gates']['confound_rate']}, α={t['gates']['alpha']}"),
                  esc(t["reason"])] for t in analysis["taxonomy"]], left=2)
    return (f"<h3>H1: EM per percentage point of load (Control as load 0)</h3>{h1}"
            f"<h3>H2: paired comparisons (exact McNemar, pairs = question × replication)</h3>{h2}"
            f"<h3>H3: S_sim vs degradation EM(Control) − EM(Residue)</h3>{h3}"
            f"<h3>Taxonomy</h3>{tax}")


def build_figures(analysis: dict, arrays: dict[str, np.ndarray]) -> list[tuple[str, str, object]]:
    """Every figure of a report: (file stem, caption, Figure); absent figures are left out."""
    marks = taxonomy_marks(analysis)
    out: list[tuple[str, str, object]] = []

    def add(stem: str, caption: str, fig: object) -> None:
        if fig is not None:
            out.append((stem, caption, fig))

    add("saturation_curve", "EM vs extraneous load with 95% CIs (clustered by question). Control: line and band; "
        "LongControl: open triangles at the load it is length-matched to.", F.draw_saturation_curve(analysis, marks))
    add("em_by_condition", "EM for every condition × load and model (95% CIs).",
        F.draw_em_by_condition(analysis, marks))
    h1 = [h for h in analysis["h1"] if h["condition"] == "Saturation"]
    add("h1_forest", "H1 slope β (EM per percentage point of load) with 95% CI, per model.",
        F.draw_forest([(f"{F._short(h['model'])}{marks.get(h['model'], '')}", h["beta"], h["ci_low"], h["ci_high"])
                       for h in h1], "β (EM per pp of load)", "H1: load trend under Saturation") if h1 else None)
    add("h3_scatter", "H3: per question S_sim vs degradation, least-squares line, Pearson r with Fisher-z CI.",
        F.draw_h3_scatter(analysis, marks))
    for model in analysis["models"]:
        stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model)
        add(f"enrichment_{stem}", f"{model}: P_ext enrichment (P_ext / chance) per layer × head; red = more attention "
            "on extraneous text than its token share, blue = less, white = chance.",
            F.draw_enrichment_heatmaps(analysis, arrays, model))
        add(f"p_ext_layers_{stem}", f"{model}: head-mean P_ext per layer; dashed = chance level.",
            F.draw_p_ext_layers(analysis, arrays, model))
        add(f"ar_k_{stem}", f"{model}: head-mean attentional residue AR_k per layer and target segment.",
            F.draw_ar_k(analysis, arrays, model))
    add("attention_behaviour", "Per layer: log-odds of a wrong answer per unit of head-mean P_ext (Saturation and "
        "Residue trials), 95% CI clustered by question; orange = significant after Holm adjustment.",
        F.draw_attention_behaviour(analysis))
    for stem, caption, fig in CL.cogniload_figures(analysis):
        add(stem, caption, fig)
    return out


def render_report(run_dir: str | Path) -> Path:
    """Write ``report.html`` (self-contained) and ``figures/*.png`` for a run folder.

    Args:
        run_dir: the run folder; it is analysed first when ``analysis.json`` is missing or stale.

    Returns:
        Path of ``report.html``.
    """
    run_dir = Path(run_dir)
    analysis = _fresh_analysis(run_dir)
    arrays = load_attention_arrays(run_dir, analysis)
    fig_dir = run_dir / FIGURES_DIR
    fig_dir.mkdir(parents=True, exist_ok=True)
    blocks: list[str] = []
    cl_blocks: dict[str, str] = {}
    for stem, caption, fig in build_figures(analysis, arrays):
        png = fig_png(fig)
        (fig_dir / f"{stem}.png").write_bytes(png)
        if stem.startswith("cogniload_"):
            cl_blocks[stem] = figure_block(png, caption, stem)
        else:
            blocks.append(figure_block(png, caption, stem))
    has_ice = bool(analysis["cells"])
    summary = "".join(
        f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"
        for m in analysis["models"] if (sentences := model_summary(analysis, m)))
    cogniload = ""
    if analysis.get("cogniload"):
        cl_summary = "".join(
            f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"
            for m in analysis["models"] if (sentences := cogniload_summary(analysis, m)))
        cogniload = CL.section_html(analysis, cl_blocks, cl_summary)
    imp = analysis.get("import")
    imp_html = ""
    if imp:
        imp_html = (f"<p>Imported from <code>{esc(imp['file'])}</code> ({imp['n_rows']} rows, sha256 "
                    f"{esc(imp['sha256'][:12])}…): {imp['n_error']} backend errors and {imp['n_skipped']} empty outputs "
                    f"are not scored; {imp['n_truncated']} outputs recognised as truncated "
                    f"(rule: {esc(imp['truncation_rule'])}).</p>")
    notes = "".join(f"<li>{esc(n)}</li>" for n in analysis.get("notes", []))
    methods = "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in analysis.get("methods", {}).items())
    body = (f"<h1>ICE-Probe report: {esc(run_dir.name)}</h1>"
            f"<p class=\"note\">{analysis['n_trials']} trials ({analysis['n_scored']} scored, {analysis['n_error']} "
            f"errors, {analysis['n_skipped']} skipped) from <code>{esc(analysis['inputs']['trials'])}</code>, sha256 "
            f"{esc(analysis['inputs']['trials_sha256'][:12])}…; analysed {esc(analysis['created'])}.</p>{imp_html}"
            + (f"<h2>Summary</h2>{summary}" if summary else "")
            + (f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(analysis)}"
               f"<h2>Figures</h2>{''.join(blocks)}"
               f"<h2>Statistics</h2>{h_tables_html(analysis)}" if has_ice else "")
            + cogniload
            + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
            + f"<h2>Methods</h2><ul>{methods}</ul>")
    out = run_dir / REPORT_FILE
    out.write_text(page(f"ICE-Probe report: {run_dir.name}", body), encoding="utf-8")
    log.info("%s: report with %d figures", out, len(blocks) + len(cl_blocks))
    return out
