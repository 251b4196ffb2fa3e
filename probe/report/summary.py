"""The report's text summary, written from the numbers in ``analysis.json`` and claiming nothing beyond them.

Rules: a model labelled intrinsic-load brittle gets "no inference about extraneous load"; a confounded or
unscorable model gets no effect statements either. A coefficient or difference is called a decline / increase /
difference only at p < α; otherwise it is reported as not significant, with the power to detect it.
"""

from __future__ import annotations


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _h1_sentence(h: dict, alpha: float) -> str:
    name = {"Saturation": "Saturation (H1)", "Residue": "Residue", "LongControl": "LongControl"}[h["condition"]]
    if h["beta"] is None:
        return f"{name}: no load trend estimated ({h['reason']})."
    ci = f"95% CI [{h['ci_low']:+.4f}, {h['ci_high']:+.4f}]"
    per10 = 10 * h["beta"]
    if h["p"] < alpha:
        direction = "declines" if h["beta"] < 0 else "rises"
        s = (f"{name}: EM {direction} with load, β = {h['beta']:+.4f} per percentage point "
             f"({per10:+.3f} per 10 points), {ci}, {_p(h['p'])}, n = {h['n']} trials over {h['n_clusters']} questions.")
    else:
        s = (f"{name}: no significant change of EM with load, β = {h['beta']:+.4f} per percentage point, {ci}, "
             f"{_p(h['p'])}.")
        pw = h.get("power") or {}
        if pw.get("power") is not None:
            s += (f" Observed power {pw['power']:.2f}; a slope of ±{pw['mde_80']:.4f}/pp would have been detected "
                  f"with 80% power.")
    lg = h.get("logit") or {}
    if lg.get("coef") is not None:
        agrees = (lg["p"] < alpha) == (h["p"] < alpha)
        s += (f" Logistic check: {lg['coef']:+.4f} log-odds/pp, {_p(lg['p'])}"
              f" ({'agrees' if agrees else 'does not agree'} on significance).")
    return s


def _h2_sentence(rows: list[dict], alpha: float) -> str:
    sig, ns, none, same = [], [], [], []
    for r in rows:
        label = f"{r['a']} vs {r['b']}" + ("" if r["a"] == "LongControl" and r["load"] == 0 else f" at {r['load']}%")
        if r["p"] is None or r["n_a_only"] is None:
            none.append(f"{label} ({r['reason']})")
        elif r["n_a_only"] + r["n_b_only"] == 0:
            same.append(f"{label} ({r['n_pairs']} pairs)")
        elif r["p"] < alpha:
            word = "lower" if r["delta"] < 0 else "higher"
            sig.append(f"{label}: EM {word} by {abs(r['delta']):.2f} ({r['n_a_only']} vs {r['n_b_only']} discordant "
                       f"pairs of {r['n_pairs']}, {_p(r['p'])})")
        else:
            pw = (r.get("power") or {}).get("power")
            ns.append(f"{label} (Δ = {r['delta']:+.2f}, {_p(r['p'])}" + (f", power {pw:.2f}" if pw is not None else "")
                      + ")")
    parts = []
    if sig:
        parts.append("Significant paired differences (exact McNemar): " + "; ".join(sig) + ".")
    if ns:
        parts.append("Not significant: " + "; ".join(ns) + ".")
    if same:
        parts.append("Same outcome on every pair (no discordant pair, no information): " + "; ".join(same) + ".")
    if none:
        parts.append("Not tested: " + "; ".join(none) + ".")
    return " ".join(parts)


def _h3_sentence(h: dict, alpha: float) -> str:
    if h["r"] is None:
        return f"H3: no correlation estimated ({h['reason']})."
    ci = "" if h["ci_low"] is None else f", 95% CI [{h['ci_low']:+.2f}, {h['ci_high']:+.2f}]"
    if h["p"] < alpha:
        word = "more" if h["r"] > 0 else "less"
        lead = f"H3: questions whose distractors are more similar degrade {word} under Residue"
    else:
        lead = "H3: no significant correlation between task similarity and degradation"
    sp = "" if h["spearman_rho"] is None else f"; Spearman ρ = {h['spearman_rho']:+.2f} ({_p(h['spearman_p'])})"
    return f"{lead} (Pearson r = {h['r']:+.2f}{ci}, {_p(h['p'])}, {h['n_tasks']} questions{sp})."


