"""Which models the engine measures: the conformance table, the layers whose attention goes through transformers'
``AttentionInterface``, and the check made when a probe or an edit attaches (docs/architectures.md).

Support is what the conformance suite (tests/attention/conformance/) verifies, not a list: ``architectures.json`` beside this
module is written by ``scripts/architectures.py`` from the suite's findings for every causal-LM model type of the
installed transformers, each a verdict: the checks it passed and its largest error against its own eager attention,
or the reason it is refused. :func:`check_architecture` refuses a model whose type the suite refused (with the
reason it found) or never saw.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from probe import formatting as fmt
from probe.errors import HookError

TABLE = Path(__file__).with_name("architectures.json")
# The checks of the suite, in the order it runs them (docs/architectures.md#what-the-suite-checks).
CHECKS: tuple[str, ...] = ("masses", "value", "answer", "edit")
# Words a module's forward uses when it dispatches its attention through the interface.
_DISPATCH = ("ALL_ATTENTION_FUNCTIONS", "AttentionInterface")


@dataclass(frozen=True)
class Verdict:
    """What the conformance suite found for one model type.

    Attributes:
        model_type: ``config.model_type``.
        verified: the checks it passed (:data:`CHECKS`); all of them for a supported type.
        max_error: the largest absolute difference from its own eager attention over every check it passed.
        reason: why it is refused (None when supported).
        notes: what the probe measures differently on it (learned sinks, layers without attention), for the docs.
    """

    model_type: str
    verified: tuple[str, ...] = ()
    max_error: float | None = None
    reason: str | None = None
    notes: str = ""

    @property
    def supported(self) -> bool:
        return self.reason is None


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    """:data:`TABLE` as written (read once; an empty table when the file is absent)."""
    if not TABLE.is_file():
        return {"transformers": "none", "types": {}}
    return dict(json.loads(TABLE.read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=1)
def verdicts() -> dict[str, Verdict]:
    """Every model type's verdict from :data:`TABLE` (empty when the file is absent)."""
    return {t: Verdict(model_type=t, verified=tuple(v.get("verified", ())), max_error=v.get("max_error"),
                       reason=v.get("reason"), notes=v.get("notes", "")) for t, v in _table()["types"].items()}


def table_transformers() -> str:
    """The transformers version the table was written with."""
    return str(_table().get("transformers", "unknown"))


def model_type_of(model_or_config: Any) -> str | None:
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, "model_type", None)


def refusal(model_type: str | None) -> str | None:
    """Why the engine refuses ``model_type`` (None when the suite verified it)."""
    verdict = verdicts().get(model_type or "")
    if verdict is None:
        return (f"architecture {model_type!r} was not checked by the conformance suite (its table was written with "
                f"transformers {table_transformers()}); run `python scripts/architectures.py --types {model_type}` "
                "to check it here")
    return verdict.reason


_UNVERIFIED: contextvars.ContextVar[bool] = contextvars.ContextVar("ice_probe_unverified", default=False)


@contextmanager
def checking_unverified() -> Iterator[None]:
    """Inside the block the engine attaches to any architecture, and computes every measure: for the conformance
    suite, which finds out what holds (scripts/architectures.py), never for a measurement."""
    token = _UNVERIFIED.set(True)
    try:
        yield
    finally:
        _UNVERIFIED.reset(token)


def value_measures_apply(model: Any) -> bool:
    """Whether the suite verified the value-weighted measures on the model's type (an architecture whose attention
    output is gated before its output projection has no ``‖v W_O‖`` per key: those measures are left out)."""
    if _UNVERIFIED.get():
        return True
    verdict = verdicts().get(model_type_of(model) or "")
    return verdict is not None and "value" in verdict.verified


def check_architecture(model: Any) -> None:
    """Raise :class:`HookError` unless the conformance suite verified the model's architecture.

    Raises:
        HookError: naming the model type and the reason the suite found (or that it never checked the type).
    """
    why = None if _UNVERIFIED.get() else refusal(model_type_of(model))
    if why is not None:
        raise HookError(f"the attention probe does not support {type(model).__name__} "
                        f"(model_type {model_type_of(model)!r}): {why}")


