"""Model taxonomy (SPEC §6, paper §5.4), gated on baseline competence and on output quality.

Per model, with the gates of :class:`probe.config.AnalysisSection`:

- ``confounded``: the share of outputs (all conditions) that are truncated or uninterpretable is above
  ``confound_rate``. EM then measures the output budget or format as much as reasoning, so this label takes
  precedence: a model whose Control EM is low *because* its answers were cut off is not called brittle (the
  paper's GPT-4o confound). ``is_brittle`` still records whether the EM gate was crossed.
- ``intrinsic-load brittle``: Control EM below ``brittle_em``: the model fails without any extraneous text, so
  nothing can be inferred about extraneous load.
- ``resilient`` otherwise, with ``load-sensitive`` added when H1's β (Saturation) is below 0 at p < ``alpha``.
- ``unscorable``: no scored Control trial (e.g. every call an API error).
"""

from __future__ import annotations

import pandas as pd

from probe.config import AnalysisSection

BRITTLE = "intrinsic-load brittle"
CONFOUNDED = "confounded"
RESILIENT = "resilient"
LOAD_SENSITIVE = "load-sensitive"
UNSCORABLE = "unscorable"


def classify_model(df: pd.DataFrame, model: str, h1: dict | None, cfg: AnalysisSection) -> dict:
    """Taxonomy of one model.

    Args:
        df: trial table.
        model: model name.
        h1: the model's Saturation H1 fit (:func:`probe.analysis.hypotheses.fit_load_trend`) or None.
        cfg: the gates (``brittle_em``, ``confound_rate``, ``alpha``).

    Returns:
        Dict with ``model``, ``label``, ``is_brittle``, ``is_confounded``, ``is_load_sensitive`` (None where
        not applicable), ``control_em``, ``n_control``, ``confound_rate_observed``, ``n_outputs``, ``gates`` and
        ``reason`` (a sentence explaining the label from the numbers).
    """
    m = df[df["model"] == model]
    outputs = m[m["has_output"]]
    control = m[(m["condition"] == "Control") & m["is_scored"]]
    n_out = int(len(outputs))
    rate = float((outputs["truncated"] | outputs["uninterpretable"]).mean()) if n_out else None
    control_em = float(control["em"].mean()) if len(control) else None
    gates = {"brittle_em": cfg.brittle_em, "confound_rate": cfg.confound_rate, "alpha": cfg.alpha}
    out: dict = {"model": model, "label": None, "is_brittle": None, "is_confounded": None,
                 "is_load_sensitive": None, "control_em": control_em, "n_control": int(len(control)),
                 "confound_rate_observed": rate, "n_outputs": n_out, "gates": gates, "reason": None}
    n_err, n_skip = int(m["error"].notna().sum()), int(m["skipped"].sum())
    if control_em is None:
        out["label"] = UNSCORABLE
        out["reason"] = (f"no scored Control trial ({len(m)} trials: {n_err} errors, {n_skip} skipped); "
                         "no baseline, no inference")
        return out
    out["is_brittle"] = control_em < cfg.brittle_em
    out["is_confounded"] = rate is not None and rate > cfg.confound_rate
    if out["is_confounded"]:
        out["label"] = CONFOUNDED
        extra = (f"; Control EM {control_em:.2f} is also below the brittle gate {cfg.brittle_em:.2f}, but may "
                 "reflect the cut-off outputs") if out["is_brittle"] else ""
        out["reason"] = (f"{rate:.0%} of {n_out} outputs truncated or uninterpretable (gate {cfg.confound_rate:.0%})"
                         f": EM differences are not interpretable as effects of load{extra}")
        return out
    if out["is_brittle"]:
        out["label"] = BRITTLE
        out["reason"] = (f"Control EM {control_em:.2f} < {cfg.brittle_em:.2f}: fails without extraneous text; "
                         "no inference about extraneous load")
        return out
    beta, p = (h1 or {}).get("beta"), (h1 or {}).get("p")
    out["label"] = RESILIENT
    if beta is None or p is None:
        out["reason"] = (f"Control EM {control_em:.2f} passes the gate; load sensitivity not tested "
                         f"({(h1 or {}).get('reason') or 'no H1 fit'})")
        return out
    out["is_load_sensitive"] = beta < 0 and p < cfg.alpha
    if out["is_load_sensitive"]:
        out["label"] = f"{RESILIENT}, {LOAD_SENSITIVE}"
        out["reason"] = (f"Control EM {control_em:.2f} passes the gate; EM falls with load "
                         f"(β = {beta:+.4f}/pp, p = {p:.3g} < {cfg.alpha})")
    else:
        out["reason"] = (f"Control EM {control_em:.2f} passes the gate; no significant decline with load "
                         f"(β = {beta:+.4f}/pp, p = {p:.3g})")
    return out
