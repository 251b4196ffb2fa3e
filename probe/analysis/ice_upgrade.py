"""Older ICE results in the current ``analysis.json`` layout (registered as the ICE family analysis' upgrade).

Schema 3 and 4 named the attention measure inside field names (``p_ext_layers``, ``odds_ratio_per_10pp_p_ext``,
``p_ext_mean`` / ``ar_k_key`` of one cell); schema 5 has one row per measure with a ``measure`` column
(docs/records.md#run-folder).
"""

from __future__ import annotations


def _rename(d: dict, old: str, new: str) -> dict:
    return {(new if k == old else k): v for k, v in d.items()}


def _upgrade_fit(fit: dict | None) -> dict | None:
    if fit is None:
        return None
    out = _rename(fit, "odds_ratio_per_10pp_p_ext", "odds_ratio_per_10pp")
    if isinstance(out.get("adjusted"), dict):
        out["adjusted"] = _upgrade_fit(out["adjusted"])
    return out


def _upgrade_cell(cell: dict) -> list[dict]:
    base = {k: cell[k] for k in ("model", "condition", "load", "n_prompts", "n_layers", "n_heads")}
    cells = [{**base, "measure": "p_ext", "label": "P_ext", "mean": cell["p_ext_mean"], "key": cell["p_ext_key"],
              "enrichment_mean": cell["enrichment_mean"], "enrichment_key": cell["enrichment_key"],
              "chance_key": cell["chance_key"], "targets": []}]
    if cell.get("ar_k_key"):
        cells.append({**base, "measure": "ar_k", "label": "AR_k", "mean": None, "key": cell["ar_k_key"],
                      "enrichment_mean": None, "enrichment_key": None, "chance_key": None,
                      "targets": cell["ar_targets"]})
    return cells


def upgrade_ice(ice: dict, schema: int) -> dict:
    """A schema-3/4 ICE result (as parsed JSON) in the schema-5 layout: the attention measure (``p_ext``, ``ar_k``)
    moved from field names into a ``measure`` column; every number kept. A schema-5 result is returned as it is."""
    if schema >= 5:
        return ice
    ice = dict(ice)
    ice["attention_cells"] = [c for cell in ice.get("attention_cells", []) for c in _upgrade_cell(cell)]
    behaviour = []
    for a in ice.get("attention_behaviour", []):
        a = {"model": a["model"], "measure": "p_ext", "label": "P_ext", "has_chance": True,
             **{k: v for k, v in _rename(a, "p_ext_layers", "layer_tests").items() if k != "model"}}
        a["layers"] = [_upgrade_fit(f) for f in a.get("layers", [])]
        behaviour.append(a)
    ice["attention_behaviour"] = behaviour
    return ice


__all__ = ["upgrade_ice"]