def dispatches(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward sends its attention through transformers' ``AttentionInterface`` (read from its
    source: the dispatch is a lookup in ``ALL_ATTENTION_FUNCTIONS``)."""
    cls = type(module)
    if cls not in _DISPATCHING:
        _DISPATCHING[cls] = _class_dispatches(cls)
    return _DISPATCHING[cls]


_DISPATCHING: dict[type, bool] = {}


def _class_dispatches(cls: type) -> bool:
    forward = getattr(cls, "forward", None)
    if forward is None:
        return False
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return any(word in source for word in _DISPATCH)


def attention_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Layer index -> the attention module of that layer that dispatches through the interface. The indices are the
    model's own (``layer_idx``): a hybrid model's state-space or linear-attention layers are absent. A module shared
    by several layers (Zamba's one attention block, its ``layer_idx`` not a layer) counts for each decoder layer that
    holds it (:func:`decoder_layers`)."""
    n_layers = n_layers_of(model)
    found: dict[int, torch.nn.Module] = {}
    shared: list[torch.nn.Module] = []
    for module in model.modules():
        if not dispatches(module):
            continue
        layer = getattr(module, "layer_idx", None)
        if isinstance(layer, int) and 0 <= layer < n_layers:
            found.setdefault(layer, module)
        else:
            shared.append(module)
    if shared:
        for i, block in enumerate(decoder_layers(model) or []):
            inside = {id(m) for m in block.modules()}
            for module in shared:
                if id(module) in inside:
                    found.setdefault(i, module)
    return dict(sorted(found.items()))


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's list of decoder layers: its first ``ModuleList`` with one entry per layer (None if it has none)."""
    n_layers = n_layers_of(model)
    return next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers), None)


_CURRENT_LAYER: contextvars.ContextVar[int | None] = contextvars.ContextVar("ice_probe_layer", default=None)


def _own_layer(module: torch.nn.Module) -> bool:
    layer = getattr(module, "layer_idx", None)
    return isinstance(layer, int) and layer >= 0


def layer_of(module: torch.nn.Module) -> int | None:
    """The layer an attention module's call belongs to: its ``layer_idx``, or, for a module shared between layers,
    the decoder layer running it (:func:`shared_layers`); None when neither is known."""
    return int(getattr(module, "layer_idx")) if _own_layer(module) else _CURRENT_LAYER.get()


