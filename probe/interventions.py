"""The intervention types: :class:`InterventionSpec` (an experiment's ``[[interventions]]`` table) and
:class:`Intervention` (explicit layers and heads: what the engine applies and ``interventions.json`` holds), the edit
of one prompt (:class:`RowEdit`, :class:`KeyCount`), and that file's reader and writer
(docs/interventions.md#in-an-experiment)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NoReturn, Sequence

from probe.codec import ALL_WHEN_NONE, DECODE, KEY, CodecError, decode, encode
from probe.errors import ConfigError, FieldError, ProbeError
from probe.runfolder import RunFolder, write_atomic

if TYPE_CHECKING:
    import numpy as np

INTERVENTION_KINDS: tuple[str, ...] = ("knockout", "steer", "reinject")
INTERVENTION_KEYS: tuple[str, ...] = ("extraneous", "filler", "germane", "matched-random", "matched-germane")
# keys drawn at random to match another key set in number: keys -> (the span kind it matches, the span kinds it draws
# from, before the question; docs/interventions.md#key-sets)
MATCHED_DRAWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "matched-random": ("extraneous", ("instruction", "germane", "filler")),
    "matched-germane": ("germane", ("filler", "extraneous")),
}
# the matched control of a key set: an attention edit's keys -> its twin's keys; a re-injection's -> its twin's
CONTROL_KEYS: dict[str, str] = {"extraneous": "matched-random", "germane": "matched-germane"}
REINJECT_KEYS: dict[str, str] = {"germane": "filler"}
REINJECT_WHAT: tuple[str, ...] = ("germane", "filler")  # what a reinject repeats before the question
INTERVENTION_QUERIES: tuple[str, ...] = ("answer", "after")
HEAD_RANKINGS: tuple[str, ...] = ("enrichment", "p_ext", "retrieval")  # retrieval: needs answer captures
# a declared name (trial ids and record folders carry it); resolution adds '@' (a sweep's window) and '+' (a random
# control)
INTERVENTION_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# the fields resolution sets (an [[interventions]] table does not hold them)
RESOLUTION_FIELDS: tuple[str, ...] = ("group", "window", "selection", "model")
# the fields every interventions.json entry holds (the others may be absent and take their defaults)
ENTRY_KEYS = ("name", "kind", "keys", "queries", "layers", "heads")


@dataclass(frozen=True)
class LayerWindow:
    """A window of ``window`` consecutive layers swept over the depth in steps of ``stride`` (``layers = {window =
    W, stride = S}``): one intervention per window, named ``<name>@L<first>-<last>``."""

    window: int
    stride: int = 1

    def __post_init__(self) -> None:
        if self.window < 1 or self.stride < 1:
            raise ConfigError(f"layers = {{window = {self.window}, stride = {self.stride}}}: both must be >= 1")


@dataclass(frozen=True)
class TopHeads:
    """The ``top_k`` heads by ``by`` (mean over the prompts of a separate probe run, the run folder ``from_run``;
    TOML key ``from``), and with ``random_control`` a second intervention ``<name>+random`` on as many random
    heads."""

    top_k: int
    from_run: str = field(metadata={KEY: "from"})
    by: str = "enrichment"
    random_control: bool = False

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ConfigError(f"heads.top_k: {self.top_k} must be >= 1")
        if not self.from_run:
            raise ConfigError("heads.from: name the run folder of a separate probe run to take the heads from")
        if self.by not in HEAD_RANKINGS:
            raise ConfigError(f"heads.by: {self.by!r}; use one of {', '.join(HEAD_RANKINGS)}")


@dataclass(frozen=True)
class HeadSelection:
    """How the heads of a top-k intervention (or of its random control) were chosen.

    Attributes:
        from_run: the separate probe run whose records ranked the heads (``from`` in ``interventions.json``).
        k: number of heads.
        by: the per-head measure ranked by (``enrichment``, ``p_ext`` or ``retrieval``; None when not recorded).
        n_prompts: the records averaged (None when not recorded).
        control_of: for a random-heads control, the name of the top-k intervention it controls; None for the top-k
            intervention itself.
    """

    from_run: str = field(metadata={KEY: "from"})
    k: int
    by: str | None = None
    n_prompts: int | None = None
    control_of: str | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise FieldError("HeadSelection", "k", f"{self.k} must be >= 1")
        if self.by is not None and self.by not in HEAD_RANKINGS:
            raise FieldError("HeadSelection", "by", f"{self.by!r}; use one of {', '.join(HEAD_RANKINGS)}")
        if self.n_prompts is not None and self.n_prompts < 0:
            raise FieldError("HeadSelection", "n_prompts", f"{self.n_prompts} must be >= 0")


def _decode_layers(data: Any, where: str, arrays: Any) -> tuple[int, ...] | LayerWindow | None:
    if data == "all":
        return None
    if isinstance(data, (list, dict)):
        return decode(tuple[int, ...] | LayerWindow, data, where)
    raise CodecError(where, f"{data!r}; use \"all\", a list of layers or {{window = W, stride = S}}")


def _decode_heads(data: Any, where: str, arrays: Any) -> tuple[tuple[int, int], ...] | TopHeads | None:
    if data == "all":
        return None
    if isinstance(data, (list, dict)):
        return decode(tuple[tuple[int, int], ...] | TopHeads, data, where)
    raise CodecError(where, f"{data!r}; use \"all\", a list of [layer, head] pairs or "
                     "{top_k = K, from = \"<run folder>\"}")


UNRESOLVED = ("a layer sweep or top-k heads: an Intervention names explicit layers and heads (an experiment's "
              "[[interventions]] table declares sweeps and selections, and `probe run` resolves them for a model)")


def _explicit(data: Any, where: str, kind: Any) -> Any:
    if data == "all":
        return None
    if isinstance(data, dict):
        raise CodecError(where, UNRESOLVED)
    if isinstance(data, list):
        return decode(kind, data, where)
    raise CodecError(where, f"{data!r}; use \"all\" or a list")


def _decode_explicit_layers(data: Any, where: str, arrays: Any) -> tuple[int, ...] | None:
    return _explicit(data, where, tuple[int, ...])


def _decode_explicit_heads(data: Any, where: str, arrays: Any) -> tuple[tuple[int, int], ...] | None:
    return _explicit(data, where, tuple[tuple[int, int], ...])


@dataclass(frozen=True)
class _Edit:
    """What every intervention states besides its layers and heads: the edit and the prompts it runs on (the fields
    and checks :class:`InterventionSpec` and :class:`Intervention` share)."""

    kind: str
    keys: str = "extraneous"
    queries: str = "answer"
    alpha: float | None = None
    conditions: tuple[str, ...] | None = field(default=None, kw_only=True)
    loads: tuple[int, ...] | None = field(default=None, kw_only=True)

    def applies_to(self, condition: str, load: int) -> bool:
        """Whether a prompt of ``condition`` at ``load`` (0 for Control) runs under this intervention."""
        return ((self.conditions is None or condition in self.conditions)
                and (self.loads is None or load in self.loads))

    @property
    def edits_attention(self) -> bool:
        """A knockout or a steer (it needs the model's attention); a ``reinject`` edits the prompt only."""
        return self.kind != "reinject"

    @property
    def control_keys(self) -> str | None:
        """The keys of this intervention's matched control (its twin in the analysis' specific contrast), or None
        when it is no tested arm (docs/interventions.md#the-effect-and-the-recovered-share)."""
        return (CONTROL_KEYS if self.edits_attention else REINJECT_KEYS).get(self.keys)

    def _refuse(self, field_name: str, problem: str) -> NoReturn:
        raise FieldError(f"interventions[{getattr(self, 'name', '?')!r}]", field_name, problem)

    def _check(self, layers: Any, heads: Any) -> None:
        self._check_edit()
        self._check_where()
        if self.kind == "reinject" and (heads is not None or isinstance(layers, LayerWindow)):
            self._refuse("heads" if heads is not None else "layers", "a reinject edits the prompt, not attention: "
                         "remove layers and heads")
        if isinstance(layers, tuple) and (not layers or any(x < 0 for x in layers) or len(set(layers)) != len(layers)):
            self._refuse("layers", f"{list(layers)} must be distinct layer indices >= 0")
        if isinstance(heads, tuple) and (not heads or any(x < 0 for pair in heads for x in pair)):
            self._refuse("heads", f"{[list(h) for h in heads]} must be [layer, head] pairs >= 0")
        if isinstance(layers, tuple) and isinstance(heads, tuple):
            outside = sorted({layer for layer, _ in heads} - set(layers))
            if outside:
                self._refuse("heads", f"layers {outside} are not in layers {list(layers)}")

    def _check_edit(self) -> None:
        if self.kind not in INTERVENTION_KINDS:
            self._refuse("kind", f"{self.kind!r}; use {' or '.join(INTERVENTION_KINDS)}")
        if self.kind == "knockout" and self.alpha is not None:
            self._refuse("alpha", f"{self.alpha} has no effect on a knockout; remove it or use kind = \"steer\"")
        if self.kind == "steer" and (self.alpha is None or not self.alpha >= 0 or math.isinf(self.alpha)):
            self._refuse("alpha", f"a steer needs a finite alpha >= 0 (0 equals the knockout), got {self.alpha}")
        if self.kind == "reinject":
            if self.keys not in REINJECT_WHAT:
                self._refuse("keys", f"{self.keys!r}: a reinject repeats the germane facts (\"germane\") or as many "
                             "neutral sentences (\"filler\") before the question")
            if self.alpha is not None:
                self._refuse("alpha", f"{self.alpha} has no effect on a reinject (it edits the prompt, not attention)")
            if self.queries != "answer":
                self._refuse("queries", f"{self.queries!r} has no effect on a reinject (it edits the prompt, not "
                             "attention); remove it")
        elif self.keys not in INTERVENTION_KEYS:
            self._refuse("keys", f"{self.keys!r}; use one of {', '.join(INTERVENTION_KEYS)}")
        if self.queries not in INTERVENTION_QUERIES:
            self._refuse("queries", f"{self.queries!r}; use {' or '.join(INTERVENTION_QUERIES)}")

    def _check_where(self) -> None:
        if self.conditions is not None and (not self.conditions or len(set(self.conditions)) != len(self.conditions)):
            self._refuse("conditions", f"{list(self.conditions)} must name distinct conditions")
        if self.loads is not None and (not self.loads or len(set(self.loads)) != len(self.loads)
                                       or any(not 0 <= x <= 100 for x in self.loads)):
            self._refuse("loads", f"{list(self.loads)} must be distinct loads in percent (0 to 100)")


@dataclass(frozen=True)
class InterventionSpec(_Edit):
    """An intervention as an experiment declares it (``[[interventions]]``, docs/interventions.md#in-an-experiment):
    the fields of :class:`Intervention` but the resolution's, with ``layers`` possibly a :class:`LayerWindow` sweep
    and ``heads`` possibly :class:`TopHeads` from a separate probe run. :func:`probe.runner.resolve.
    resolve_interventions` turns it into :class:`Intervention` s for a model; nothing else reads its layers and heads.

    Raises:
        FieldError: as :class:`Intervention`, and a sweep or a selection combined with the other field.
    """

    layers: tuple[int, ...] | LayerWindow | None = field(default=None, metadata={ALL_WHEN_NONE: True,
                                                                                  DECODE: _decode_layers})
    heads: tuple[tuple[int, int], ...] | TopHeads | None = field(default=None, metadata={ALL_WHEN_NONE: True,
                                                                                         DECODE: _decode_heads})
    name: str = "intervention"

    def __post_init__(self) -> None:
        self._check(self.layers, self.heads)
        if ((isinstance(self.layers, LayerWindow) and self.heads is not None)
                or (isinstance(self.heads, TopHeads) and self.layers is not None)):
            self._refuse("layers", "a layer sweep or top-k heads stands alone: set the other one to \"all\"")

    def edit(self) -> dict[str, Any]:
        """The fields an :class:`Intervention` resolved from it keeps as they are (all but layers, heads and name)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(_Edit)}


@dataclass(frozen=True)
class Intervention(_Edit):
    """One intervention for one model: what it edits and on which prompts, in explicit layers and heads
    (docs/interventions.md). The engine applies it (:mod:`probe.attention.intervention`); the runner makes it from an
    experiment's :class:`InterventionSpec` (:mod:`probe.runner.resolve`, which sets ``group``, ``window``,
    ``selection`` and ``model``), writes it to the run folder's ``interventions.json`` (:meth:`to_json`) and the
    analysis reads it back (:meth:`from_json`).

    Attributes:
        kind: ``knockout`` or ``steer`` (attention edits), or ``reinject`` (the prompt edited: its germane facts, or
            as many neutral sentences, repeated right before the question; no attention edit).
        keys: ``extraneous``, ``filler``, ``germane``, ``matched-random`` or ``matched-germane``; a ``reinject``
            takes ``germane`` (repeat the facts) or ``filler`` (repeat as many neutral sentences).
        queries: ``answer`` or ``after`` (attention edits).
        alpha: the steering coefficient (``steer`` only, finite and >= 0; 0 equals the knockout, above 1 draws
            attention to the keys).
        conditions / loads: the prompts it runs on (None: every prompt; a load list leaves Control, load 0, out
            unless it names 0). Keyword-only.
        layers: the layers edited (0-based), or None (``"all"``) for every layer.
        heads: ``(layer, head)`` pairs edited, or None (``"all"``) for every head of ``layers``; when pairs are
            given, only these heads are edited (``layers`` must then be None or hold their layers).
        name: the name trials and records carry. The fields below are keyword-only.
        group: the declared intervention it comes from (a sweep member's sweep; its own name when not given).
        window: ``(first, last)`` layer of a layer-window sweep member, else None.
        selection: for top-k and random heads, how they were chosen (:class:`HeadSelection`), else None.
        model: the model card it was resolved for (None: not resolved for a model).

    Raises:
        FieldError: an unknown kind, key set or query set, an α that does not fit the kind, layers / heads that do
            not fit each other or the kind, a sweep or a top-k selection (those are declared in an
            :class:`InterventionSpec`), or conditions / loads named twice (the message names the field).
    """

    layers: tuple[int, ...] | None = field(default=None, metadata={ALL_WHEN_NONE: True,
                                                                   DECODE: _decode_explicit_layers})
    heads: tuple[tuple[int, int], ...] | None = field(default=None, metadata={ALL_WHEN_NONE: True,
                                                                              DECODE: _decode_explicit_heads})
    name: str = "intervention"
    _: KW_ONLY
    group: str = ""
    window: tuple[int, int] | None = None
    selection: HeadSelection | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layers, LayerWindow) or isinstance(self.heads, TopHeads):
            self._refuse("layers" if isinstance(self.layers, LayerWindow) else "heads", UNRESOLVED)
        if not self.group:
            object.__setattr__(self, "group", self.name)
        self._check(self.layers, self.heads)
        if self.window is not None and self.window[0] > self.window[1]:
            self._refuse("window", f"{list(self.window)} must be [first, last] with first <= last")

    @property
    def score_bias(self) -> float:
        """What the edit adds to a chosen pre-softmax score: −inf (knockout, α = 0) or ``log α``."""
        if self.kind == "knockout" or self.alpha == 0:
            return float("-inf")
        return math.log(float(self.alpha))  # type: ignore[arg-type]  # steer: alpha is set (checked above)

    @property
    def centre(self) -> float | None:
        """The window's centre layer ((first + last) / 2), None outside a sweep."""
        return None if self.window is None else (self.window[0] + self.window[1]) / 2

    def twin_key(self) -> tuple[Any, ...]:
        """Everything but the keys: two interventions with equal twin keys differ only in what they act on."""
        return (self.kind, self.alpha, self.queries, self.layers, self.heads, self.window)

    def to_json(self) -> dict[str, Any]:
        """The ``interventions.json`` entry (:meth:`from_json` reads it back equal)."""
        return encode(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "interventions.json entry") -> "Intervention":
        """Read one ``interventions.json`` entry, of this version or an earlier one.

        Every entry holds ``name``, ``kind``, ``keys``, ``queries``, ``layers`` and ``heads``; the other fields may
        be absent and take their defaults (``conditions`` and ``loads``, written since they exist: every prompt;
        ``group``: the name; ``model``, ``window``, ``selection``, ``alpha``: None), so files of earlier versions and
        hand-written entries read.

        Args:
            data: the entry (parsed JSON).
            where: the file and the entry, for the error message (``<path>: entry <i>``).

        Raises:
            InterventionsFileError: not an object, a missing or unknown field, a value of the wrong type or one the
                intervention refuses; the message names ``where``, the intervention and the field.
        """
        if not isinstance(data, dict):
            raise InterventionsFileError(f"{where} is {type(data).__name__}, not an object")
        name = data.get("name")
        at = f"{where} ({name})" if isinstance(name, str) else where
        missing = [k for k in ENTRY_KEYS if k not in data]
        if missing:
            raise InterventionsFileError(f"{at} has no field {missing[0]!r}; the runner writes it: re-run `probe run` "
                                         "or fix the file")
        try:
            entry: Intervention = decode(cls, data)
        except CodecError as e:
            raise InterventionsFileError(f"{at} {f'field {e.where!r}: ' if e.where else ''}{e.problem}") from None
        except FieldError as e:
            raise InterventionsFileError(f"{at} field {e.field!r}: {e.problem}") from None
        return entry


@dataclass(frozen=True)
class RowEdit:
    """The edit of one prompt: which of its tokens are keys, and where its queries start.

    Attributes:
        keys: (T,) bool mask over the prompt's tokens, True = a key whose edges are edited: a numpy array, a torch
            tensor or a list of bools (kept as a numpy array).
        query_start: the first query position (prompt coordinates); every later position, generated tokens
            included, is a query.
        wanted: the number of key tokens asked for (``matched-random``: the prompt's extraneous tokens); more than
            ``n_keys`` when the prompt had too few tokens to draw from (default: ``n_keys``).

    Raises:
        ConfigError: keys that are not a 1-D bool array, a negative query start.
    """

    keys: np.ndarray
    query_start: int
    wanted: int = -1

    def __post_init__(self) -> None:
        import numpy as np

        keys: Any = self.keys
        if hasattr(keys, "detach") and hasattr(keys, "cpu"):  # a torch tensor (torch is not imported here)
            keys = keys.detach().cpu().numpy()
        elif isinstance(keys, (list, tuple)):
            keys = np.asarray(keys)
        if not isinstance(keys, np.ndarray) or keys.ndim != 1 or keys.dtype != np.bool_:
            raise ConfigError(f"RowEdit.keys: a 1-D bool mask over the prompt's tokens (numpy array, torch tensor or "
                              f"list of bools), got {getattr(self.keys, 'dtype', type(self.keys).__name__)} of shape "
                              f"{tuple(getattr(keys, 'shape', ())) or '?'}")
        object.__setattr__(self, "keys", keys)
        if self.query_start < 0:
            raise ConfigError(f"RowEdit.query_start: {self.query_start} must be >= 0")
        if self.wanted < 0:
            object.__setattr__(self, "wanted", self.n_keys)

    @property
    def n_keys(self) -> int:
        return int(self.keys.sum())

    @property
    def short(self) -> int:
        """Key tokens that could not be drawn (``wanted - n_keys``)."""
        return self.wanted - self.n_keys

    @property
    def count(self) -> "KeyCount":
        """The key tokens this edit edits and asks for, as trial records carry them."""
        return KeyCount(edited=self.n_keys, wanted=self.wanted)


@dataclass(frozen=True)
class KeyCount:
    """How many key tokens an intervention edited in one prompt, and how many it asked for.

    They differ only for ``keys = "matched-random"`` when the prompt had fewer content tokens to draw from than
    extraneous tokens (docs/interventions.md). A trial record under an intervention carries the count in its
    ``meta`` (:meth:`to_meta`: ``intervention_keys``, and ``intervention_keys_wanted`` when short);
    :meth:`from_meta` is the one reader.
    """

    edited: int
    wanted: int

    @property
    def shortfall(self) -> int:
        """Key tokens wanted but not drawn (0 when the edit got all it asked for)."""
        return max(0, self.wanted - self.edited)

    def to_meta(self) -> dict[str, int]:
        """The ``meta`` entries of a trial record: ``intervention_keys`` (+ ``intervention_keys_wanted`` if short)."""
        return ({"intervention_keys": self.edited} if self.wanted == self.edited else
                {"intervention_keys": self.edited, "intervention_keys_wanted": self.wanted})

    @staticmethod
    def from_meta(meta: Mapping[str, Any] | None, where: str = "trial") -> "KeyCount | None":
        """The count a trial record's ``meta`` holds, or None (a baseline trial, or one recorded without it).

        A record with only ``intervention_keys_wanted`` (none written so far) reads as 0 keys edited.

        Args:
            meta: a trial record's ``meta`` (None reads as empty).
            where: what it belongs to (``trial <id>``), for the error message.

        Raises:
            ProbeError: a count that is not a whole number >= 0 (names the trial and the key).
        """
        m = meta or {}
        if "intervention_keys" not in m and "intervention_keys_wanted" not in m:
            return None
        edited = _count(m, "intervention_keys", 0, where)
        return KeyCount(edited=edited, wanted=_count(m, "intervention_keys_wanted", edited, where))


def _count(meta: Mapping[str, Any], key: str, default: int, where: str) -> int:
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or float(v) != int(v):
        raise ProbeError(f"{where}: meta {key}={v!r} must be a whole number of key tokens >= 0 (the record is "
                         "damaged there: repair the value, or delete the trial to run it again)")
    return int(v)



def write_interventions(run: str | Path | RunFolder, model: str, resolved: Sequence[Intervention]) -> Path:
    """Record ``model``'s resolved interventions in the run folder's ``interventions.json`` (the other models'
    entries are kept), atomically.

    Raises:
        InterventionsFileError: the file there cannot be read (:func:`load_interventions`).
        ConfigError: an intervention resolved for another model.
    """
    other = [e for e in resolved if e.model not in (None, model)]
    if other:
        raise ConfigError(f"write_interventions: {other[0].name!r} was resolved for model {other[0].model!r}, "
                          f"not {model!r}")
    entries = [e for e in load_interventions(run) if e.model != model]
    entries += [dataclasses.replace(r, model=model) for r in resolved]
    folder = RunFolder(run)
    return write_atomic(folder.interventions, json.dumps([e.to_json() for e in entries], indent=2, ensure_ascii=False),
                        root=folder.root)


class InterventionsFileError(ConfigError):
    """``interventions.json`` cannot be read: not JSON, not a list of objects, or a field of the wrong type."""


def read_interventions(run: str | Path | RunFolder) -> list[dict[str, Any]]:
    """The entries of a run folder's ``interventions.json`` as parsed JSON (empty when the run has none);
    :func:`load_interventions` reads them as :class:`Intervention`.

    Raises:
        InterventionsFileError: the file is not a JSON list.
    """
    path = RunFolder(run).interventions
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InterventionsFileError(f"{path}: not valid JSON ({e.msg}); `probe run` writes it again") from None
    if not isinstance(data, list):
        raise InterventionsFileError(f"{path}: expected a list of interventions, got {type(data).__name__}; "
                                     "`probe run` writes it again")
    return data


def load_interventions(run: str | Path | RunFolder) -> tuple[Intervention, ...]:
    """The interventions a run folder declares (``interventions.json``, :meth:`Intervention.from_json` per entry);
    () when the file is absent.

    Raises:
        InterventionsFileError: the file is not JSON, not a list of objects, misses a field or has a wrong type
            (names the file, the entry and the field), or two entries of one model share a name.
    """
    path = RunFolder(run).interventions
    entries = tuple(Intervention.from_json(d, f"{path}: entry {i}") for i, d in enumerate(read_interventions(run)))
    seen: set[tuple[str | None, str]] = set()
    for e in entries:
        if (e.model, e.name) in seen:
            of = "" if e.model is None else f" of model {e.model!r}"
            raise InterventionsFileError(f"{path}: intervention {e.name!r}{of} is declared more than once")
        seen.add((e.model, e.name))
    return entries


__all__ = ["HeadSelection", "Intervention", "InterventionSpec", "InterventionsFileError", "KeyCount", "LayerWindow",
           "RowEdit", "TopHeads",
           "load_interventions", "read_interventions", "write_interventions"]
