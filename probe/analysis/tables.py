"""Tables of an analysis: CSV files, a Markdown summary and the plain-text main table the CLI prints.

All of them are views of the ``analysis.json`` dict; nothing here computes an estimate.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _p(x: float | None) -> str:
    if x is None:
        return "—"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _cell_row(c: dict, marks: dict[str, str]) -> list[str]:
    em = "—" if c["em_mean"] is None else f"{c['em_mean']:.3f} ({_fmt(c['em_sem'])})"
    ci = "—" if c["em_ci_low"] is None else f"[{c['em_ci_low']:.3f}, {c['em_ci_high']:.3f}]"
    return [
        f"{c['model']}{marks.get(c['model'], '')}", c["condition"], "all" if c["load"] is None else str(c["load"]),
        str(c["n"]), em, ci,
        _fmt(c["hop_recall_mean"], ".2f"), _pct(c["truncated_rate"]), _pct(c["uninterpretable_rate"]),
        str(c["n_error"]), str(c["n_skipped"]),
    ]


MAIN_HEADER = ["model", "condition", "load", "n", "EM mean (SEM)", "95% CI (clustered)", "hop recall",
               "truncated", "uninterp.", "errors", "skipped"]

TAXONOMY_MARKS = {"intrinsic-load brittle": " †", "confounded": " ‡", "unscorable": " ∅"}


def taxonomy_marks(analysis: dict) -> dict[str, str]:
    """Mark appended to a model's name in tables: † brittle, ‡ confounded, ∅ unscorable, * load-sensitive."""
    marks: dict[str, str] = {}
    for t in analysis.get("taxonomy", []):
        label = t["label"] or ""
        marks[t["model"]] = TAXONOMY_MARKS.get(label, " *" if t.get("is_load_sensitive") else "")
    return marks


MARK_LEGEND = ("† intrinsic-load brittle (Control EM below gate), ‡ confounded (truncated/uninterpretable "
               "outputs above gate), ∅ unscorable (no scored Control trial), * resilient and load-sensitive")


def cogniload_overall_cells(analysis: dict) -> list[dict]:
    """Each model's pooled CogniLoad accuracy cell (condition ``CogniLoad``, load None), for the main table."""
    cells = (analysis.get("cogniload") or {}).get("cells") or {}
    return [cells[m]["overall"] for m in sorted(cells)]


KNOB_LABELS = {"d": "d", "N": "N", "rho": "ρ"}


def _level_list(cells: list[dict], knob: str) -> str:
    parts = []
    for c in cells:
        unit = "%" if knob == "rho" else ""
        ci = "" if c["em_ci_low"] is None else f" [{c['em_ci_low']:.2f}, {c['em_ci_high']:.2f}]"
        parts.append(f"{KNOB_LABELS[knob]}={c['level']}{unit}: {_fmt(c['em_mean'], '.2f')}{ci} (n={c['n']})")
    return "; ".join(parts)


def threshold_text(th: dict, name: str) -> str:
    """One threshold of :func:`probe.analysis.cogniload.analyze_cogniload` as text: value [CI] or why there is none."""
    if th["value"] is None:
        return f"{name} — ({th['status']}: {th['reason']})"
    ci = "" if th["ci_low"] is None else f" [{th['ci_low']:.3g}, {th['ci_high']:.3g}]"
    note = f" ({th['ci_note']})" if th.get("ci_note") else ""
    return f"{name} = {th['value']:.3g} {th['unit']}{ci}{note}"


def cogniload_lines(analysis: dict) -> list[str]:
    """Plain-text CogniLoad lines per model: accuracy per knob level, thresholds, Δρ and the AIC comparison."""
    cl = analysis.get("cogniload") or {}
    cells = cl.get("cells") or {}
    lines: list[str] = []
    for model in sorted(cells):
        for knob in ("d", "N", "rho"):
            if cells[model].get(knob):
                lines.append(f"CogniLoad {model}: accuracy by {KNOB_LABELS[knob]} — "
                             f"{_level_list(cells[model][knob], knob)}")
        s = (cl.get("models") or {}).get(model)
        if not s:
            continue
        lines.append(f"CogniLoad {model}: " + "; ".join(threshold_text(s["thresholds"][k], k)
                                                       for k in ("ECL50", "NT50", "ID50")))
        dr = s["delta_rho"]
        ci = "" if dr["ci_low"] is None else f" [{dr['ci_low']:+.2f}, {dr['ci_high']:+.2f}]"
        aic = ("AIC: no comparison (" + "; ".join(f"{k} fit {s['fits'][k]['status']}"
                                                  for k in ("quadratic", "linear")) + ")"
               if s["delta_aic"] is None else
               f"AIC(linear) − AIC(quadratic) = {s['delta_aic']:+.2f}, {s['aic_preferred']} preferred")
        lines.append(f"CogniLoad {model}: Δρ = Acc(ρ={dr['low_rho']}%) − Acc(ρ={dr['high_rho']}%) = "
                     f"{_fmt(dr['value'], '+.3f')}{ci}; {aic}")
    return lines


