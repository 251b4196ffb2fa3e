"""An experiment's interventions resolved for one model: layer sweeps expanded, top-k heads selected
(docs/interventions.md#layers-and-heads)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import AbstractSet as Set, Any, Sequence

from probe.config import ExperimentConfig
from probe.errors import ConfigError
from probe.interventions import HeadSelection, Intervention, LayerWindow, TopHeads
from probe.runfolder import RunFolder
from probe.types import Prompt


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
            return Intervention(**s.edit(), layers=layers, heads=heads, name=name, group=s.name, model=model,
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
            out.append(resolved(s.name, heads_layers if s.layers is None else layers, s.heads))
            continue
        out.append(resolved(s.name, layers))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"interventions: the names {dup} occur twice after expanding sweeps and controls; "
                          "rename an intervention")
    return out


__all__ = ["random_heads", "resolve_interventions", "select_heads", "sweep_windows"]
