"""The result of probing one prompt: per-layer, per-head attention aggregates over the prompt's segments.

A :class:`SegmentAttention` holds only aggregates (never a T x T matrix) and is written to a compact ``.npz``
(float32 arrays plus a small JSON header) keyed by ``prompt_id``. The quantities are those of docs/probes.md:

- ``seg_mass[layer, head, kind]``: M[l, h, K] = mean over the query set Q of the attention mass on keys of kind K.
  Kinds are :data:`KEY_KINDS`, the six segment kinds plus ``generated`` (the answer tokens, non-zero only when the
  probe ran over prompt + answer); a row sums to 1 over all kinds, sink included.
- ``seg_mass_segment[layer, head, segment]``: the same mass per individual segment (``segment_labels`` order; in
  ``generated`` mode the answer tokens form one last pseudo-segment of kind ``generated``).
- ``p_ext[layer, head]``: M[extraneous] / Σ_{K≠sink} M[K] (or M[extraneous] alone when ``exclude_sink`` is false).
- ``chance[layer]``: the P_ext that attention spread uniformly over the keys each query can see would give, i.e.
  ``mean_q(n_ext(q)/n_vis(q)) / mean_q(n_nonsink(q)/n_vis(q))`` with the counts of extraneous, non-sink and all
  keys visible to query q in that layer under the causal mask and the layer's sliding window (the denominator is
  1 when ``exclude_sink`` is false). When every query sees every earlier token it is simply
  extraneous tokens / non-sink tokens before the query. One value per layer: heads share their mask.
- ``enrichment`` = p_ext / chance (NaN where chance is 0, e.g. Control, or undefined).
- ``ar_k[layer, head, target]``: attentional residue of each target segment (every germane segment and the
  question segment, ``ar_targets``), docs/probes.md#attentional-residue-ar_k; ``ar_k_mean`` is its mean over heads.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probe.errors import ProbeError
from probe.types import SEGMENT_KINDS


class AttentionRecordError(ProbeError):
    """A probe record file cannot be read (names the file and what to do)."""


def _file_mode() -> int:
    """The mode of every file of a run folder, as ``open()`` makes one: 0666 less the umask (the records' writers
    use :func:`probe.runfolder.file_mode`, the same value; this module stays free of the run folder)."""
    global _MODE
    if _MODE is None:
        mask = os.umask(0)
        os.umask(mask)
        _MODE = 0o666 & ~mask
    return _MODE


_MODE: int | None = None


# Key kinds of ``seg_mass``'s last axis: the segment kinds, then the answer tokens of a ``generated`` probe.
KEY_KINDS: tuple[str, ...] = (*SEGMENT_KINDS, "generated")

_FORMAT_VERSION = 1


@dataclass
class SegmentAttention:
    """Attention aggregates of one prompt (see the module docstring for the definitions).

    Attributes:
        seg_mass: (layer, head, kind) float32; kinds in ``kinds`` order; sums to 1 over kinds.
        seg_mass_segment: (layer, head, segment) float32; sums to 1 over segments.
        p_ext: (layer, head) float32; NaN where the query set sees no non-sink key.
        chance: (layer,) float32; NaN where undefined.
        ar_k: (layer, head, target) float32 residue per ``ar_targets``, or None when residue was not computed.
        kinds: key kinds of ``seg_mass``'s last axis (:data:`KEY_KINDS`).
        segment_labels: one label per segment (the span label, else ``"<kind><index>"``).
        segment_kinds: one kind per segment.
        segment_spans: ``(start, end)`` token span per segment.
        ar_targets: indices into the segments of the AR targets (germane segments and the question, in order).
        options: the probe options used (query, gamma, residue_mode, exclude_sink, block_size).
        n_tokens: tokens in the probed sequence (prompt + generated answer tokens).
        n_prompt_tokens: tokens of the prompt alone.
        n_queries: size of the query set Q.
    """

    seg_mass: np.ndarray
    seg_mass_segment: np.ndarray
    p_ext: np.ndarray
    chance: np.ndarray
    ar_k: np.ndarray | None
    kinds: tuple[str, ...]
    segment_labels: tuple[str, ...]
    segment_kinds: tuple[str, ...]
    segment_spans: tuple[tuple[int, int], ...]
    ar_targets: tuple[int, ...]
    options: dict[str, str | float | bool | int] = field(default_factory=dict)
    n_tokens: int = 0
    n_prompt_tokens: int = 0
    n_queries: int = 0

    @property
    def n_layers(self) -> int:
        return int(self.seg_mass.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.seg_mass.shape[1])

    @property
    def sink_mass(self) -> np.ndarray:
        """(layer, head) attention mass of the query set on sink keys (BOS, template markup)."""
        return self.seg_mass[..., self.kinds.index("sink")]

    @property
    def enrichment(self) -> np.ndarray:
        """(layer, head) p_ext / chance; NaN where chance is 0 or undefined (1.0 = no different from uniform)."""
        c = self.chance.astype(np.float64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(c > 0, self.p_ext / np.where(c > 0, c, 1.0), np.nan)
        return e.astype(np.float32)

    @property
    def ar_k_mean(self) -> np.ndarray | None:
        """(layer, target) head-averaged residue: the mean over heads of ``ar_k``."""
        return None if self.ar_k is None else self.ar_k.mean(axis=1)

    @property
    def ar_target_labels(self) -> tuple[str, ...]:
        return tuple(self.segment_labels[i] for i in self.ar_targets)

    def mass_of(self, kind: str) -> np.ndarray:
        """(layer, head) mass of the query set on keys of ``kind``."""
        return self.seg_mass[..., self.kinds.index(kind)]

    def meta(self) -> dict:
        """The JSON header written next to the arrays."""
        return {
            "format": _FORMAT_VERSION,
            "kinds": list(self.kinds),
            "segment_labels": list(self.segment_labels),
            "segment_kinds": list(self.segment_kinds),
            "segment_spans": [list(s) for s in self.segment_spans],
            "ar_targets": list(self.ar_targets),
            "options": dict(self.options),
            "n_tokens": self.n_tokens,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_queries": self.n_queries,
        }

    def save(self, path: str | Path) -> Path:
        """Write the arrays (float32) and the JSON header to ``path`` (``.npz``), atomically.

        The file is written under a temporary name in the same folder and renamed into place, so a reader never
        sees a half-written file and an interrupted run leaves no broken record.

        Returns:
            The path written.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {
            "seg_mass": self.seg_mass.astype(np.float32),
            "seg_mass_segment": self.seg_mass_segment.astype(np.float32),
            "p_ext": self.p_ext.astype(np.float32),
            "chance": self.chance.astype(np.float32),
            "meta": np.array(json.dumps(self.meta())),
        }
        if self.ar_k is not None:
            arrays["ar_k"] = self.ar_k.astype(np.float32)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, _file_mode())  # mkstemp makes 0600; every file of a run folder has one mode
            with os.fdopen(fd, "wb") as fh:
                # numpy's stub types **kwds so that a str-keyed dict could reach allow_pickle: bool
                np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def load(path: str | Path) -> "SegmentAttention":
        """Read a file written by :meth:`save`.

        Raises:
            AttentionRecordError: the file is not a whole probe record (cut short, overwritten); names the file
                and what to do.
        """
        try:
            return SegmentAttention._load(Path(path))
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise AttentionRecordError(
                f"{path}: not a readable probe record ({type(e).__name__}: {e}); the file is damaged (cut short by a "
                "full disk or a copy?). Delete it and run the same experiment again (`probe run`), which probes "
                "the prompt again"
            ) from None

    @staticmethod
    def _load(path: Path) -> "SegmentAttention":
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            ar_k = z["ar_k"] if "ar_k" in z.files else None
            return SegmentAttention(
                seg_mass=z["seg_mass"],
                seg_mass_segment=z["seg_mass_segment"],
                p_ext=z["p_ext"],
                chance=z["chance"],
                ar_k=ar_k,
                kinds=tuple(meta["kinds"]),
                segment_labels=tuple(meta["segment_labels"]),
                segment_kinds=tuple(meta["segment_kinds"]),
                segment_spans=tuple((int(a), int(b)) for a, b in meta["segment_spans"]),
                ar_targets=tuple(int(i) for i in meta["ar_targets"]),
                options=dict(meta["options"]),
                n_tokens=int(meta["n_tokens"]),
                n_prompt_tokens=int(meta["n_prompt_tokens"]),
                n_queries=int(meta["n_queries"]),
            )