def render_main_table(analysis: dict) -> str:
    """The main table (EM per model × condition × load) as aligned plain text, with the taxonomy below it.

    CogniLoad trials appear as one pooled row per model (condition ``CogniLoad``, load ``all``), followed below the
    table by their accuracy per level of d, N and rho and, when the analysis holds them, the thresholds.

    Args:
        analysis: the dict of ``analysis.json``.

    Returns:
        Multi-line text.
    """
    marks = taxonomy_marks(analysis)
    rows = [MAIN_HEADER] + [_cell_row(c, marks) for c in analysis["cells"]]
    rows += [_cell_row(c, {}) for c in cogniload_overall_cells(analysis)]  # the taxonomy marks are ICE results
    widths = [max(len(r[i]) for r in rows) for i in range(len(MAIN_HEADER))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for t in analysis.get("taxonomy", []):
        lines.append(f"{t['model']}: {t['label']} — {t['reason']}")
    for h in analysis.get("h1", []):
        if h["condition"] != "Saturation":
            continue
        if h["beta"] is None:
            lines.append(f"H1 {h['model']}: no estimate ({h['reason']})")
        else:
            lines.append(f"H1 {h['model']}: β = {h['beta']:+.5f} EM/pp [{h['ci_low']:+.5f}, {h['ci_high']:+.5f}], "
                         f"p = {_p(h['p'])}, n = {h['n']}")
    lines += cogniload_lines(analysis)
    if analysis["cells"]:  # the marks are the ICE taxonomy's
        lines.append(MARK_LEGEND)
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _import_lines(imp: dict | None) -> list[str]:
    if not imp:
        return []
    return [f"Imported from `{imp['file']}` ({imp['n_rows']} rows; mapping "
            + ", ".join(f"{k}={v}" for k, v in imp["mapping"].items())
            + (f", preset {imp['preset']}" if imp.get("preset") else "") + "). "
            f"{imp['n_error']} backend errors and {imp['n_skipped']} empty outputs are not scored; "
            f"{imp['n_truncated']} outputs recognised as truncated (rule: {imp['truncation_rule']}).", ""]


def render_markdown(analysis: dict) -> str:
    """A Markdown summary: main table, H1, H2, H3, attention and taxonomy tables."""
    marks = taxonomy_marks(analysis)
    parts = [f"# Analysis of {analysis['run_dir']}", "",
             f"{analysis['n_trials']} trials from `{analysis['inputs']['trials']}` "
             f"(sha256 {analysis['inputs']['trials_sha256'][:12]}…).", "",
             *_import_lines(analysis.get("import")),
             "## EM per model × condition × load", "",
             _md_table(MAIN_HEADER, [_cell_row(c, marks) for c in analysis["cells"]]
                       + [_cell_row(c, {}) for c in cogniload_overall_cells(analysis)]),
             "", MARK_LEGEND if analysis["cells"] else "", ""]
    if analysis["cells"]:
        parts += _ice_markdown(analysis)
    parts += _cogniload_markdown(analysis)
    if analysis.get("notes"):
        parts += ["## Notes", ""] + [f"- {n}" for n in analysis["notes"]] + [""]
    return "\n".join(parts)


def _ice_markdown(analysis: dict) -> list[str]:
    """H1, H2, H3, attention and taxonomy tables of ``analysis.md`` (only when the run has ICE trials)."""
    parts: list[str] = []
    parts += ["## H1: EM per percentage point of load (Control = load 0)", "",
              _md_table(["model", "condition", "β (EM/pp)", "95% CI", "p", "logit coef", "logit p", "power",
                         "n", "G", "note"],
                        [[h["model"], h["condition"], _fmt(h["beta"], "+.5f"),
                          "—" if h["ci_low"] is None else f"[{h['ci_low']:+.5f}, {h['ci_high']:+.5f}]",
                          _p(h["p"]), _fmt((h.get("logit") or {}).get("coef"), "+.4f"),
                          _p((h.get("logit") or {}).get("p")), _fmt((h.get("power") or {}).get("power"), ".2f"),
                          str(h["n"]), str(h["n_clusters"]),
                          h["reason"] or (h.get("logit") or {}).get("reason") or ""]
                         for h in analysis["h1"]]), ""]
    parts += ["## H2: paired comparisons (exact McNemar)", "",
              _md_table(["model", "comparison", "load", "pairs", "EM a", "EM b", "a only", "b only", "p",
                         "power", "note"],
                        [[r["model"], f"{r['a']} vs {r['b']}", str(r["load"]), str(r["n_pairs"]),
                          _fmt(r["em_a"]), _fmt(r["em_b"]), str(r["n_a_only"] if r["n_a_only"] is not None else "—"),
                          str(r["n_b_only"] if r["n_b_only"] is not None else "—"), _p(r["p"]),
                          _fmt((r.get("power") or {}).get("power"), ".2f"),
                          "; ".join(x for x in (r.get("note"), r.get("reason")) if x)]
                         for r in analysis["h2"]]), ""]
    parts += ["## H3: S_sim vs degradation (Control − Residue)", "",
              _md_table(["model", "load", "questions", "r", "95% CI (Fisher z)", "p", "Spearman ρ", "note"],
                        [[r["model"], "pooled" if r["load"] is None else str(r["load"]), str(r["n_tasks"]),
                          _fmt(r["r"], "+.3f"),
                          "—" if r["ci_low"] is None else f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]",
                          _p(r["p"]), _fmt(r["spearman_rho"], "+.3f"), r["reason"] or ""]
                         for r in analysis["h3"]]), ""]
    att = [a for a in analysis.get("attention_behaviour", [])]
    if att:
        parts += ["## Attention ↔ behaviour (wrong answer ~ head-mean P_ext, per layer)", ""]
        for a in att:
            tracking = ", ".join(str(x) for x in a["tracking_layers"]) or "none"
            parts.append(f"- {a['model']}: {a['n_trials']} trials; layers tracking failure (Holm p < α, "
                         f"coef > 0): {tracking}" + (f" — {a['reason']}" if a["reason"] else ""))
        parts.append("")
    parts += ["## Taxonomy", "",
              _md_table(["model", "label", "Control EM", "trunc./uninterp. rate", "reason"],
                        [[t["model"], t["label"], _fmt(t["control_em"]), _pct(t["confound_rate_observed"]),
                          t["reason"]] for t in analysis["taxonomy"]]), ""]
    return parts


