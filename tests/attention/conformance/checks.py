"""The conformance suite: each causal-LM model type's tiny model (tests/attention/conformance/models.py) held to its own eager
attention, check by check (docs/architectures.md#what-the-suite-checks):

- ``masses``: the segment masses, P_ext and AR_k's rows of a prompt of sink / instruction / germane / extraneous /
  question segments (``probe_tokenized`` against ``reference_segment_attention``, which reads the weights each
  layer's own eager function returned);
- ``value``: the value-weighted shares, with the layer's own value width and the linear map its output goes into;
- ``answer``: the attention while a 5-token answer is generated greedily with the model's own cache, against the
  eager rows of prompt + answer;
- ``edit``: the logits under a knockout and a steer of the extraneous keys, against a hand-written attention with
  the same keys masked or scaled (itself held to the eager logits of the unedited model first).

A check that raises or misses the tolerance stops the type there: it is refused with the reason found. The
structural refusals come first: encoder-decoder models, bidirectional attention, no layer that dispatches through
the interface, an attention module shared between layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probe.attention import left_pad, probe_tokenized, reference_segment_attention
from probe.attention.architecture import CHECKS, attention_modules, checking_unverified, n_layers_of
from probe.attention.decode import reference_answer_attention
from probe.attention.reference import eager_calls
from probe.attention.engine import probe_generation
from probe.attention.implementation import IMPLEMENTATION, attention_implementation
from probe.attention.implementation import _register as register_engine
from probe.attention.intervention import apply_intervention
from probe.attention.measures import measures
from probe.interventions import Intervention
from probe.probe_options import ProbeOptions
from probe.types import Span, TokenizedPrompt
from tests.attention.conformance.models import VOCAB, build

# The tolerance every check is held to: absolute on masses and shares in [0, 1] (and AR_k's sums of cosines), and
# relative to the largest logit on the edit check's logits; float32 throughout (mixture-of-experts kernels take no
# float64). Two float32 computations of one softmax row differ by the rounding of the scores: up to a few 1e-6 seen
# here; a wrong mask, a missed sink, a window or a value width moves a mass by 1e-3 and more, and an edit applied to
# the wrong keys moves the logits by 1e-2 of their scale and more.
TOL = 1e-5
N_NEW = 5


@dataclass
class Finding:
    """What the suite found for one model type (written to probe/attention/architectures.json)."""

    model_type: str
    verified: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def max_error(self) -> float | None:
        return max(self.errors.values()) if self.errors else None

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verified": self.verified}
        if self.max_error is not None:
            out["max_error"] = float(f"{self.max_error:.3g}")
        if self.reason is not None:
            out["reason"] = self.reason
        if self.notes:
            out["notes"] = "; ".join(self.notes)
        return out


class Refused(Exception):
    """A check failed: the message is the reason the type is refused."""


def prompt(seed: int = 3, n_tokens: int = 48) -> TokenizedPrompt:
    """Random ids with a chat-like span layout: sink, instruction, germane and extraneous interleaved, question."""
    rng = np.random.default_rng(seed)
    kinds = ["sink", "instruction", "extraneous", "germane", "extraneous", "germane", "extraneous", "question", "sink"]
    cuts = np.sort(rng.choice(np.arange(2, n_tokens - 1), size=len(kinds) - 1, replace=False))
    bounds = [0, *cuts.tolist(), n_tokens]
    spans = tuple(Span(k, bounds[i], bounds[i + 1], label=f"{k}{i}") for i, k in enumerate(kinds))
    return TokenizedPrompt(input_ids=tuple(int(x) for x in rng.integers(3, VOCAB, size=n_tokens)), spans=spans)


def _difference(a: np.ndarray, b: np.ndarray, what: str) -> float:
    if a.shape != b.shape:
        raise Refused(f"{what}: shape {a.shape} against eager's {b.shape}")
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        raise Refused(f"{what}: NaN where eager has a value (or the reverse)")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0


def _held(errors: dict[str, float], name: str, what: str) -> None:
    if errors[name] > TOL:
        raise Refused(f"{what} differs from its own eager attention by {errors[name]:.2g} (tolerance {TOL:g})")


def structure(model: PreTrainedModel) -> None:
    """The structural refusals (module docstring)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise Refused("an encoder-decoder model: the probe measures a decoder's causal self-attention over the prompt")
    modules = attention_modules(model)
    if not modules:
        raise Refused("no layer sends its attention through transformers' AttentionInterface (the engine plugs in "
                      "there)")
    if any(getattr(m, "is_causal", True) is False for m in modules.values()):
        raise Refused("bidirectional attention (is_causal = False): an encoder, not a causal decoder")