def _attention_sentence(a: dict) -> str:
    if a["reason"]:
        return f"Attention ↔ behaviour: not estimated ({a['reason']})."
    if a["tracking_layers"]:
        s = (f"Attention ↔ behaviour: in layers {', '.join(map(str, a['tracking_layers']))} a higher share of attention"
             f" on extraneous text goes with wrong answers (Holm-adjusted p < α, {a['n_trials']} trials)")
        adj = a.get("tracking_layers_adjusted", [])
        s += (f"; with load and placement held fixed: layers {', '.join(map(str, adj))}." if adj
              else "; none of them once load and placement are held fixed.")
        return s
    return (f"Attention ↔ behaviour: no layer's P_ext predicts wrong answers after Holm adjustment "
            f"({a['n_trials']} trials).")


def model_summary(analysis: dict, model: str) -> list[str]:
    """Sentences about one model, in order: taxonomy, H1 (and Residue, LongControl), H2, H3, attention."""
    alpha = analysis["config"]["alpha"]
    tax = next((t for t in analysis["taxonomy"] if t["model"] == model), None)
    out: list[str] = []
    if tax is not None:
        out.append(f"Classification: {tax['label']}. {tax['reason'][0].upper()}{tax['reason'][1:]}.")
        if tax["label"] in ("intrinsic-load brittle", "confounded", "unscorable"):
            out.append("The numbers below are descriptive only; no inference about extraneous load is drawn.")
            return out
    for cond in ("Saturation", "Residue", "LongControl"):
        h = next((x for x in analysis["h1"] if x["model"] == model and x["condition"] == cond), None)
        if h is not None:
            out.append(_h1_sentence(h, alpha))
    h2 = [r for r in analysis["h2"] if r["model"] == model]
    if h2:
        out.append(_h2_sentence(h2, alpha))
    h3 = next((x for x in analysis["h3"] if x["model"] == model and x["load"] is None), None)
    if h3 is not None:
        out.append(_h3_sentence(h3, alpha))
    att = next((a for a in analysis.get("attention_behaviour", []) if a["model"] == model), None)
    if att is not None:
        out.append(_attention_sentence(att))
    return out


def _acc_ci(c: dict) -> str:
    ci = "" if c["em_ci_low"] is None else f", 95% CI [{c['em_ci_low']:.2f}, {c['em_ci_high']:.2f}]"
    return f"{c['em_mean']:.2f}{ci}"


def _rho_shape_sentence(s: dict, alpha: float) -> str:
    quad = s["fits"]["quadratic"]
    if quad["status"] != "ok":
        return f"Shape in ρ: the main GLM is {quad['status']} ({quad['reason']}); no statement about curvature."
    b2 = quad["params"].get("rho2")
    if b2 is None:
        return f"Shape in ρ: not tested ({quad['dropped'].get('rho2', 'no ρ² term')})."
    aic = ("" if s["delta_aic"] is None
           else f"; AIC prefers the {s['aic_preferred']} fit (ΔAIC = {s['delta_aic']:+.1f})")
    coef = f"β_ρ² = {b2['estimate']:+.2e}, {_p(b2['p'])}"
    if b2["p"] < alpha:
        shape = "U-shaped" if b2["estimate"] > 0 else "inverted-U-shaped"
        return f"Accuracy is {shape} in ρ ({coef}{aic})."
    return f"No significant curvature of accuracy in ρ ({coef}{aic})."