def _cogniload_markdown(analysis: dict) -> list[str]:
    """The CogniLoad part of ``analysis.md``: accuracy per knob level, GLM terms, thresholds, attention summary."""
    cl = analysis.get("cogniload") or {}
    if not cl:
        return []
    parts = ["## CogniLoad", ""]
    acc = cogniload_accuracy_rows(analysis)
    parts += [_md_table(["model", "knob", "level", "n", "accuracy", "95% CI", "truncated", "uninterp."],
                        [[r["model"], KNOB_LABELS[r["knob"]], str(r["level"]), str(r["n"]), _fmt(r["em_mean"]),
                          "—" if r["em_ci_low"] is None else f"[{r['em_ci_low']:.3f}, {r['em_ci_high']:.3f}]",
                          _pct(r["truncated_rate"]), _pct(r["uninterpretable_rate"])] for r in acc]), ""]
    fits = cogniload_fit_rows(analysis)
    if fits:
        parts += ["GLM, logit P(correct) (quadratic: the main fit):", "",
                  _md_table(["model", "fit", "status", "term", "estimate", "95% CI", "p", "AIC", "note"],
                            [[r["model"], r["fit"], r["status"], r["term"] or "—", _fmt(r["estimate"], "+.4g"),
                              "—" if r["ci_low"] is None else f"[{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]",
                              _p(r["p"]), _fmt(r["aic"], ".1f"), r["note"] or ""] for r in fits]), ""]
    parts += [f"- {line}" for line in cogniload_lines({"cogniload": {"models": cl.get("models"), "cells": {}}})]
    for model, a in sorted(((cl.get("attention") or {}).get("models") or {}).items()):
        parts.append(f"- {model}: needle/hay attention enrichment over {a['n_prompts']} prompts, {a['n_layers']} "
                     "layers (per layer in `tables/cogniload_attention_layers.csv`)")
    return parts + [""]


def cogniload_accuracy_rows(analysis: dict) -> list[dict]:
    """CogniLoad accuracy cells as rows: ``model``, ``knob`` (d, N, rho), ``level`` and the cell's fields."""
    cells = ((analysis.get("cogniload") or {}).get("cells")) or {}
    return [{"model": m, "knob": k, **c} for m in sorted(cells) for k in ("d", "N", "rho") for c in cells[m].get(k, [])]


