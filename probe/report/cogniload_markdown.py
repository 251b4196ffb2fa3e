"""The CogniLoad part of ``analysis.md`` (family ``cogniload``): accuracy per knob level, the GLM terms, the
thresholds and the attention summary.
"""

from __future__ import annotations

from probe import formatting as fmt
from probe.analysis.cogniload import KNOBS, CogniloadResult
from probe.config import AnalysisSection
from probe.report.tables import md_table
from probe.report.cogniload_tables import fit_rows
from probe.report.cogniload_text import KNOB_LABELS, fit_lines


def markdown(result: CogniloadResult, settings: AnalysisSection) -> list[str]:
    """The CogniLoad part of ``analysis.md``: accuracy per knob level, GLM terms, thresholds, attention summary."""
    parts = ["## CogniLoad", ""]
    parts += [md_table(["model", "knob", "level", "n", "accuracy", "95% CI", "truncated", "uninterp."],
                       [[m, KNOB_LABELS[k], str(c.level), str(c.n), fmt.num(c.em_mean), fmt.ci(c.em_ci_low, c.em_ci_high),
                         fmt.pct(c.truncated_rate), fmt.pct(c.uninterpretable_rate)]
                        for m in sorted(result.cells) for k in KNOBS for c in result.cells[m].by(k)]), ""]
    fits = fit_rows(result)
    if fits:
        parts += ["GLM, logit P(correct) (quadratic: the main fit):", "",
                  md_table(["model", "fit", "status", "term", "estimate", "95% CI", "p", "AIC", "note"],
                           [[r["model"], r["fit"], r["status"], r["term"] or fmt.DASH, fmt.num(r["estimate"], "+.4g"),
                             fmt.ci(r["ci_low"], r["ci_high"], "+.4g"), fmt.p_value(r["p"]), fmt.num(r["aic"], ".1f"),
                             r["note"] or ""] for r in fits]), ""]
    parts += [f"- {line}" for model, fits in sorted(result.models.items()) for line in fit_lines(fits, model)]
    for model, a in sorted((result.attention.models if result.attention is not None else {}).items()):
        parts.append(f"- {model}: needle/hay attention enrichment over {a.n_prompts} prompts, {a.n_layers} "
                     "layers (per layer in `tables/cogniload_attention_layers.csv`)")
    return parts + [""]
