"""The words of the CogniLoad report section (family ``cogniload``; docs/cogniload.md): knob and term labels,
the summary sentences of each model and the lines it adds under the main table.

Summary rules: a model whose outputs are truncated or uninterpretable above the confound gate gets the numbers with
that caveat first; the shape in ρ is called U-shaped only when the main fit's ρ² coefficient is positive at p < α.
"""

from __future__ import annotations

from probe import formatting as fmt
from probe.analysis.cogniload import KNOBS, CogniloadFits, CogniloadResult, DeltaRho, Threshold
from probe.analysis.cogniload_attention import NeedleHayModel
from probe.analysis.estimates import Cell
from probe.config import AnalysisSection


KNOB_AXES: tuple[tuple[str, str, str], ...] = (("d", "difficulty d", ""), ("N", "length N (statements)", ""),
                                               ("rho", "needle ratio ρ (% of statements)", "%"))


KNOB_LABELS = {"d": "d", "N": "N", "rho": "ρ"}


THRESHOLDS: tuple[tuple[str, str], ...] = (("ECL50", "largest N with P(correct) ≥ 0.5"),
                                           ("NT50", "smallest ρ with P(correct) ≥ 0.5"),
                                           ("ID50", "largest d with P(correct) ≥ 0.5"))


TERM_LABELS = {"const": "intercept", "d": "β_d", "log10_N": "β_N (per log10 N)", "rho": "β_ρ (per pp)",
               "rho2": "β_ρ² (per pp²)", "d:log10_N": "β_d×N", "d:rho": "β_d×ρ"}


def attention_of(result: CogniloadResult, model: str) -> NeedleHayModel | None:
    return result.attention.models.get(model) if result.attention is not None else None


def _rho_shape_sentence(s: CogniloadFits, alpha: float) -> str:
    quad = s.fits["quadratic"]
    if quad.status != "ok":
        return f"Shape in ρ: the main GLM is {quad.status} ({quad.reason}); no statement about curvature."
    b2 = quad.params.get("rho2")
    if b2 is None:
        return f"Shape in ρ: not tested ({quad.dropped.get('rho2', 'no ρ² term')})."
    aic = ("" if s.delta_aic is None
           else f"; AIC prefers the {s.aic_preferred} fit (ΔAIC = {fmt.num(s.delta_aic, '+.1f')})")
    if b2.p is None:
        return (f"Shape in ρ: β_ρ² = {fmt.num(b2.value, '+.2e')}, described only, not tested "
                f"({quad.se_method}).")
    coef = f"β_ρ² = {fmt.num(b2.value, '+.2e')}, {fmt.p_phrase(b2.p)}"
    if b2.p < alpha:
        shape = "U-shaped" if (b2.value or 0) > 0 else "inverted-U-shaped"
        return f"Accuracy is {shape} in ρ ({coef}{aic})."
    return f"No significant curvature of accuracy in ρ ({coef}{aic})."


def _delta_rho_sentence(dr: DeltaRho) -> str:
    if dr.value is None:
        return "Δρ: not estimated (a ρ extreme has no scored trial)."
    s = (f"Δρ = Acc(ρ={dr.low_rho}%) − Acc(ρ={dr.high_rho}%) = {fmt.num(dr.value, '+.2f')} "
         f"({fmt.num(dr.acc_low, '.2f')} vs {fmt.num(dr.acc_high, '.2f')}")
    if dr.ci_low is None or dr.ci_high is None:
        return s + "; no bootstrap CI)."
    s += f"; bootstrap 95% CI {fmt.ci(dr.ci_low, dr.ci_high, '+.2f')})"
    if dr.ci_low > 0:
        return s + ": accuracy is higher at the lowest needle ratio."
    if dr.ci_high < 0:
        return s + ": accuracy is higher at the highest needle ratio."
    return s + ": the two extremes are not distinguishable."


def _threshold_sentence(s: CogniloadFits) -> str:
    parts = []
    for name, _ in THRESHOLDS:
        th = s.thresholds[name]
        if th.value is None:
            parts.append(f"{name} not given ({th.reason})")
        else:
            ci = "" if th.ci_low is None else f", bootstrap 95% CI {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
            parts.append(f"{name} = {fmt.num(th.value, '.3g')} {th.unit}{ci}")
    return "Thresholds: " + "; ".join(parts) + "."