def _delta_rho_sentence(dr: dict) -> str:
    if dr["value"] is None:
        return "Δρ: not estimated (a ρ extreme has no scored trial)."
    s = (f"Δρ = Acc(ρ={dr['low_rho']}%) − Acc(ρ={dr['high_rho']}%) = {dr['value']:+.2f} "
         f"({dr['acc_low']:.2f} vs {dr['acc_high']:.2f}")
    if dr["ci_low"] is None:
        return s + "; no bootstrap CI)."
    s += f"; bootstrap 95% CI [{dr['ci_low']:+.2f}, {dr['ci_high']:+.2f}])"
    if dr["ci_low"] > 0:
        return s + ": accuracy is higher at the lowest needle ratio."
    if dr["ci_high"] < 0:
        return s + ": accuracy is higher at the highest needle ratio."
    return s + ": the two extremes are not distinguishable."


def _threshold_sentence(s: dict) -> str:
    parts = []
    for name in ("ECL50", "NT50", "ID50"):
        th = s["thresholds"][name]
        if th["value"] is None:
            parts.append(f"{name} not given ({th['reason']})")
        else:
            ci = "" if th["ci_low"] is None else f", bootstrap 95% CI [{th['ci_low']:.3g}, {th['ci_high']:.3g}]"
            parts.append(f"{name} = {th['value']:.3g} {th['unit']}{ci}")
    return "Thresholds: " + "; ".join(parts) + "."


def _needle_hay_sentence(att: dict) -> str:
    ratio = att["layer"]["log2_ratio"]
    above = [i for i, lo in enumerate(ratio["ci_low"]) if lo is not None and lo > 0]
    below = [i for i, hi in enumerate(ratio["ci_high"]) if hi is not None and hi < 0]
    s = (f"Attention from the question ({att['n_prompts']} prompts, {att['n_layers']} layers): per token, needle "
         f"statements get more attention than hay in {len(above)} layers and less in {len(below)} "
         "(pointwise 95% CI of log2(needle/hay) above / below 0)")
    by = att["by_rho"]
    if len(by["levels"]) >= 2:
        means = by["layer_mean"]["log2_ratio"]
        s += "; layer-mean log2(needle/hay) by ρ: " + ", ".join(
            f"{v}%: {'—' if m is None else f'{m:+.2f}'}" for v, m in zip(by["levels"], means))
    return s + "."


def cogniload_summary(analysis: dict, model: str) -> list[str]:
    """Sentences on one model's CogniLoad results: accuracy, output quality, shape in ρ, Δρ, thresholds, attention.

    A model whose outputs are truncated or uninterpretable above the confound gate gets the numbers with that
    caveat first; the shape in ρ is called U-shaped only when the main fit's ρ² coefficient is positive at p < α.
    """
    cl = analysis.get("cogniload") or {}
    cells = (cl.get("cells") or {}).get(model)
    if not cells:
        return []
    alpha = analysis["config"]["alpha"]
    gate = analysis["config"].get("confound_rate")
    c = cells["overall"]
    out: list[str] = []
    if c["em_mean"] is None:
        return [f"CogniLoad: no scored trial ({c['n_error']} errors, {c['n_skipped']} skipped)."]
    out.append(f"CogniLoad: accuracy {_acc_ci(c)} over {c['n']} puzzles.")
    bad = [x for x in (c["truncated_rate"], c["uninterpretable_rate"]) if x is not None]
    if gate is not None and bad and max(bad) > gate:
        out.append(f"{100 * (c['truncated_rate'] or 0):.0f}% of outputs were truncated and "
                   f"{100 * (c['uninterpretable_rate'] or 0):.0f}% uninterpretable (gate {100 * gate:.0f}%): "
                   "accuracy here also measures the output budget and format, not only reasoning.")
    s = (cl.get("models") or {}).get(model)
    if s:
        out += [_rho_shape_sentence(s, alpha), _delta_rho_sentence(s["delta_rho"]), _threshold_sentence(s)]
    att = ((cl.get("attention") or {}).get("models") or {}).get(model)
    if att:
        out.append(_needle_hay_sentence(att))
    return out