def check_masses(model: PreTrainedModel, finding: Finding) -> None:
    tp = prompt()
    options = ProbeOptions(block_size=7)
    got = probe_tokenized(model, tp, options)
    want = reference_segment_attention(model, tp, options)
    plain = [m.id for m in measures() if not m.needs_values]
    finding.errors["masses"] = max(_difference(got[m], want[m], m) for m in plain)
    finding.errors["masses"] = max(finding.errors["masses"], _difference(got.chance, want.chance, "chance"))
    _held(finding.errors, "masses", "the segment masses, P_ext or AR_k")
    total = got["seg_mass"].sum(axis=-1)  # NaN in layers without attention
    if np.nanmin(total) < 1 - 1e-4:
        finding.notes.append(f"learned sinks: up to {1 - np.nanmin(total):.2f} of a row's mass goes to no key")
    layers = list(attention_modules(model))
    if len(layers) < n_layers_of(model):
        finding.notes.append(f"attention in layers {layers} of {n_layers_of(model)} (the others have none)")


def check_value(model: PreTrainedModel, finding: Finding) -> None:
    tp = prompt(seed=5)
    got = probe_tokenized(model, tp, ProbeOptions())
    try:
        want = reference_segment_attention(model, tp, ProbeOptions())
    except Exception as e:  # noqa: BLE001 - the reference's reason is the refusal's
        raise Refused(f"{e}") from None
    ids = [m.id for m in measures() if m.needs_values]
    if any(m not in want.measures for m in ids):
        raise Refused("the attention output is gated or normalised before its output projection, so no key has a "
                      "‖v W_O‖ of its own")
    if any(m not in got.measures for m in ids):
        raise Refused("the engine finds no output projection by name (probe.attention.measures.value."
                      "OUTPUT_PROJECTIONS) where the attention output goes into one")
    finding.errors["value"] = max(_difference(got[m], want[m], m) for m in ids)
    _held(finding.errors, "value", "the value-weighted share")


def check_answer(model: PreTrainedModel, finding: Finding, value: bool) -> None:
    prompts = [prompt(seed=11, n_tokens=36), prompt(seed=12, n_tokens=44)]
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    generate: Any = model.generate  # transformers' stubs type the mixin's method loosely
    with torch.no_grad(), probe_generation(model, prompts, pads, ProbeOptions(answer=True)) as cap:
        out = generate(input_ids=ids, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False,
                             pad_token_id=0, min_new_tokens=N_NEW)
    answers = [out[i, ids.shape[1]:].tolist() for i in range(len(prompts))]
    assert cap.answer is not None
    got = cap.answer.results(answers, [tp.input_ids for tp in prompts])
    error = 0.0
    for tp, answer, g in zip(prompts, answers, got):
        ref = reference_answer_attention(model, tp, answer)
        error = max(error, _difference(g.mass, ref.mass, "answer mass"))
        if value and g.vmass is not None and ref.vmass is not None:
            error = max(error, _difference(g.vmass, ref.vmass, "answer value mass"))
    finding.errors["answer"] = error
    if error > TOL:
        drift = cache_drift(model, prompts[0])
        if drift > TOL:  # the model's own cache moves its numbers: hold the capture to its eager cached decoding
            why = (f"the attention while the answer is generated with the model's cache differs from its own eager "
                   f"attention by {error:.2g}, and the model's own cached and uncached forwards differ by {drift:.2g} "
                   "of its largest logit")
            cached = 0.0
            try:
                for tp, answer, g in zip(prompts, answers, got):
                    mass, vmass = cached_answer_reference(model, tp, answer)
                    cached = max(cached, _difference(g.mass, mass, "answer mass (cached eager)"))
                    if value and g.vmass is not None:
                        cached = max(cached, _difference(g.vmass, vmass, "answer value mass (cached eager)"))
            except Refused as e:
                raise Refused(f"{why}; {e}") from None
            if cached > TOL:
                raise Refused(f"{why}; against its eager decoding with its own cache: {cached:.2g}")
            finding.errors["answer"] = cached
            finding.notes.append(f"the answer capture is held to the model's eager decoding with its own cache: its "
                                 f"cached and uncached forwards differ by {drift:.2g} of the largest logit")
    _held(finding.errors, "answer", "the attention while the answer is generated with the model's cache")