@contextmanager
def shared_layers(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, a call of an attention module shared between layers is told which decoder layer runs it
    (forward hooks on the decoder layers set it for :func:`layer_of`); nothing is hooked where every attention
    module names its own layer."""
    blocks = decoder_layers(model)
    needs = blocks is not None and any(dispatches(m) and not _own_layer(m) for m in model.modules())
    if not needs:
        yield
        return
    assert blocks is not None
    handles, tokens = [], []

    def enter(i: int) -> Any:
        def hook(_m: torch.nn.Module, _args: Any) -> None:
            tokens.append(_CURRENT_LAYER.set(i))
        return hook

    def leave(_m: torch.nn.Module, _args: Any, _out: Any) -> None:
        if tokens:
            _CURRENT_LAYER.reset(tokens.pop())

    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(enter(i)))
        handles.append(block.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def attention_layers(model: torch.nn.Module) -> tuple[int, ...]:
    """The layers whose attention the probe measures (:func:`attention_modules`), cached on the model."""
    cached = getattr(model, "_ice_probe_attention_layers", None)
    if cached is None:
        cached = tuple(attention_modules(model))
        try:
            setattr(model, "_ice_probe_attention_layers", cached)
        except AttributeError:  # pragma: no cover - a frozen wrapper
            pass
    return cached


def n_layers_of(model_or_config: Any) -> int:
    """The model's depth: ``num_hidden_layers`` of its text config (the layer axis of every probe array)."""
    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise HookError(f"{type(config).__name__} names no number of layers (num_hidden_layers)")


def read_config(path_or_id: str) -> Any:
    """A model's config from its ``config.json`` alone: a local folder (or the file itself), or a hub id already in
    the local hub cache. Nothing is downloaded, no weight is read, no remote code is run.

    Raises:
        HookError: no config.json there, or one transformers cannot read (the message names the file).
    """
    from transformers import AutoConfig

    p = Path(path_or_id).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        looks_local = path_or_id.startswith(("/", ".", "~")) or p.suffix == ".json" or p.parent.exists() \
            and p.parent != Path(".") or path_or_id.count("/") != 1
        if looks_local:
            raise HookError(f"{path_or_id}: no config.json there (give a model folder, its config.json, or a hub id "
                            "owner/name whose config is in the local hub cache)")
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(path_or_id, "config.json")
        except ValueError as e:  # not a valid hub id
            raise HookError(f"{path_or_id}: neither a folder nor a hub id ({e})") from None
        if not isinstance(cached, str):
            raise HookError(f"{path_or_id}: its config.json is not in the local hub cache; nothing is downloaded "
                            "here: fetch the model's config.json into a folder and give that folder")
        p = Path(cached)
    try:
        return AutoConfig.from_pretrained(str(p), trust_remote_code=False)
    except (ValueError, KeyError, OSError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise HookError(f"{p}: transformers cannot read this config ({first})") from None


def describe(config: Any) -> tuple[bool, list[str]]:
    """Whether the probe supports the model a config describes, and what it will and will not measure, from the
    config alone: the model is built on the meta device (no memory, no weights) to find its attention layers.

    Returns:
        (supported, lines to print).
    """
    from transformers import AutoModelForCausalLM

    model_type = model_type_of(config)
    verdict = verdicts().get(model_type or "")
    lines = [f"model type: {model_type} ({type(config).__name__})"]
    why = refusal(model_type)
    if why is not None:
        lines.append(f"supported: no: {why}")
        return False, lines
    assert verdict is not None
    lines.append(f"supported: yes: verified by the conformance suite (checks {', '.join(verdict.verified)}; "
                 f"largest error against its own eager attention {verdict.max_error:.1e})")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - a config that builds no model: say so, the verdict stands
        lines.append(f"layers: unknown (transformers cannot build the model from this config: {type(e).__name__})")
        return True, lines
    text = config.get_text_config()
    n_layers = n_layers_of(config)
    layers = attention_layers(model)
    heads, kv = getattr(text, "num_attention_heads", "?"), getattr(text, "num_key_value_heads", None)
    lines.append(f"layers: {n_layers}; attention in " + ("all of them" if len(layers) == n_layers else
                 f"{len(layers)}: {fmt.int_ranges(layers)}") + f"; {heads} query heads" + (f" over {kv} key/value heads"
                                                                                        if kv and kv != heads else ""))
    measured = ["segment masses", "P_ext and its chance level", "AR_k", "the attention while the answer is written",
                "knockout and steer interventions"]
    if "value" in verdict.verified:
        measured.insert(3, "value-weighted shares")
    lines.append("measures: " + ", ".join(measured))
    absent = [i for i in range(n_layers) if i not in layers]
    if absent:
        lines.append(f"not measured: {fmt.layers_have(absent)} no attention (state-space or linear layers): their rows of every map "
                     "are empty (NaN)")
    if "value" not in verdict.verified:
        lines.append("not measured: value-weighted shares (the attention output is gated or normalised before its "
                     "output projection)")
    if verdict.notes:
        lines.append(f"notes (from the suite's tiny model): {verdict.notes}")
    return True, lines


__all__ = ["CHECKS", "TABLE", "Verdict", "attention_layers", "attention_modules", "check_architecture",
           "checking_unverified", "decoder_layers", "describe", "dispatches", "layer_of", "read_config",
           "shared_layers",
           "model_type_of", "n_layers_of", "refusal", "table_transformers", "value_measures_apply", "verdicts"]