def cogniload_fit_rows(analysis: dict) -> list[dict]:
    """One row per model × fit × term of the CogniLoad GLMs (a fit without terms gives one row with its reason)."""
    rows: list[dict] = []
    for model, s in sorted(((analysis.get("cogniload") or {}).get("models") or {}).items()):
        for fit, f in s["fits"].items():
            dropped = "; ".join(f"{t} left out: {why}" for t, why in f["dropped"].items())
            note = "; ".join(x for x in (f["reason"], dropped) if x) or None
            base = {"model": model, "fit": fit, "status": f["status"], "aic": f["aic"], "n": f["n"]}
            if not f["params"]:
                rows.append({**base, "term": None, "estimate": None, "se": None, "ci_low": None, "ci_high": None,
                             "p": None, "note": note})
            for i, (term, v) in enumerate(f["params"].items()):
                rows.append({**base, "term": term, **v, "note": note if i == 0 else None})
    return rows


def cogniload_threshold_rows(analysis: dict) -> list[dict]:
    """One row per model × threshold (ECL50, NT50, ID50) and one for Δρ."""
    rows: list[dict] = []
    for model, s in sorted(((analysis.get("cogniload") or {}).get("models") or {}).items()):
        for name, th in s["thresholds"].items():
            rows.append({"model": model, "threshold": name, **th})
        dr = s["delta_rho"]
        rows.append({"model": model, "threshold": "delta_rho", "value": dr["value"], "ci_low": dr["ci_low"],
                     "ci_high": dr["ci_high"], "status": None, "unit": "accuracy",
                     "reason": f"Acc(rho={dr['low_rho']}) - Acc(rho={dr['high_rho']})"})
    return rows


def cogniload_attention_rows(analysis: dict) -> list[dict]:
    """Per model × layer: needle and hay enrichment and log2(needle / hay), means with their 95 % intervals."""
    rows: list[dict] = []
    for model, a in sorted(((((analysis.get("cogniload") or {}).get("attention")) or {}).get("models") or {}).items()):
        for layer in range(a["n_layers"]):
            row: dict = {"model": model, "layer": layer}
            for g in ("needle", "hay", "log2_ratio"):
                for k in ("mean", "ci_low", "ci_high", "n"):
                    row[f"{g}_{k}"] = a["layer"][g][k][layer]
            rows.append(row)
    return rows


def _csv_text(rows: list[dict], drop: tuple[str, ...] = ()) -> str:
    if not rows:
        return ""
    flat = [{k: v for k, v in _flatten(r).items() if k not in drop} for r in rows]
    names: list[str] = []
    for r in flat:
        names += [k for k in r if k not in names]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    w.writeheader()
    for r in flat:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in names})
    return buf.getvalue()


def _flatten(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}_"))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            continue  # nested rows (scatter points, layers) go to their own files
        else:
            out[f"{prefix}{k}"] = v
    return out


def _cogniload_tables(analysis: dict) -> list[tuple[str, list[dict]]]:
    if not analysis.get("cogniload"):
        return []
    return [("cogniload_accuracy", cogniload_accuracy_rows(analysis)), ("cogniload_fits", cogniload_fit_rows(analysis)),
            ("cogniload_thresholds", cogniload_threshold_rows(analysis)),
            ("cogniload_attention_layers", cogniload_attention_rows(analysis))]


def write_tables(analysis: dict, run_dir: Path) -> list[Path]:
    """Write ``analysis.md`` and ``tables/*.csv`` into the run folder; returns the paths written."""
    out_dir = run_dir / "tables"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    layers = [{"model": a["model"], **r} for a in analysis.get("attention_behaviour", []) for r in a["layers"]]
    points = [{"model": h["model"], "load": h["load"], **p} for h in analysis["h3"] for p in h["points"]]
    for name, rows in (("cells", analysis["cells"]), ("h1", analysis["h1"]), ("h2", analysis["h2"]),
                       ("h3", analysis["h3"]), ("h3_points", points), ("attention_layers", layers),
                       ("taxonomy", analysis["taxonomy"]), *_cogniload_tables(analysis)):
        path = out_dir / f"{name}.csv"
        path.write_text(_csv_text(rows), encoding="utf-8")
        written.append(path)
    md = run_dir / "analysis.md"
    md.write_text(render_markdown(analysis), encoding="utf-8")
    written.append(md)
    return written
