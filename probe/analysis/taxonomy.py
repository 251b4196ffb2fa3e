"""Model taxonomy, gated on baseline competence and on output quality (docs/method.md#taxonomy)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe import formatting as fmt
from probe.analysis.hypotheses import H1Fit
from probe.config import AnalysisSection

BRITTLE = "intrinsic-load brittle"
CONFOUNDED = "confounded"
RESILIENT = "resilient"
LOAD_SENSITIVE = "load-sensitive"
UNSCORABLE = "unscorable"
NO_INFERENCE = (BRITTLE, CONFOUNDED, UNSCORABLE)  # labels under which no effect of extraneous load is claimed


@dataclass(frozen=True)
class Gates:
    """The gates a taxonomy was decided with (from :class:`probe.config.AnalysisSection`)."""

    brittle_em: float
    confound_rate: float
    alpha: float


@dataclass(frozen=True)
class Taxonomy:
    """One model's label (docs/method.md#taxonomy).

    Attributes:
        model: the model; label: ``intrinsic-load brittle``, ``confounded``, ``resilient``, ``resilient,
            load-sensitive`` or ``unscorable``.
        is_brittle, is_confounded, is_load_sensitive: the gates crossed (None where not applicable).
        control_em: EM of its scored Control trials; n_control: their number.
        confound_rate_observed: share of outputs truncated or uninterpretable; n_outputs: outputs.
        gates: the gates used; reason: a sentence explaining the label from the numbers.
    """

    model: str
    label: str
    is_brittle: bool | None
    is_confounded: bool | None
    is_load_sensitive: bool | None
    control_em: float | None
    n_control: int
    confound_rate_observed: float | None
    n_outputs: int
    gates: Gates
    reason: str

    @property
    def allows_inference(self) -> bool:
        """Whether effects of extraneous load may be stated for the model (not brittle, confounded or unscorable)."""
        return self.label not in NO_INFERENCE


def classify_model(df: pd.DataFrame, model: str, h1: H1Fit | None, cfg: AnalysisSection) -> Taxonomy:
    """Taxonomy of one model.

    Args:
        df: trial table.
        model: model name.
        h1: the model's Saturation H1 fit (:func:`probe.analysis.hypotheses.fit_load_trend`) or None.
        cfg: the gates (``brittle_em``, ``confound_rate``, ``alpha``).

    Returns:
        The model's :class:`Taxonomy`.
    """
    m = df[df["model"] == model]
    outputs = m[m["has_output"]]
    control = m[(m["condition"] == "Control") & m["is_scored"]]
    n_out = int(len(outputs))
    rate = float((outputs["truncated"] | outputs["uninterpretable"]).mean()) if n_out else None
    control_em = float(control["em"].mean()) if len(control) else None
    gates = Gates(brittle_em=cfg.brittle_em, confound_rate=cfg.confound_rate, alpha=cfg.alpha)

    def label(name: str, reason: str, brittle: bool | None = None, confounded: bool | None = None,
              sensitive: bool | None = None) -> Taxonomy:
        return Taxonomy(model=model, label=name, is_brittle=brittle, is_confounded=confounded,
                        is_load_sensitive=sensitive, control_em=control_em, n_control=int(len(control)),
                        confound_rate_observed=rate, n_outputs=n_out, gates=gates, reason=reason)

    n_err, n_skip = int(m["error"].notna().sum()), int(m["skipped"].sum())
    if control_em is None:
        return label(UNSCORABLE, f"no scored Control trial ({len(m)} trials: {n_err} errors, {n_skip} skipped); "
                                 "no baseline, no inference")
    em = fmt.num(control_em, ".2f")
    brittle = control_em < cfg.brittle_em
    confounded = rate is not None and rate > cfg.confound_rate
    if confounded:
        extra = (f"; Control EM {em} is also below the brittle gate {fmt.num(cfg.brittle_em, '.2f')}, but may "
                 "reflect the cut-off outputs") if brittle else ""
        return label(CONFOUNDED, f"{fmt.pct(rate)} of {n_out} outputs truncated or uninterpretable (gate "
                                 f"{fmt.pct(cfg.confound_rate)}): EM differences are not interpretable as effects of "
                                 f"load{extra}", brittle, confounded)
    if brittle:
        return label(BRITTLE, f"Control EM {em} < {fmt.num(cfg.brittle_em, '.2f')}: fails without extraneous text; "
                              "no inference about extraneous load", brittle, confounded)
    beta, p = (h1.estimate.value, h1.estimate.p) if h1 is not None else (None, None)
    if beta is None or p is None:
        why = (h1.estimate.reason if h1 is not None else None) or "no H1 fit"
        return label(RESILIENT, f"Control EM {em} passes the gate; load sensitivity not tested ({why})",
                     brittle, confounded)
    sensitive = beta < 0 and p < cfg.alpha
    if sensitive:
        return label(f"{RESILIENT}, {LOAD_SENSITIVE}", f"Control EM {em} passes the gate; EM falls with load "
                     f"(β = {fmt.num(beta, '+.4f')}/pp, p = {fmt.num(p, '.3g')} < {cfg.alpha})",
                     brittle, confounded, sensitive)
    if beta > 0 and p < cfg.alpha:  # a significant rise is not "no significant decline"
        return label(RESILIENT, f"Control EM {em} passes the gate; EM rises with load, not falls "
                     f"(β = {fmt.num(beta, '+.4f')}/pp, p = {fmt.num(p, '.3g')} < {cfg.alpha})",
                     brittle, confounded, sensitive)
    return label(RESILIENT, f"Control EM {em} passes the gate; no significant change of EM with load "
                 f"(β = {fmt.num(beta, '+.4f')}/pp, p = {fmt.num(p, '.3g')})", brittle, confounded, sensitive)
