"""The result of probing one prompt, :class:`SegmentAttention`, its ``.npz`` record, and the check that holds a record
to what made it (docs/records.md#attention-records)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Mapping

import numpy as np

from probe.attention.answer import AnswerAttention
from probe.errors import ProbeError
from probe.records import load_prompts, record_index
from probe.runfolder import RunFolder, prompt_digest
from probe.types import SEGMENT_KINDS, Prompt


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

_FORMAT_VERSION = 3
ORIGIN_GENERATION = "generation"
ORIGINS = (ORIGIN_GENERATION, "forced:engine-ids", "forced:retokenized")
# Members of the answer attention (format 3, when captured): docs/records.md.
_ANSWER_MEMBERS = ("answer_tokens", "answer_mass", "answer_vmass", "answer_top_key", "answer_prompt_ids",
                   "answer_chars")
_FORMAT_1_MEASURES = ("seg_mass", "seg_mass_segment", "p_ext", "ar_k")


@dataclass
class SegmentAttention:
    """Attention aggregates of one prompt (see docs/records.md#attention-records for the definitions).

    Attributes:
        measures: measure id -> its float32 array, ``layer`` first (see each measure's ``axes``); a measure the
            probe did not compute (``ar_k`` without the residue) is absent.
        chance: (layer,) float32 chance level of P_ext; NaN where undefined.
        kinds: key kinds of ``seg_mass``'s last axis (:data:`KEY_KINDS`).
        segment_labels: one label per segment (the span label, else ``"<kind><index>"``).
        segment_kinds: one kind per segment.
        segment_spans: ``(start, end)`` token span per segment.
        ar_targets: indices into the segments of the AR targets (germane segments and the question, in order).
        options: the probe options used (query, gamma, residue_mode, exclude_sink, block_size, residue; a record
            written while the engine had two kernels also holds ``kernel``, ``rows`` or ``fused``).
        n_tokens: tokens in the probed sequence (prompt + generated answer tokens).
        n_prompt_tokens: tokens of the prompt alone.
        n_queries: size of the query set Q.
        answer: the attention while the answer was written, per generated token
            (:class:`~probe.attention.answer.AnswerAttention`), when the probe captured it (``answer = true``),
            else None (and in records of formats 1 and 2).
        origin: how the answer the probe read came about (:data:`ORIGINS`): ``generation`` (the probed model wrote
            it, in this pass or the one before), or a two-stage run's teacher-forced pass over a served engine's
            answer, its token ids as the engine returned them (``forced:engine-ids``) or re-tokenised from the text
            (``forced:retokenized``).
        prompt_digest: :func:`probe.runfolder.prompt_digest` of the prompt text the run probed (a record written
            before records carried it: None); the analysis refuses a record whose digest is not its prompt's.
    """

    measures: dict[str, np.ndarray]
    chance: np.ndarray
    kinds: tuple[str, ...]
    segment_labels: tuple[str, ...]
    segment_kinds: tuple[str, ...]
    segment_spans: tuple[tuple[int, int], ...]
    ar_targets: tuple[int, ...]
    options: dict[str, str | float | bool | int] = field(default_factory=dict)
    n_tokens: int = 0
    n_prompt_tokens: int = 0
    n_queries: int = 0
    answer: AnswerAttention | None = None
    origin: str = ORIGIN_GENERATION
    prompt_digest: str | None = None

    def __getitem__(self, measure_id: str) -> np.ndarray:
        """The array of measure ``measure_id`` (KeyError naming the measures present)."""
        try:
            return self.measures[measure_id]
        except KeyError:
            raise KeyError(f"no measure {measure_id!r} in this result (has: {', '.join(self.measures)})") from None

    @property
    def seg_mass(self) -> np.ndarray:
        """(layer, head, kind) mass of the query set on each key kind, kinds in ``kinds`` order; sums to 1 (to 1
        minus :attr:`no_key_mass` in a model with learned sinks)."""
        return self["seg_mass"]

    @property
    def no_key_mass(self) -> np.ndarray:
        """(layer, head) mass the query set's softmax gave to no key: a learned sink logit's share (gpt-oss;
        docs/probes.md#learned-sinks), 0 to float32 rounding in other models; NaN in a layer without attention."""
        return (1.0 - self["seg_mass"].astype(np.float64).sum(axis=-1)).astype(np.float32)

    @property
    def seg_mass_segment(self) -> np.ndarray:
        """(layer, head, segment) mass of the query set on each segment; sums to 1 over segments."""
        return self["seg_mass_segment"]

    @property
    def p_ext(self) -> np.ndarray:
        """(layer, head) P_ext; NaN where the query set sees no non-sink key."""
        return self["p_ext"]

    @property
    def ar_k(self) -> np.ndarray | None:
        """(layer, head, target) residue per ``ar_targets``, or None when residue was not computed."""
        return self.measures.get("ar_k")

    @property
    def n_layers(self) -> int:
        return int(self.chance.shape[0])

    @property
    def n_heads(self) -> int:
        return int(next(iter(self.measures.values())).shape[1])

    @property
    def sink_mass(self) -> np.ndarray:
        """(layer, head) attention mass of the query set on sink keys (BOS, template markup)."""
        return self.seg_mass[..., self.kinds.index("sink")]

    @property
    def enrichment(self) -> np.ndarray:
        """(layer, head) p_ext / chance; NaN where chance is 0 or undefined (1.0 = no different from uniform)."""
        return self.enrichment_of("p_ext")

    def enrichment_of(self, measure_id: str) -> np.ndarray:
        """(layer, …) a measure's array over the chance level of its layer; NaN where chance is 0 or undefined."""
        c = self.chance.astype(np.float64)
        values = self[measure_id]
        c = c.reshape(c.shape + (1,) * (values.ndim - 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(c > 0, values / np.where(c > 0, c, 1.0), np.nan)
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

    def max_differences(self, other: "SegmentAttention") -> dict[str, float]:
        """Per measure id, and for ``chance``, the largest absolute difference to ``other`` (NaN where both are NaN
        is no difference; NaN against a number is ``inf``).

        Raises:
            ValueError: the two hold different measures or shapes.
        """
        if set(self.measures) != set(other.measures):
            raise ValueError(f"measures differ: {sorted(self.measures)} vs {sorted(other.measures)}")
        out = {}
        for name, a in [*self.measures.items(), ("chance", self.chance)]:
            b = other.chance if name == "chance" else other.measures[name]
            if a.shape != b.shape:
                raise ValueError(f"{name}: shape {a.shape} vs {b.shape}")
            x, y = a.astype(np.float64), b.astype(np.float64)
            both = np.isnan(x) & np.isnan(y)
            d = np.where(both, 0.0, np.abs(x - y))
            out[name] = float(np.where(np.isnan(d), np.inf, d).max()) if d.size else 0.0
        return out

    def meta(self) -> dict:
        """The JSON header written next to the arrays."""
        return {
            "format": _FORMAT_VERSION,
            "measures": list(self.measures),
            "kinds": list(self.kinds),
            "segment_labels": list(self.segment_labels),
            "segment_kinds": list(self.segment_kinds),
            "segment_spans": [list(s) for s in self.segment_spans],
            "ar_targets": list(self.ar_targets),
            "options": dict(self.options),
            "n_tokens": self.n_tokens,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_queries": self.n_queries,
            "answer": self.answer is not None,
            "origin": self.origin,
            **({} if self.prompt_digest is None else {"prompt_digest": self.prompt_digest}),
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
        arrays: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in self.measures.items()}
        clash = {"chance", "meta"} & set(arrays)
        if clash:
            raise AttentionRecordError(f"{path}: a measure may not be named {sorted(clash)[0]!r} (a record member)")
        arrays["chance"] = self.chance.astype(np.float32)
        clash = set(_ANSWER_MEMBERS) & set(arrays)
        if clash:
            raise AttentionRecordError(f"{path}: a measure may not be named {sorted(clash)[0]!r} (a record member)")
        if self.answer is not None:
            a = self.answer
            arrays["answer_tokens"] = a.tokens.astype(np.int64)
            arrays["answer_mass"] = a.mass.astype(np.float32)
            if a.vmass is not None:
                arrays["answer_vmass"] = a.vmass.astype(np.float32)
            arrays["answer_top_key"] = a.top_key.astype(np.int32)
            arrays["answer_prompt_ids"] = a.prompt_ids.astype(np.int64)
            if a.chars is not None:
                arrays["answer_chars"] = a.chars.astype(np.int64)
        arrays["meta"] = np.array(json.dumps(self.meta()))
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, _file_mode())  # mkstemp makes 0600; every file of a run folder has one mode
            with os.fdopen(fd, "wb") as fh:
                _write_npz(fh, arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def is_whole(path: str | Path) -> bool:
        """Whether the file is a whole record: its zip directory (at the end of the file, so missing when a full
        disk or a bad copy cut it short) names the header. Only the directory is read, so a resumed run checks many
        records quickly; damage inside a whole file is named by :meth:`load`."""
        try:
            with zipfile.ZipFile(path) as z:
                return "meta.npy" in z.namelist()
        except (zipfile.BadZipFile, OSError, EOFError):
            return False

    @staticmethod
    def load(path: str | Path) -> "SegmentAttention":
        """Read a file written by :meth:`save` (formats 1 to 3; before format 3, ``answer`` is None).

        Raises:
            AttentionRecordError: the file is not a whole probe record (cut short, overwritten), is of a format
                this version does not know, or lacks a measure it lists; names the file and what to do.
        """
        try:
            return SegmentAttention._load(Path(path))
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, MemoryError,
                RecursionError) as e:  # MemoryError: a member's header claiming more than the machine holds
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
            version = meta.get("format")
            if version == 1:
                names = [n for n in _FORMAT_1_MEASURES if n in z.files]
            elif version in (2, _FORMAT_VERSION):
                names = list(meta["measures"])
            else:
                raise AttentionRecordError(f"{path}: attention record format {version!r}; this version of "
                                           f"ICE-Probe reads formats 1 to {_FORMAT_VERSION}: probe the run again")
            missing = [n for n in names if n not in z.files]
            if missing:
                raise AttentionRecordError(f"{path}: measure {missing[0]!r} is listed but not stored: the file is "
                                           "damaged; probe the prompt again")
            return SegmentAttention(
                measures={n: z[n] for n in names},
                chance=z["chance"],
                kinds=tuple(meta["kinds"]),
                segment_labels=tuple(meta["segment_labels"]),
                segment_kinds=tuple(meta["segment_kinds"]),
                segment_spans=tuple((int(a), int(b)) for a, b in meta["segment_spans"]),
                ar_targets=tuple(int(i) for i in meta["ar_targets"]),
                options=dict(meta["options"]),
                n_tokens=int(meta["n_tokens"]),
                n_prompt_tokens=int(meta["n_prompt_tokens"]),
                n_queries=int(meta["n_queries"]),
                answer=_load_answer(z, meta) if meta.get("answer") else None,
                origin=str(meta.get("origin", ORIGIN_GENERATION)),
                prompt_digest=None if meta.get("prompt_digest") is None else str(meta["prompt_digest"]),
            )


def _write_npz(fh: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    """The members as ``np.savez`` lays them out (``<name>.npy`` in a zip, read by ``np.load``): float arrays stored
    as they are, the others (token ids, key positions, the JSON header) deflated. float32 attention weights do not
    compress (deflate saved 6 % of an answer record) and deflating them cost more than the probe itself: about a
    tenth of a probed run with the answer capture (docs/performance.md#a-probed-run)."""
    with zipfile.ZipFile(fh, mode="w", allowZip64=True) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if arr.dtype.kind == "f" else zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


def _load_answer(z: np.lib.npyio.NpzFile, meta: dict) -> AnswerAttention:
    """The answer attention members of a format-3 record (KeyError for a missing member: a damaged file)."""
    return AnswerAttention(
        tokens=z["answer_tokens"], mass=z["answer_mass"],
        vmass=z["answer_vmass"] if "answer_vmass" in z.files else None, top_key=z["answer_top_key"],
        prompt_ids=z["answer_prompt_ids"], segment_kinds=tuple(meta["segment_kinds"]),
        segment_labels=tuple(meta["segment_labels"]),
        segment_spans=tuple((int(a), int(b)) for a, b in meta["segment_spans"]),
        chars=z["answer_chars"] if "answer_chars" in z.files else None)


class RecordCheck:
    """Holds each probe record to what made it (docs/records.md#what-is-checked-when-a-folder-is-read): the digest
    of its prompt's text (records written since records carry it) and the layers and heads the manifest names for its
    model (else the shape of the model's first record read), so a record cut one layer short, or moved to another
    prompt's name, is refused rather than analysed."""

    def __init__(self, digests: dict[str, str], shapes: dict[str, tuple[int, int]],
                 index: dict[str, str] | None = None, root: Path | None = None) -> None:
        self.digests = digests
        self.shapes = dict(shapes)
        self.index = index or {}
        self.root = root

    @classmethod
    def of(cls, run: RunFolder, prompts: Mapping[str, Prompt] | None = None) -> "RecordCheck":
        manifest = run.read_manifest() or {}
        shapes = {}
        for model, entry in (manifest.get("models") or {}).items():
            if isinstance(entry, dict) and isinstance(entry.get("layers"), int) and isinstance(entry.get("heads"), int):
                shapes[str(model)] = (entry["layers"], entry["heads"])
        if prompts is None:
            prompts = {p.prompt_id: p for p in load_prompts(run.prompts)} if run.prompts.is_file() else {}
        digests = {pid: prompt_digest(p.text) for pid, p in prompts.items()}
        return cls(digests, shapes, record_index(run), run.attention_root)

    def __call__(self, path: Path, model: str, prompt_id: str, record: SegmentAttention) -> None:
        fix = ("delete it and run the experiment again (`probe run`), which probes the prompt again; a folder from "
               "elsewhere: ask for its records as they were written")
        shape = tuple(record["seg_mass"].shape[:2])
        want = self.shapes.setdefault(model, shape)
        if shape != want:
            raise AttentionRecordError(f"{path}: holds {shape[0]} layers x {shape[1]} heads, where model {model!r} "
                                       f"has {want[0]} x {want[1]}; the record is not this model's whole probe: {fix}")
        written = self.index.get(path.relative_to(self.root).as_posix()) if self.root is not None else None
        if written is not None and hashlib.sha256(path.read_bytes()).hexdigest() != written:
            raise AttentionRecordError(f"{path}: its sha256 is not the one written when the run made it "
                                       f"(attention_index.jsonl): the file was changed since: {fix}")
        digest = self.digests.get(prompt_id)
        if record.prompt_digest is not None and digest is not None and record.prompt_digest != digest:
            raise AttentionRecordError(f"{path}: measured another prompt than {prompt_id!r} (its prompt digest "
                                       f"{record.prompt_digest} is not the prompt's {digest}): {fix}")
