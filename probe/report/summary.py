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
