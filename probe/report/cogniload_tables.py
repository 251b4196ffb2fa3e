"""The CogniLoad ``tables/*.csv`` (family ``cogniload``): ``cogniload_accuracy``, ``cogniload_fits``,
``cogniload_thresholds`` and ``cogniload_attention_layers``, one row per model and level, term, threshold or layer.
"""

from __future__ import annotations

from probe.analysis.cogniload import KNOBS, CogniloadResult
from probe.analysis.cogniload_attention import SERIES
from probe.report.sections import Rows
from probe.report.tables import rows_of


def accuracy_rows(result: CogniloadResult) -> Rows:
    """Accuracy cells as rows: ``model``, ``knob`` (d, N, rho) and the cell's fields."""
    return [row for m in sorted(result.cells) for k in KNOBS for row in rows_of(result.cells[m].by(k), knob=k)]


def fit_rows(result: CogniloadResult) -> Rows:
    """One row per model × fit × term of the GLMs (a fit without terms gives one row with its reason)."""
    rows: Rows = []
    for model, s in sorted(result.models.items()):
        for fit, f in s.fits.items():
            dropped = "; ".join(f"{t} left out: {why}" for t, why in f.dropped.items())
            note = "; ".join(x for x in (f.reason, dropped) if x) or None
            base = {"model": model, "fit": fit, "status": f.status, "aic": f.aic, "n": f.n}
            if not f.params:
                rows.append({**base, "term": None, "estimate": None, "se": None, "ci_low": None, "ci_high": None,
                             "p": None, "note": note})
            for i, (term, v) in enumerate(f.params.items()):
                rows.append({**base, "term": term, "estimate": v.value, "se": v.se, "ci_low": v.ci_low,
                             "ci_high": v.ci_high, "p": v.p, "df": v.df, "note": note if i == 0 else None})
    return rows


def threshold_rows(result: CogniloadResult) -> Rows:
    """One row per model × threshold (ECL50, NT50, ID50) and one for Δρ."""
    rows: Rows = []
    for model, s in sorted(result.models.items()):
        for name, th in s.thresholds.items():
            rows += rows_of([th], model=model, threshold=name)
        dr = s.delta_rho
        rows.append({"model": model, "threshold": "delta_rho", "value": dr.value, "ci_low": dr.ci_low,
                     "ci_high": dr.ci_high, "status": None, "unit": "accuracy",
                     "reason": f"Acc(rho={dr.low_rho}) - Acc(rho={dr.high_rho})"})
    return rows


def attention_rows(result: CogniloadResult) -> Rows:
    """Per model × layer: needle and hay enrichment and log2(needle / hay), means with their 95 % intervals."""
    rows: Rows = []
    for model, a in sorted((result.attention.models if result.attention is not None else {}).items()):
        for layer in range(a.n_layers):
            row: dict = {"model": model, "layer": layer}
            for g in SERIES:
                s = a.layer[g]
                row.update({f"{g}_mean": s.mean[layer], f"{g}_ci_low": s.ci_low[layer],
                            f"{g}_ci_high": s.ci_high[layer], f"{g}_n": s.n[layer]})
            rows.append(row)
    return rows


def tables(result: CogniloadResult) -> list[tuple[str, Rows]]:
    """``tables/*.csv`` of the CogniLoad result."""
    return [("cogniload_accuracy", accuracy_rows(result)), ("cogniload_fits", fit_rows(result)),
            ("cogniload_thresholds", threshold_rows(result)), ("cogniload_attention_layers", attention_rows(result))]
