"""docs/architectures.md from the conformance table (probe/attention/architectures.json): written by
scripts/architectures.py, compared by tests/attention/conformance/test_conformance.py."""

from __future__ import annotations

from typing import Any

HEADER = """# Architectures

Which models the attention probe measures is decided by a conformance suite, not by a list: for every causal-LM
model type of the installed transformers, `scripts/architectures.py` builds a tiny random-weight model from the
type's own config class and holds the probe to that model's own eager attention. This page is written by that
script from what the suite found (do not edit it by hand); a test fails when it disagrees with the suite.

## What the suite checks

Each model has 2-4 layers (one of every kind of layer the architecture mixes: sliding and full, chunked, attention
and state-space, dense and mixture-of-experts), a hidden size of 64, grouped-query attention where the config has
it, a vocabulary of 128; float32, eval mode. On prompts of sink, instruction, germane, extraneous and question
segments the checks are, in order:

| check | what is compared with the model's own eager attention |
| --- | --- |
| masses | per-segment masses, P_ext and its chance level on the question rows, AR_k's rows |
| value | the value-weighted share: each key weighted by the norm of what it adds through the layer's own output projection, with the layer's own value width |
| answer | the attention while a 5-token answer is generated greedily with the model's own cache (sliding, hybrid, latent caches) |
| edit | the logits under a knockout and a steer of the extraneous keys, against a hand-written attention with the same keys masked or scaled, itself held to the eager logits first |

The tolerance is {tol:g} on every check: absolute on masses and shares, relative to the largest logit on the edit
check's logits (float32 throughout: mixture-of-experts kernels take no float64). Where the answer check fails, the
suite also measures how far the model's own logits move between a cached generation and an uncached forward, and
names it: a model whose cache is not exact to that tolerance cannot be held to an uncached eager pass. A type passes when every check holds, except that `value` may
be left out: an architecture whose attention output is gated or normalised before its output projection has no
‖v W_O‖ per key, and the probe leaves the value-weighted measures out of its records (the table says so). A
type that fails a check, or that the interface does not reach, is refused when a probe or an edit attaches to
it, with the reason below. `probe models --check PATH` reads a model's `config.json` and says the same without
loading weights.

What the probe measures where architectures differ: [probes.md](probes.md#architectures).
"""


def render_markdown(table: dict[str, Any], tol: float = 1e-5) -> str:
    """The page: the header, then the verified types, then the refused ones, each sorted by name."""
    types = table["types"]
    verified = {t: e for t, e in types.items() if "reason" not in e}
    refused = {t: e for t, e in types.items() if "reason" in e}
    lines = [HEADER.format(tol=tol).rstrip(), "",
             f"transformers {table['transformers']}: {len(types)} causal-LM model types, {len(verified)} verified, "
             f"{len(refused)} refused.", "", "## Verified", "",
             "| model type | checks passed | largest error | notes |", "| --- | --- | --- | --- |"]
    for t, e in sorted(verified.items()):
        err = e.get("max_error")
        lines.append(f"| `{t}` | {', '.join(e['verified'])} | {'' if err is None else f'{err:.1e}'} | "
                     f"{_cell(e.get('notes', ''))} |")
    lines += ["", "## Refused", "", "| model type | reason |", "| --- | --- |"]
    for t, e in sorted(refused.items()):
        lines.append(f"| `{t}` | {_cell(e['reason'])} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["render_markdown"]
