"""What an intervention is (:class:`Intervention`, :class:`RowEdit`), and an experiment's ``[[interventions]]``
resolved for one model: layer sweeps expanded, top-k heads selected.

:class:`Intervention` names what to edit (kind, α, keys, queries, layers, heads); :class:`RowEdit` is one prompt's
key mask and first query; :mod:`probe.attention.intervention` applies them in the model's attention. This module
imports neither torch nor numpy (``probe.Intervention`` is cheap to reach).

Each :class:`~probe.config.InterventionSection` becomes one or more :class:`Intervention` with explicit layers and
heads, the model it was resolved for and where it came from (``group``, ``window``, ``selection``):

- ``layers = {window = W, stride = S}`` expands into windows ``[a, a + W − 1]`` for ``a = 0, S, 2S, …`` while the
  window fits in the model, named ``<name>@L<a>-<b>``;
- ``heads = {top_k = K, from = "<run folder>", by = "enrichment"}`` takes the K heads with the largest mean of
  ``by`` over the baseline probe records of that *separate* run (same model); a run whose questions overlap this
  run's is refused, so selection and test never share a question. ``random_control = true`` adds
  ``<name>+random``: K heads drawn (seeded by the experiment seed and the name) from the heads not selected.
  ``by = "retrieval"`` ranks by the retrieval score of Wu et al. (:mod:`probe.attention.retrieval`) pooled over that
  run's records that hold an answer capture: copied over copyable generated tokens, summed over the records.

The resolved list is written to the run folder's ``interventions.json`` (:attr:`probe.runfolder.RunFolder.
interventions`), one object per model and intervention: :meth:`Intervention.to_json` is its file form and
:meth:`Intervention.from_json` the one reader (files of earlier versions, without ``conditions``, ``loads``,
``model``, ``group``, ``window`` or ``selection``, read with those absent), which :func:`load_interventions` and the
analysis use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet as Set, Any, Mapping, Sequence

from probe.codec import ALL_WHEN_NONE, KEY, CodecError, decode, encode
from probe.config import HEAD_RANKINGS, ExperimentConfig, InterventionEdit, LayerWindow, TopHeads
from probe.errors import ConfigError, FieldError, ProbeError
from probe.runfolder import RunFolder, write_atomic
from probe.types import Prompt

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# the fields every interventions.json entry holds (the others may be absent and take their defaults)
ENTRY_KEYS = ("name", "kind", "keys", "queries", "layers", "heads")


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


@dataclass(frozen=True)
class Intervention(InterventionEdit):
    """One intervention: what to edit (kind, keys, queries, α: :class:`~probe.config.InterventionEdit`), the layers
    and heads edited, and, once resolved from an experiment's ``[[interventions]]``, for which model and from what.

    The engine applies it (:mod:`probe.attention.intervention`); the runner writes the resolved ones to the run
    folder's ``interventions.json`` (:meth:`to_json`) and the analysis reads them back (:meth:`from_json`).

    Attributes:
        kind, keys, queries, alpha, conditions, loads: see :class:`~probe.config.InterventionEdit`.
        layers: the layers edited (0-based), None for every layer.
        heads: ``(layer, head)`` pairs edited, None for every head of ``layers``; when given, only these heads are
            edited (``layers`` must then be None or hold their layers).
        name: the name trials and records carry.
        group: the declared ``[[interventions]]`` table it comes from (a sweep member's sweep; its own name when
            not given). Keyword-only, as are the fields below.
        window: ``(first, last)`` layer of a layer-window sweep member, else None.
        selection: for top-k and random heads, how they were chosen (:class:`HeadSelection`), else None.
        model: the model card it was resolved for (None: not resolved for a model).

    Raises:
        ConfigError: an unknown kind, key set or query set, an α that does not fit the kind, or layers / heads
            that do not fit each other (:class:`~probe.errors.FieldError` names the field).
    """

    layers: tuple[int, ...] | None = None
    heads: tuple[tuple[int, int], ...] | None = field(default=None, metadata={ALL_WHEN_NONE: True})
    name: str = "intervention"
    _: KW_ONLY
    group: str = ""
    window: tuple[int, int] | None = None
    selection: HeadSelection | None = None
    model: str | None = None

    def _where(self) -> str:
        return f"Intervention(name={self.name!r})"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.group:
            object.__setattr__(self, "group", self.name)
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            self._refuse("layers", f"{list(self.layers)} must be >= 0")
        if self.heads is not None:
            if any(layer < 0 or head < 0 for layer, head in self.heads):
                self._refuse("heads", f"{[list(h) for h in self.heads]} must be >= 0")
            if self.layers is not None and not {lh[0] for lh in self.heads} <= set(self.layers):
                self._refuse("heads", f"{[list(h) for h in self.heads]} name layers outside layers "
                             f"{list(self.layers)}")
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
            return decode(cls, data)
        except CodecError as e:
            raise InterventionsFileError(f"{at} {f'field {e.where!r}: ' if e.where else ''}{e.problem}") from None
        except FieldError as e:
            raise InterventionsFileError(f"{at} field {e.field!r}: {e.problem}") from None


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


def _question_texts(prompts: Sequence[Prompt]) -> set[str]:
    return {p.segment_text(s).strip() for p in prompts for s in p.segments if s.kind == "question"}


def select_heads(from_run: str | Path, model: str, k: int, by: str, n_layers: int, n_heads: int,
                 prompts: Sequence[Prompt], questions: Set[str] = frozenset()
                 ) -> tuple[tuple[tuple[int, int], ...], int]:
    """The ``k`` heads with the largest mean ``by`` (``enrichment`` or ``p_ext``) over a probe run's baseline records.

    Args:
        from_run: the run folder of the selection run.
        model: the model card name (its records are read).
        k: how many heads.
        by: the per-head measure to rank by.
        n_layers / n_heads: the model's shape (the records must have it).
        prompts: this run's prompts (their questions must not occur in the selection run).
        questions: more of this run's question segment texts (before its prompts are built).

    Returns:
        ``(heads, n_records)``: the heads, best first, and the number of records averaged.

    Raises:
        ConfigError: no such run or records, a shape that differs, shared questions, or fewer than ``k`` heads
            with a finite value.
    """
    import numpy as np

    from probe.attention.result import SegmentAttention
    from probe.records import load_prompts

    run = RunFolder(from_run)
    folder = run.attention_dir(model)
    records = sorted(folder.glob("*.npz")) if folder.is_dir() else []
    if not records:
        raise ConfigError(f"interventions: heads.from = {str(from_run)!r}: no baseline probe records of model "
                          f"{model!r} in {folder}; run a probed experiment (probe.enabled = true) there first")
    shared = _question_texts(load_prompts(run.prompts)) & (_question_texts(prompts) | set(questions))
    if shared:
        raise ConfigError(f"interventions: heads.from = {str(from_run)!r} holds {len(shared)} of this run's questions "
                          f"(e.g. {sorted(shared)[0]!r}); select heads on other questions (another task seed or "
                          "source) so selection and test never share a prompt")
    if by == "retrieval":
        return _retrieval_ranking(records, model, k, n_layers, n_heads, folder)
    values = []
    for path in records:
        res = SegmentAttention.load(path)
        v = np.asarray(getattr(res, by), dtype=np.float64)
        if v.shape != (n_layers, n_heads):
            raise ConfigError(f"{path}: {by} of shape {v.shape}, model {model!r} has {n_layers} layers x "
                              f"{n_heads} heads")
        values.append(v)
    stacked = np.stack(values)
    finite = np.isfinite(stacked)
    counts = finite.sum(axis=0)
    mean = np.where(counts > 0, np.where(finite, stacked, 0.0).sum(axis=0) / np.maximum(counts, 1), np.nan)
    order = [int(i) for i in np.argsort(-np.nan_to_num(mean, nan=-np.inf), axis=None, kind="stable")]
    ranked = [(i // n_heads, i % n_heads) for i in order if np.isfinite(mean.flat[i])]
    if len(ranked) < k:
        raise ConfigError(f"interventions: heads.top_k = {k}, but only {len(ranked)} heads have a finite {by} in "
                          f"{folder}")
    return tuple(ranked[:k]), len(records)


def _retrieval_ranking(records: Sequence[Path], model: str, k: int, n_layers: int, n_heads: int, folder: Path
                       ) -> tuple[tuple[tuple[int, int], ...], int]:
    """The ``k`` heads with the largest pooled retrieval score over the records that hold an answer capture."""
    import numpy as np

    from probe.attention.retrieval import pooled_score, top_heads, trial_retrieval
    from probe.attention.result import SegmentAttention

    copied, copyable = [], []
    for path in records:
        ans = getattr(SegmentAttention.load(path), "answer", None)
        if ans is None:
            continue
        tr = trial_retrieval(ans)
        if tr.copied.shape != (n_layers, n_heads):
            raise ConfigError(f"{path}: answer capture of shape {tr.copied.shape}, model {model!r} has {n_layers} "
                              f"layers x {n_heads} heads")
        copied.append(tr.copied)
        copyable.append(tr.copyable)
    if not copied or sum(copyable) == 0:
        raise ConfigError(f"interventions: heads.by = \"retrieval\": no record in {folder} holds an answer capture "
                          "with a copyable token; probe that run with answer capture on, or rank by enrichment")
    ranked = top_heads(pooled_score(np.stack(copied), np.array(copyable)), n_layers * n_heads)
    if len(ranked) < k:
        raise ConfigError(f"interventions: heads.top_k = {k}, but only {len(ranked)} heads have a retrieval score")
    return tuple(ranked[:k]), len(copied)


def random_heads(seed: int, name: str, k: int, n_layers: int, n_heads: int,
                 exclude: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``k`` heads drawn without replacement from those not in ``exclude``, seeded by ``seed`` and ``name``."""
    import numpy as np

    pool = [(layer, h) for layer in range(n_layers) for h in range(n_heads) if (layer, h) not in set(exclude)]
    if len(pool) < k:
        raise ConfigError(f"interventions: {name}: {k} random heads asked, only {len(pool)} heads are not selected")
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}\n{name}".encode()).digest()[:8], "little"))
    picked = rng.choice(len(pool), size=k, replace=False)
    return tuple(sorted(pool[int(i)] for i in picked))