def _needle_hay_sentence(att: NeedleHayModel) -> str:
    ratio = att.layer["log2_ratio"]
    above = [i for i, lo in enumerate(ratio.ci_low) if lo is not None and lo > 0]
    below = [i for i, hi in enumerate(ratio.ci_high) if hi is not None and hi < 0]
    s = (f"Attention from the question ({att.n_prompts} prompts, {att.n_layers} layers): per token, needle "
         f"statements get more attention than hay in {len(above)} layers and less in {len(below)} "
         "(pointwise 95% CI of log2(needle/hay) above / below 0)")
    by = att.by_rho
    if len(by.levels) >= 2:
        means = by.layer_mean["log2_ratio"]
        s += "; layer-mean log2(needle/hay) by ρ: " + ", ".join(
            f"{v}%: {fmt.num(m, '+.2f')}" for v, m in zip(by.levels, means))
    return s + "."


def _acc_ci(c: Cell) -> str:
    ci = "" if c.em_ci_low is None else f", 95% CI {fmt.ci(c.em_ci_low, c.em_ci_high, '.2f')}"
    return f"{fmt.num(c.em_mean, '.2f')}{ci}"


def model_summary(result: CogniloadResult, model: str, settings: AnalysisSection) -> list[str]:
    """Sentences on one model's CogniLoad results: accuracy, output quality, shape in ρ, Δρ, thresholds, attention."""
    cells = result.cells.get(model)
    if cells is None:
        return []
    c = cells.overall
    if c.em_mean is None:
        return [f"CogniLoad: no scored trial ({c.n_error} errors, {c.n_skipped} skipped)."]
    out = [f"CogniLoad: accuracy {_acc_ci(c)} over {c.n} puzzles."]
    bad = [x for x in (c.truncated_rate, c.uninterpretable_rate) if x is not None]
    gate = settings.confound_rate
    if bad and max(bad) > gate:
        out.append(f"{fmt.pct(c.truncated_rate or 0)} of outputs were truncated and "
                   f"{fmt.pct(c.uninterpretable_rate or 0)} uninterpretable (gate {fmt.pct(gate)}): "
                   "accuracy here also measures the output budget and format, not only reasoning.")
    s = result.models.get(model)
    if s is not None:
        out += [_rho_shape_sentence(s, settings.alpha), _delta_rho_sentence(s.delta_rho), _threshold_sentence(s)]
    att = attention_of(result, model)
    if att is not None:
        out.append(_needle_hay_sentence(att))
    return out


def threshold_text(th: Threshold, name: str) -> str:
    """One threshold as text: value [CI] or why there is none."""
    if th.value is None:
        return f"{name} — ({th.status}: {th.reason})"
    ci = "" if th.ci_low is None else f" {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
    note = f" ({th.ci_note})" if th.ci_note else ""
    return f"{name} = {fmt.num(th.value, '.3g')} {th.unit}{ci}{note}"


def _level_list(cells: tuple[Cell, ...], knob: str) -> str:
    unit = "%" if knob == "rho" else ""
    return "; ".join(f"{KNOB_LABELS[knob]}={c.level}{unit}: {fmt.num(c.em_mean, '.2f')}"
                     + ("" if c.em_ci_low is None else f" {fmt.ci(c.em_ci_low, c.em_ci_high, '.2f')}")
                     + f" (n={c.n})" for c in cells)


def fit_lines(s: CogniloadFits, model: str) -> list[str]:
    dr = s.delta_rho
    ci = "" if dr.ci_low is None else f" {fmt.ci(dr.ci_low, dr.ci_high, '+.2f')}"
    aic = ("AIC: no comparison (" + "; ".join(f"{k} fit {s.fits[k].status}" for k in ("quadratic", "linear")) + ")"
           if s.delta_aic is None else
           f"AIC(linear) − AIC(quadratic) = {fmt.num(s.delta_aic, '+.2f')}, {s.aic_preferred} preferred")
    return [f"CogniLoad {model}: " + "; ".join(threshold_text(s.thresholds[k], k) for k, _ in THRESHOLDS),
            f"CogniLoad {model}: Δρ = Acc(ρ={dr.low_rho}%) − Acc(ρ={dr.high_rho}%) = {fmt.num(dr.value, '+.3f')}{ci}; "
            f"{aic}"]


def main_lines(result: CogniloadResult, settings: AnalysisSection) -> list[str]:
    """Accuracy per knob level, thresholds, Δρ and the AIC comparison, per model."""
    lines: list[str] = []
    for model, cells in sorted(result.cells.items()):
        lines += [f"CogniLoad {model}: accuracy by {KNOB_LABELS[knob]} — {_level_list(cells.by(knob), knob)}"
                  for knob in KNOBS if cells.by(knob)]
        if model in result.models:
            lines += fit_lines(result.models[model], model)
    return lines
