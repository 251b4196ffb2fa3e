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
        f"{c['model']}{marks.get(c['model'], '')}", c["condition"], str(c["load"]), str(c["n"]), em, ci,
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


def render_main_table(analysis: dict) -> str:
    """The main table (EM per model × condition × load) as aligned plain text, with the taxonomy below it.

    Args:
        analysis: the dict of ``analysis.json``.

    Returns:
        Multi-line text.
    """
    marks = taxonomy_marks(analysis)
    rows = [MAIN_HEADER] + [_cell_row(c, marks) for c in analysis["cells"]]
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
             _md_table(MAIN_HEADER, [_cell_row(c, marks) for c in analysis["cells"]]), "", MARK_LEGEND, ""]
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
    if analysis.get("notes"):
        parts += ["## Notes", ""] + [f"- {n}" for n in analysis["notes"]] + [""]
    return "\n".join(parts)


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


def write_tables(analysis: dict, run_dir: Path) -> list[Path]:
    """Write ``analysis.md`` and ``tables/*.csv`` into the run folder; returns the paths written."""
    out_dir = run_dir / "tables"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    layers = [{"model": a["model"], **r} for a in analysis.get("attention_behaviour", []) for r in a["layers"]]
    points = [{"model": h["model"], "load": h["load"], **p} for h in analysis["h3"] for p in h["points"]]
    for name, rows in (("cells", analysis["cells"]), ("h1", analysis["h1"]), ("h2", analysis["h2"]),
                       ("h3", analysis["h3"]), ("h3_points", points), ("attention_layers", layers),
                       ("taxonomy", analysis["taxonomy"])):
        path = out_dir / f"{name}.csv"
        path.write_text(_csv_text(rows), encoding="utf-8")
        written.append(path)
    md = run_dir / "analysis.md"
    md.write_text(render_markdown(analysis), encoding="utf-8")
    written.append(md)
    return written