def sweep_windows(window: LayerWindow, n_layers: int, name: str) -> list[tuple[int, int]]:
    """The ``(first, last)`` layers of a sweep over a model of ``n_layers`` layers."""
    if window.window > n_layers:
        raise ConfigError(f"interventions: {name}: layers.window = {window.window} exceeds the model's "
                          f"{n_layers} layers")
    return [(a, a + window.window - 1) for a in range(0, n_layers - window.window + 1, window.stride)]


def resolve_interventions(cfg: ExperimentConfig, model: str, n_layers: int, n_heads: int,
                          prompts: Sequence[Prompt] = (), questions: Set[str] = frozenset()) -> list[Intervention]:
    """Every intervention of the experiment as ``model`` runs it (sweeps expanded, heads selected).

    Args:
        cfg: the experiment.
        model: the model card name.
        n_layers / n_heads: the model's depth and query heads per layer.
        prompts: this run's prompts (top-k selection refuses a selection run that shares a question).
        questions: this run's question segment texts, where its prompts are not built yet (the same check).

    Raises:
        ConfigError: a layer or head outside the model, a selection that cannot be made, or names that collide.
    """
    out: list[Intervention] = []
    everything = tuple(range(n_layers))
    for s in cfg.interventions:
        def resolved(name: str, layers: tuple[int, ...], heads: tuple[tuple[int, int], ...] | None = None,
                     **provenance: Any) -> Intervention:
            return Intervention(**s.edit_values(), layers=layers, heads=heads, name=name, group=s.name, model=model,
                                **provenance)

        if isinstance(s.layers, LayerWindow):
            for a, b in sweep_windows(s.layers, n_layers, s.name):
                out.append(resolved(f"{s.name}@L{a}-{b}", tuple(range(a, b + 1)), window=(a, b)))
            continue
        layers: tuple[int, ...] = s.layers if isinstance(s.layers, tuple) else everything
        bad = [x for x in layers if x >= n_layers]
        if bad:
            raise ConfigError(f"interventions: {s.name}: layers {bad} are outside model {model!r}'s {n_layers} "
                              f"layers (0..{n_layers - 1})")
        if isinstance(s.heads, TopHeads):
            t = s.heads
            heads, n = select_heads(t.from_run, model, t.top_k, t.by, n_layers, n_heads, prompts, questions)
            sel = HeadSelection(from_run=t.from_run, k=t.top_k, by=t.by, n_prompts=n)
            out.append(resolved(s.name, tuple(sorted({h[0] for h in heads})), heads, selection=sel))
            if t.random_control:
                rnd = random_heads(cfg.experiment.seed, f"{s.name}+random", t.top_k, n_layers, n_heads, heads)
                out.append(resolved(f"{s.name}+random", tuple(sorted({h[0] for h in rnd})), rnd,
                                    selection=dataclasses.replace(sel, control_of=s.name)))
            continue
        if isinstance(s.heads, tuple):
            bad_heads = [list(h) for h in s.heads if h[0] >= n_layers or h[1] >= n_heads]
            if bad_heads:
                raise ConfigError(f"interventions: {s.name}: heads {bad_heads} are outside model {model!r}'s "
                                  f"{n_layers} layers x {n_heads} heads")
            heads_layers = tuple(sorted({h[0] for h in s.heads}))
            out.append(resolved(s.name, heads_layers if s.layers == "all" else layers, s.heads))
            continue
        out.append(resolved(s.name, layers))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"interventions: the names {dup} occur twice after expanding sweeps and controls; "
                          "rename an intervention")
    return out


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
    return write_atomic(RunFolder(run).interventions,
                        json.dumps([e.to_json() for e in entries], indent=2, ensure_ascii=False))


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


__all__ = ["HeadSelection", "Intervention", "InterventionsFileError", "KeyCount", "RowEdit", "load_interventions",
           "random_heads", "read_interventions", "resolve_interventions", "select_heads", "sweep_windows",
           "write_interventions"]
