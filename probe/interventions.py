"""What an intervention is (:class:`Intervention`, :class:`RowEdit`), and an experiment's ``[[interventions]]``
resolved for one model: layer sweeps expanded, top-k heads selected.

:class:`Intervention` names what to edit (kind, α, keys, queries, layers, heads); :class:`RowEdit` is one prompt's
key mask and first query; :mod:`probe.attention.intervention` applies them in the model's attention. This module
imports neither torch nor numpy (``probe.Intervention`` is cheap to reach).

Each :class:`~probe.config.InterventionSection` becomes one or more :class:`ResolvedIntervention` (an
:class:`~probe.attention.intervention.Intervention` with explicit layers and heads, plus where it came from):

- ``layers = {window = W, stride = S}`` expands into windows ``[a, a + W − 1]`` for ``a = 0, S, 2S, …`` while the
  window fits in the model, named ``<name>@L<a>-<b>``;
- ``heads = {top_k = K, from = "<run folder>", by = "enrichment"}`` takes the K heads with the largest mean of
  ``by`` over the baseline probe records of that *separate* run (same model); a run whose questions overlap this
  run's is refused, so selection and test never share a question. ``random_control = true`` adds
  ``<name>+random``: K heads drawn (seeded by the experiment seed and the name) from the heads not selected.
  ``by = "retrieval"`` ranks by the retrieval score of Wu et al. (:mod:`probe.attention.retrieval`) pooled over that
  run's records that hold an answer capture: copied over copyable generated tokens, summed over the records.

The resolved list is written to the run folder's ``interventions.json`` (:attr:`probe.runfolder.RunFolder.
interventions`), one object per model and intervention, which the analysis reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from probe.config import (INTERVENTION_KEYS, INTERVENTION_KINDS, INTERVENTION_QUERIES, ExperimentConfig,
                          InterventionSection, LayerWindow, TopHeads)
from probe.errors import ConfigError, ProbeError
from probe.runfolder import RunFolder, write_atomic
from probe.types import Prompt

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

KINDS, KEY_SETS, QUERY_SETS = INTERVENTION_KINDS, INTERVENTION_KEYS, INTERVENTION_QUERIES


@dataclass(frozen=True)
class Intervention:
    """What to edit: kind, keys, queries, layers and heads (resolved: explicit layer and head lists, or all).

    Attributes:
        kind: ``knockout`` or ``steer``.
        keys: ``extraneous``, ``filler``, ``germane`` or ``matched-random``.
        queries: ``answer`` or ``after`` (:mod:`probe.attention.intervention`).
        alpha: the steering coefficient (``steer`` only, ≥ 0; 0 equals the knockout).
        layers: the layers edited (0-based), None for every layer.
        heads: ``(layer, head)`` pairs edited, None for every head of ``layers``; when given, only these heads are
            edited (``layers`` must then be None or hold their layers).
        name: the name trials and records carry.

    Raises:
        ConfigError: an unknown kind, key set or query set, or an α that does not fit the kind.
    """

    kind: str
    keys: str = "extraneous"
    queries: str = "answer"
    alpha: float | None = None
    layers: tuple[int, ...] | None = None
    heads: tuple[tuple[int, int], ...] | None = None
    name: str = "intervention"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"intervention {self.name!r}: kind {self.kind!r}; use {' or '.join(KINDS)}")
        if self.keys not in KEY_SETS:
            raise ConfigError(f"intervention {self.name!r}: keys {self.keys!r}; use one of {', '.join(KEY_SETS)}")
        if self.queries not in QUERY_SETS:
            raise ConfigError(f"intervention {self.name!r}: queries {self.queries!r}; use {' or '.join(QUERY_SETS)}")
        if self.kind == "knockout" and self.alpha is not None:
            raise ConfigError(f"intervention {self.name!r}: alpha = {self.alpha} has no effect on a knockout; "
                              "remove it (or use kind = \"steer\")")
        if self.kind == "steer" and (self.alpha is None or not self.alpha >= 0 or math.isinf(self.alpha)):
            raise ConfigError(f"intervention {self.name!r}: a steer needs a finite alpha >= 0 (got {self.alpha})")
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ConfigError(f"intervention {self.name!r}: layers {list(self.layers)} must be >= 0")
        if self.heads is not None:
            if any(layer < 0 or head < 0 for layer, head in self.heads):
                raise ConfigError(f"intervention {self.name!r}: heads {[list(h) for h in self.heads]} must be >= 0")
            if self.layers is not None and not {lh[0] for lh in self.heads} <= set(self.layers):
                raise ConfigError(f"intervention {self.name!r}: heads name layers outside layers {list(self.layers)}")

    @property
    def score_bias(self) -> float:
        """What the edit adds to a chosen pre-softmax score: −inf (knockout, α = 0) or ``log α``."""
        if self.kind == "knockout" or self.alpha == 0:
            return float("-inf")
        return math.log(float(self.alpha))  # type: ignore[arg-type]  # steer: alpha is set (checked above)




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


@dataclass(frozen=True)
class ResolvedIntervention:
    """One intervention as one model runs it.

    Attributes:
        name: the name trials and records carry.
        section: the declared ``[[interventions]]`` table it comes from.
        layers: the layers edited (every layer when the section says ``all``).
        heads: ``(layer, head)`` pairs, or None for every head of ``layers``.
        window: ``(first, last)`` layer of a sweep member, else None.
        selection: for top-k and random heads: ``from`` (the run folder), ``k``, ``by``, ``n_prompts`` (records
            averaged), ``control_of`` (the name of the top-k intervention a random control stands beside, else
            None).
    """

    name: str
    section: InterventionSection
    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None = None
    window: tuple[int, int] | None = None
    selection: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    @property
    def group(self) -> str:
        return self.section.name

    def spec(self) -> Intervention:
        """The :class:`Intervention` the engine applies."""
        s = self.section
        return Intervention(kind=s.kind, keys=s.keys, queries=s.queries, alpha=s.alpha, layers=self.layers,
                            heads=self.heads, name=self.name)

    def to_dict(self, model: str) -> dict[str, Any]:
        s = self.section
        return {"name": self.name, "model": model, "group": s.name, "kind": s.kind, "alpha": s.alpha,
                "keys": s.keys, "queries": s.queries, "layers": list(self.layers),
                "heads": "all" if self.heads is None else [list(h) for h in self.heads],
                "window": None if self.window is None else list(self.window), "selection": self.selection,
                "conditions": None if s.conditions is None else list(s.conditions),
                "loads": None if s.loads is None else list(s.loads)}


def _question_texts(prompts: Sequence[Prompt]) -> set[str]:
    return {p.segment_text(s).strip() for p in prompts for s in p.segments if s.kind == "question"}


def select_heads(from_run: str | Path, model: str, k: int, by: str, n_layers: int, n_heads: int,
                 prompts: Sequence[Prompt]) -> tuple[tuple[tuple[int, int], ...], int]:
    """The ``k`` heads with the largest mean ``by`` (``enrichment`` or ``p_ext``) over a probe run's baseline records.

    Args:
        from_run: the run folder of the selection run.
        model: the model card name (its records are read).
        k: how many heads.
        by: the per-head measure to rank by.
        n_layers / n_heads: the model's shape (the records must have it).
        prompts: this run's prompts (their questions must not occur in the selection run).

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
    shared = _question_texts(load_prompts(run.prompts)) & _question_texts(prompts)
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
                          prompts: Sequence[Prompt] = ()) -> list[ResolvedIntervention]:
    """Every intervention of the experiment as ``model`` runs it (sweeps expanded, heads selected).

    Args:
        cfg: the experiment.
        model: the model card name.
        n_layers / n_heads: the model's depth and query heads per layer.
        prompts: this run's prompts (top-k selection refuses a selection run that shares a question).

    Raises:
        ConfigError: a layer or head outside the model, a selection that cannot be made, or names that collide.
    """
    out: list[ResolvedIntervention] = []
    everything = tuple(range(n_layers))
    for s in cfg.interventions:
        if isinstance(s.layers, LayerWindow):
            for a, b in sweep_windows(s.layers, n_layers, s.name):
                out.append(ResolvedIntervention(f"{s.name}@L{a}-{b}", s, tuple(range(a, b + 1)), window=(a, b)))
            continue
        layers: tuple[int, ...] = s.layers if isinstance(s.layers, tuple) else everything
        bad = [x for x in layers if x >= n_layers]
        if bad:
            raise ConfigError(f"interventions: {s.name}: layers {bad} are outside model {model!r}'s {n_layers} "
                              f"layers (0..{n_layers - 1})")
        if isinstance(s.heads, TopHeads):
            t = s.heads
            heads, n = select_heads(t.from_run, model, t.top_k, t.by, n_layers, n_heads, prompts)
            sel = {"from": t.from_run, "k": t.top_k, "by": t.by, "n_prompts": n, "control_of": None}
            out.append(ResolvedIntervention(s.name, s, tuple(sorted({h[0] for h in heads})), heads, selection=sel))
            if t.random_control:
                rnd = random_heads(cfg.experiment.seed, f"{s.name}+random", t.top_k, n_layers, n_heads, heads)
                out.append(ResolvedIntervention(f"{s.name}+random", s, tuple(sorted({h[0] for h in rnd})), rnd,
                                                selection={**sel, "control_of": s.name}))
            continue
        if isinstance(s.heads, tuple):
            bad_heads = [list(h) for h in s.heads if h[0] >= n_layers or h[1] >= n_heads]
            if bad_heads:
                raise ConfigError(f"interventions: {s.name}: heads {bad_heads} are outside model {model!r}'s "
                                  f"{n_layers} layers x {n_heads} heads")
            heads_layers = tuple(sorted({h[0] for h in s.heads}))
            out.append(ResolvedIntervention(s.name, s, heads_layers if s.layers == "all" else layers, s.heads))
            continue
        out.append(ResolvedIntervention(s.name, s, layers))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"interventions: the names {dup} occur twice after expanding sweeps and controls; "
                          "rename an intervention")
    return out


def write_interventions(run: str | Path | RunFolder, model: str, resolved: Sequence[ResolvedIntervention]) -> Path:
    """Record ``model``'s resolved interventions in the run folder's ``interventions.json`` (the other models'
    entries are kept), atomically."""
    path = RunFolder(run).interventions
    entries = [e for e in read_interventions(run) if e.get("model") != model]
    entries += [r.to_dict(model) for r in resolved]
    return write_atomic(path, json.dumps(entries, indent=2, ensure_ascii=False))


class InterventionsFileError(ConfigError):
    """``interventions.json`` cannot be read: not JSON, not a list of objects, or a field of the wrong type."""


def read_interventions(run: str | Path | RunFolder) -> list[dict[str, Any]]:
    """The entries of a run folder's ``interventions.json`` (empty when the run has none).

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


__all__ = ["Intervention", "InterventionsFileError", "ResolvedIntervention", "RowEdit", "random_heads", "read_interventions", "resolve_interventions", "select_heads",
           "sweep_windows", "write_interventions"]