def cached_answer_reference(model: PreTrainedModel, tp: TokenizedPrompt, answer: list[int]
                            ) -> tuple[np.ndarray, np.ndarray]:
    """Answer masses and value-weighted shares (t, layer, head, segment + generated) from the model's own eager
    attention while it decodes ``answer`` one token at a time with its own cache: each step's eager weights, values
    and output projection as :func:`probe.attention.reference.eager_calls` records them (float64). Only for a cache
    that keeps every key (a sliding cache's keys are not positions: refused)."""
    n_prompt, spans = len(tp.input_ids), [(s.start, s.end) for s in tp.spans] + [(len(tp.input_ids), 10**9)]
    n_heads = int(model.config.num_attention_heads)
    mass = np.full((len(answer), n_layers_of(model), n_heads, len(spans)), np.nan)
    vmass = mass.copy()
    past, step_ids = None, torch.tensor([list(tp.input_ids)])
    with torch.no_grad(), attention_implementation(model, "eager"):
        for t in range(len(answer)):
            with eager_calls(model) as seen:
                out = model(step_ids, cache=past, use_cache=True,
                            cache_position=torch.arange(n_prompt + t - step_ids.shape[1], n_prompt + t))
            past, step_ids = out.cache, torch.tensor([[answer[t]]])
            for layer, eager in seen.items():
                row = eager.weights[:, -1]  # (H, keys): the query of position n_prompt - 1 + t
                if row.shape[-1] != n_prompt + t:  # a cache that keeps a window: keys are not positions
                    raise Refused(f"layer {layer}'s cache holds {row.shape[-1]} of {n_prompt + t} keys while "
                                  "decoding: the cached eager reference cannot place them")
                dim, rep = eager.values.shape[-1], n_heads // eager.values.shape[0]
                w = eager.out_proj if eager.out_proj is not None else np.full((n_heads * dim, 1), np.nan)
                norms = np.stack([np.linalg.norm(eager.values[h // rep] @ w[h * dim:(h + 1) * dim], axis=-1)
                                  for h in range(n_heads)])
                for s, (a, b) in enumerate(spans):
                    mass[t, layer, :, s] = row[:, a:b].sum(-1)
                    vmass[t, layer, :, s] = (row * norms)[:, a:b].sum(-1)
    with np.errstate(invalid="ignore"):
        return mass, vmass / vmass.sum(axis=-1, keepdims=True)


def cache_drift(model: PreTrainedModel, tp: TokenizedPrompt) -> float:
    """How far the model's own logits move between a greedy generation with its cache and one uncached forward over
    the same tokens, relative to the largest logit (a model whose cache is exact to float32 rounding: ~1e-6)."""
    ids = torch.tensor([list(tp.input_ids)])
    generate: Any = model.generate
    with torch.no_grad():
        out = generate(ids, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
        full = model(out.sequences, use_cache=False).logits[0, ids.shape[1] - 1: ids.shape[1] - 1 + N_NEW]
    cached = torch.stack(out.logits, dim=1)[0]
    return float((cached - full).abs().max()) / max(1.0, float(full.abs().max()))


# --- the edit check: a hand-written attention, in float64, with the edit applied by hand ---------------------------

REF = "ice_probe_conformance_ref"
_STATE: dict[str, Any] = {}


def _ref_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   softcap: float | None = None, s_aux: torch.Tensor | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    n_b, n_h, n_q, _ = query.shape
    n_k = key.shape[2]
    rep = n_h // key.shape[1]
    k = key.double().repeat_interleave(rep, dim=1)
    v = value.double().repeat_interleave(rep, dim=1)
    scale = float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5
    s: torch.Tensor = torch.matmul(query.double(), k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    qpos = torch.arange(n_k - n_q, n_k)
    if attention_mask is None:
        allowed = (torch.arange(n_k)[None, :] <= qpos[:, None])[None, None]
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[:, :, :, :n_k]
    else:
        allowed = attention_mask[:, :, :, :n_k] == 0
    s = s.masked_fill(~allowed, float("-inf"))
    edit = _STATE.get("edit")
    edges = torch.zeros(n_b, n_h, n_q, n_k, dtype=torch.bool)
    if edit is not None:
        for b in range(n_b):
            for qi in range(n_q):
                pos = int(qpos[qi])
                if pos >= edit["qstart"][b]:
                    for kk in edit["keys"][b]:
                        if kk != pos and kk < n_k:
                            edges[b, :, qi, kk] = True
        if edit["kind"] == "knockout":
            s = s.masked_fill(edges, float("-inf"))
    if s_aux is not None:
        sink = s_aux.double().view(1, -1, 1, 1).expand(n_b, n_h, n_q, 1)
        p_all = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)
        p, p_sink = p_all[..., :-1], p_all[..., -1:]
    else:
        p, p_sink = torch.softmax(s, dim=-1), None
    p = torch.nan_to_num(p)  # a padding row that sees no key
    if edit is not None and edit["kind"] == "steer":  # scale the chosen weights by alpha, renormalise the row
        p = torch.where(edges, p * edit["alpha"], p)
        total = p.sum(-1, keepdim=True) + (p_sink if p_sink is not None else 0)
        p = p / total.clamp_min(1e-300)
    out = torch.matmul(p, v).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(REF, _ref_attention)
AttentionMaskInterface.register(REF, sdpa_mask)


def _logits(model: PreTrainedModel, prompts: list[TokenizedPrompt], implementation: str | None,
            spec: Intervention | None = None) -> torch.Tensor:
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}
    if implementation is None:  # the engine's edit
        assert spec is not None
        with torch.no_grad(), apply_intervention(model, prompts, spec) as batch:
            return model(batch.input_ids, attention_mask=batch.attention_mask, position_ids=kwargs["position_ids"],
                         use_cache=False).logits
    _STATE["edit"] = None if spec is None else {
        "keys": [[pad + p for s in tp.spans if s.kind == spec.keys for p in range(s.start, s.end)]
                 for tp, pad in zip(prompts, pads)],
        "qstart": [pad + min(s.start for s in tp.spans if s.kind == "question") for tp, pad in zip(prompts, pads)],
        "kind": spec.kind, "alpha": spec.alpha}
    try:
        with torch.no_grad(), attention_implementation(model, implementation):
            return model(ids, use_cache=False, **kwargs).logits
    finally:
        _STATE.clear()


def check_edit(model: PreTrainedModel, finding: Finding) -> None:
    prompts = [prompt(seed=21, n_tokens=40), prompt(seed=22, n_tokens=30)]
    _, mask, _ = left_pad([tp.input_ids for tp in prompts])
    real = mask.bool().numpy()  # the logits of padding positions are nobody's

    eager = _logits(model, prompts, "eager")
    scale = max(1.0, float(eager.abs().max()))

    def diff(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
        """Relative to the largest logit: float32 logits of magnitude s round at about 1e-7 s."""
        return _difference(a.numpy()[real], b.numpy()[real], what) / scale

    by_hand = _logits(model, prompts, REF)
    base = diff(by_hand, eager, "logits of the hand-written attention")
    if base > TOL:
        raise Refused(f"edit: the hand-written reference attention differs from eager by {base:.2g} on this "
                      "architecture, so the edits cannot be held to it")
    error = base
    for spec in (Intervention(kind="knockout", keys="extraneous"),
                 Intervention(kind="steer", alpha=2.5, keys="extraneous")):
        got = _logits(model, prompts, None, spec)
        want = _logits(model, prompts, REF, spec)
        error = max(error, diff(got, want, f"{spec.kind} logits"))
    finding.errors["edit"] = error
    _held(finding.errors, "edit", "the knockout / steer logits")


def conform(model_type: str, builder: Callable[[str], PreTrainedModel] = build) -> Finding:
    """Every check of one model type (module docstring), stopping at the first that fails."""
    finding = Finding(model_type)
    try:
        try:
            model = builder(model_type)
        except Exception as e:  # noqa: BLE001 - any failure to build is the reason
            raise Refused(f"the suite cannot build a tiny model from its config ({type(e).__name__}: "
                          f"{_first_line(e)})") from None
        structure(model)
        with checking_unverified():
            try:
                register_engine()
                with attention_implementation(model, IMPLEMENTATION):
                    pass
            except Exception as e:  # noqa: BLE001
                raise Refused(f"the model does not accept an attention implementation of the interface "
                              f"({_first_line(e)})") from None
            for name, run in (("masses", lambda: check_masses(model, finding)),
                              ("value", lambda: check_value(model, finding)),
                              ("answer", lambda: check_answer(model, finding, "value" in finding.verified)),
                              ("edit", lambda: check_edit(model, finding))):
                try:
                    run()
                except Refused as e:
                    if name == "value":  # the measures that read value states are left out; the rest holds
                        finding.notes.append(f"no value-weighted measures ({e})")
                        continue
                    raise
                except Exception as e:  # noqa: BLE001
                    raise Refused(f"{name}: {type(e).__name__}: {_first_line(e)}") from None
                finding.verified.append(name)
    except Refused as e:
        finding.reason = str(e)
    assert all(c in CHECKS for c in finding.verified)
    return finding


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


__all__ = ["Finding", "TOL", "conform", "prompt"]
