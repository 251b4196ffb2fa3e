"""``probe bench attention``: what the probe costs next to a plain forward pass, measured side by side in one run.

At each prompt length T, on the default model (or a given one), the same Saturation-like prompt (random token ids,
sink / instruction / germane and extraneous segments alternating / question / sink) is run through:

- ``plain``: the model's base with its fast attention (SDPA), no cache, no LM head — the floor;
- ``engine``: :func:`probe.attention.probe_tokenized` with the default query set (question + last token), no residue;
- ``engine_raw``: the same without the value-weighted measures (``value_weighted=False``), so that
  ``engine / engine_raw`` is what the value-weighted share costs;
- ``engine_ar``: the same with AR_k (cosine), which needs the rows of every germane, question and extraneous token;
- ``engine_ar_model``: ``engine_ar`` with ``one_attention=False``: the model's own kernel gives every layer's output
  besides the probe's rows (what the engine did before it computed each probed layer's attention once);
- ``forced_ar``: stage two of a two-stage run over the same T tokens: :func:`probe.attention.probe_forced` of the
  prompt's first T - 32 tokens followed by 32 answer tokens, with the answer capture and AR_k (``forced_ar / plain``
  is the forced pass against the decoder's plain forward over the same tokens);
- ``eager``: eager attention with ``output_attentions=True`` (all L·H·T² weights kept);
- ``lens``: a TransformerLens ``TransformerBridge`` ``run_with_cache`` of every ``hook_pattern``.

The last two are skipped (with a note) when their L·H·T² attention would exceed ``full_attention_limit_gb``.
:func:`run_probe_batch_bench` adds probed prompts per second at batch 1 and batched (:func:`probe_batch`, left
padding) on prompts of a spread of lengths, with AR_k, and the largest difference between the two arms' results.
Time is wall-clock seconds of one call; the arms run in turn ``repeats`` times and each keeps its fastest call;
``engine/plain`` ratios are of figures measured in the same run, with the range of the per-round ratios beside
them. Memory is measured before the timed calls, in one more call of each arm: the peak above the memory in use
just before the call, on a GPU ``torch.cuda.max_memory_allocated``, on the CPU the process's resident set size
sampled every 2 ms in a thread, with glibc told to return freed blocks to the system at once
(``mallopt``/``malloc_trim``) so that memory freed by an earlier arm cannot hide a later arm's peak. Neither
belongs in a timed call: the sampler is a second thread that wants the interpreter every 2 ms, and that glibc
setting turns every temporary above 256 KiB into fresh pages (at T = 4096 on two cores it made the probe with
AR_k 45 % slower and the plain forward 15 %); the timed calls run with glibc's thresholds where its own dynamic
rule settles in a long run (:func:`_settled_allocator`).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import logging
import threading
import time
from typing import Callable

import numpy as np
import psutil
import torch
from transformers import PreTrainedModel

from probe.attention import SegmentAttention, probe_batch, probe_forced, probe_tokenized
from probe.attention.implementation import attention_implementation
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from probe.compat import input_device
from probe.types import Span, TokenizedPrompt

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
ARMS = ("plain", "engine", "engine_raw", "engine_ar", "engine_ar_model", "forced_ar", "eager", "lens")
# arms compared with the plain forward, each with its per-round spread
PROBE_ARMS = ("engine", "engine_ar", "engine_ar_model", "forced_ar")
FORCED_ANSWER = 32  # answer tokens of the forced_ar arm


def bench_prompt(n_tokens: int, vocab_size: int, n_pairs: int = 8, seed: int = 0) -> TokenizedPrompt:
    """A Saturation-like prompt of ``n_tokens`` random ids: sink, instruction, (extraneous, germane) x n_pairs,
    extraneous, question, sink.

    Args:
        n_tokens: prompt length T (at least 51; short prompts get fewer germane segments).
        vocab_size: ids are drawn from ``[100, vocab_size)`` (clear of most special tokens).
        n_pairs: germane segments (at most).
        seed: random seed of the ids.

    Raises:
        ConfigError: ``n_tokens`` below 51.
    """
    if n_tokens < 51:
        raise ConfigError(f"bench prompt length {n_tokens}: use at least 51 tokens")
    rng = np.random.default_rng(seed)
    head, instr, question, tail = 3, 20, 20, 5
    body = n_tokens - head - instr - question - tail
    n_pairs = max(1, min(n_pairs, (body - 1) // 2))
    n_body = 2 * n_pairs + 1
    sizes = [body // n_body] * n_body
    sizes[-1] += body - sum(sizes)
    kinds = ["sink", "instruction"] + ["extraneous" if i % 2 == 0 else "germane" for i in range(n_body)]
    kinds += ["question", "sink"]
    lengths = [head, instr, *sizes, question, tail]
    spans, pos = [], 0
    for kind, n in zip(kinds, lengths):
        spans.append(Span(kind, pos, pos + n))
        pos += n
    ids = tuple(int(x) for x in rng.integers(100, vocab_size, size=n_tokens))
    return TokenizedPrompt(input_ids=ids, spans=tuple(spans))


_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _settled_allocator() -> None:
    """Put glibc's large-block threshold where its own dynamic setting settles in a long run (mmap above 32 MiB,
    trim above 64 MiB): the timed calls see the allocator a run sees, whatever :func:`_return_freed_memory` set
    before (a glibc setting cannot be handed back to the dynamic rule)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)


def _return_freed_memory() -> bool:
    """Make glibc serve large blocks by mmap (returned on free) and trim its heap; False where not glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
    libc.malloc_trim(0)
    return True


class _PeakMemory:
    """Peak memory above the starting level during a ``with`` block (CUDA allocator or sampled RSS), bytes."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peak = 0

    def __enter__(self) -> "_PeakMemory":
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            _return_freed_memory()
            self.proc = psutil.Process()
            self.start = self.proc.memory_info().rss
            self.max_rss = self.start
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.max_rss = max(self.max_rss, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self.stop.set()
            self.thread.join()
            self.max_rss = max(self.max_rss, self.proc.memory_info().rss)
            self.peak = self.max_rss - self.start


def _time(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``fn``, nothing else running in the process."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _peak(fn: Callable[[], object], device: torch.device) -> float:
    """Peak bytes above the starting level during one call of ``fn`` (a separate call from the timed ones: on the
    CPU the RSS sampler is a second thread wanting the interpreter every 2 ms, which would slow the arm it
    watches, and the more so the more small operations the arm runs)."""
    with _PeakMemory(device) as mem:
        fn()
    return float(mem.peak)


def run_attention_bench(
    lengths: tuple[int, ...] = (512, 2048, 4096, 8192),
    model: PreTrainedModel | None = None,
    model_name: str = DEFAULT_MODEL,
    repeats: int = 1,
    full_attention_limit_gb: float = 8.0,
    residue_max_tokens: int | None = None,
    include_lens: bool = True,
) -> list[dict]:
    """Time and peak memory of a plain forward, the engine (with and without AR_k), eager and TransformerLens.

    Args:
        lengths: prompt lengths T to measure.
        model: a loaded Hugging Face causal LM (eval mode); None loads ``model_name`` with
            :func:`probe.loading.load_model`.
        model_name: card name of the model to load when ``model`` is None (also the row label).
        repeats: rounds over the arms; each arm reports its fastest call.
        full_attention_limit_gb: skip eager / TransformerLens when L·H·T²·4 bytes exceeds this.
        residue_max_tokens: skip ``engine_ar`` above this T (None, the default: never skip).
        include_lens: measure the TransformerLens arm.

    Returns:
        One dict per T: ``n_tokens``, ``<arm>_s`` and ``<arm>_gb`` (None when skipped), ``notes``, ``rounds``,
        for each arm of :data:`PROBE_ARMS` the ratios ``<arm>_time_ratio`` and ``<arm>_mem_ratio`` (arm / plain)
        with ``<arm>_time_ratio_range`` (lowest, highest per-round ratio; None when skipped), and
        ``value_time_ratio`` (engine / engine_raw: the value-weighted measures' cost) with its range.
    """
    if model is None:
        from probe.loading import load_model

        model = load_model(model_name).model
    model.eval()
    device = input_device(model)
    cfg = model.config.get_text_config()
    n_layers, n_heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
    base = model.base_model
    bridge = None
    rows: list[dict] = []
    measured: list[tuple[dict, dict[str, Callable[[], object]]]] = []
    exact_rss = device.type == "cuda" or _return_freed_memory()
    if lengths:  # warm-up: first-call costs (kernels, allocator) should not land on the first arm measured
        with torch.no_grad():
            base(input_ids=torch.tensor([bench_prompt(min(lengths), int(cfg.vocab_size)).input_ids], device=device),
                 use_cache=False)
    for n in lengths:
        tp = bench_prompt(n, int(cfg.vocab_size))
        ids = torch.tensor([tp.input_ids], device=device)
        row: dict = {"model": model_name, "n_tokens": n, "device": device.type, "notes": [], "rounds": repeats}
        if not exact_rss:
            row["notes"].append("not glibc: freed memory may stay resident, memory figures are lower bounds")
        full_gb = n_layers * n_heads * n * n * 4 / 1e9
        skip_ar = residue_max_tokens is not None and n > residue_max_tokens
        if skip_ar:
            row["notes"].append(f"engine_ar skipped above {residue_max_tokens} tokens")
        full = full_gb <= full_attention_limit_gb
        if not full:
            row["notes"].append(f"eager/lens skipped: L*H*T^2 attention = {full_gb:.1f} GB")
        elif include_lens and bridge is None:
            bridge = _boot_bridge(model, model_name)
        active = _arms(model, tp, ids, n_layers, residue=not skip_ar, full=full, bridge=bridge)
        for arm in ARMS:
            row[f"{arm}_gb"] = _peak(active[arm], device) / 1e9 if arm in active else None
        measured.append((row, active))
    # Every memory figure first, from a heap that large temporaries never entered; then the timed rounds, with
    # glibc's thresholds where its own dynamic rule settles in a long run (what a run sees).
    if device.type == "cpu":
        _settled_allocator()
    for row, active in measured:
        _time_arms(row, active, repeats, device)
        rows.append(row)
    return rows


def _time_arms(row: dict, active: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> None:
    """Time each arm of one length over ``repeats`` rounds and put its fastest call and its ratios into ``row``."""
    times: dict[str, list[float]] = {arm: [] for arm in active}
    for _ in range(repeats):  # arms interleaved, so that a slow spell of the machine falls on all of them
        for arm, fn in active.items():
            log.info("bench attention: T=%d %s", row["n_tokens"], arm)
            times[arm].append(_time(fn, device))
    for arm in ARMS:
        row[f"{arm}_s"] = min(times[arm]) if arm in times else None
    # each ratio with its spread: each round's arm over the same round's plain forward
    for arm, base_arm in [(a, "plain") for a in PROBE_ARMS] + [("engine", "engine_raw")]:
        name = "value" if base_arm == "engine_raw" else arm
        per_round = [a / p for a, p in zip(times.get(arm, []), times[base_arm])]
        row[f"{name}_time_ratio_range"] = (min(per_round), max(per_round)) if per_round else None
        row[f"{name}_time_ratio"] = row[f"{arm}_s"] / row[f"{base_arm}_s"] if per_round else None
        if base_arm == "plain":
            row[f"{arm}_mem_ratio"] = (row[f"{arm}_gb"] / row["plain_gb"]
                                       if row[f"{arm}_gb"] is not None and row["plain_gb"] else None)


def _arms(model: PreTrainedModel, tp: TokenizedPrompt, ids: torch.Tensor, n_layers: int, residue: bool, full: bool,
          bridge: object | None) -> dict[str, Callable[[], object]]:
    """The bench's arms on one prompt, in :data:`ARMS` order (``residue``: with ``engine_ar``; ``full``: with the
    arms that keep every attention weight, ``lens`` when a bridge is given)."""
    base = model.base_model

    def plain() -> None:
        with torch.no_grad():
            base(input_ids=ids, use_cache=False)

    arms: dict[str, Callable[[], object]] = {
        "plain": plain,
        "engine": lambda: probe_tokenized(model, tp, ProbeOptions(residue=False)),
        "engine_raw": lambda: probe_tokenized(model, tp, ProbeOptions(residue=False), value_weighted=False),
    }
    if residue:
        arms["engine_ar"] = lambda: probe_tokenized(model, tp, ProbeOptions(residue=True))
        arms["engine_ar_model"] = lambda: probe_tokenized(model, tp, ProbeOptions(residue=True), one_attention=False)
    if residue and len(tp.input_ids) - FORCED_ANSWER >= 51:  # the shortest bench prompt, then the answer
        prompt = bench_prompt(len(tp.input_ids) - FORCED_ANSWER, int(model.config.get_text_config().vocab_size))
        answer = [list(tp.input_ids[-FORCED_ANSWER:])]
        arms["forced_ar"] = lambda: probe_forced(model, [prompt], answer, ProbeOptions(residue=True, answer=True))
    if full:
        arms["eager"] = lambda: _eager(model, ids)
        if bridge is not None:
            arms["lens"] = lambda: _lens(bridge, ids, n_layers)
    return arms


def _eager(model: PreTrainedModel, ids: torch.Tensor) -> None:
    with torch.no_grad(), attention_implementation(model, "eager"):
        out = model.base_model(input_ids=ids, use_cache=False, output_attentions=True)
    del out


def _boot_bridge(model: PreTrainedModel, name: str) -> object:
    """A TransformerLens bridge around a copy of the model (the bridge rewires the model it wraps)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from transformer_lens.model_bridge import TransformerBridge

    # A stand-in tokenizer (the bench feeds ids); no BOS token, so the bridge does not reload one by name.
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>")),
                                  unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    device = str(next(model.parameters()).device)
    return TransformerBridge.boot_transformers(name, hf_model=copy.deepcopy(model), tokenizer=tok, device=device)


def _lens(bridge: object, ids: torch.Tensor, n_layers: int) -> None:
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(n_layers)]
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids, names_filter=names, return_type=None)  # type: ignore[attr-defined]
    del cache


def format_attention_bench(rows: list[dict], width: int = 100) -> str:
    """Plain-text tables of :func:`run_attention_bench`'s rows, one column per prompt length (so they fit a terminal
    of ``width`` columns whatever the number of arms): seconds and GB per arm, then the engine's ratios to the plain
    forward with the lowest-highest per-round ratio beside each; the notes wrapped at ``width``."""
    import textwrap

    def cell(s: float | None, gb: float | None) -> str:
        return "skipped" if s is None else f"{s:.2f}s {gb:.2f}GB"

    def ratio(r: dict, name: str) -> str:
        x, span = r.get(f"{name}_ratio"), r.get(f"{name}_ratio_range")
        return "n/a" if x is None else f"{x:.2f}" + ("" if span is None else f" ({_span(span)})")

    arms = [a for a in ARMS if any(r[f"{a}_s"] is not None for r in rows)] or list(ARMS)
    ratios = [(f"{arm}/plain {what}", f"{arm}_{key}") for arm in PROBE_ARMS
              for what, key in (("time", "time"), ("memory", "mem"))] + [("engine/engine_raw time", "value_time")]
    table = [["T = " + str(r["n_tokens"]) for r in rows]]
    table += [[cell(r[f"{a}_s"], r[f"{a}_gb"]) for r in rows] for a in arms]
    table += [[ratio(r, key) for r in rows] for _, key in ratios]
    names = ["", *arms, *(label for label, _ in ratios)]
    first = max(len(n) for n in names)
    cols = [max(len(row[i]) for row in table) for i in range(len(rows))]
    lines = [f"{n:<{first}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(row, cols)) for n, row in zip(names, table)]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(2 + len(arms), "-" * len(lines[0]))
    notes = sorted({n for r in rows for n in r["notes"]})
    if rows:
        lines += textwrap.wrap(
            f"model {rows[0]['model']} on {rows[0]['device']}; time = fastest of {rows[0]['rounds']} round(s) "
            "(per-round time ratios, lowest-highest, in brackets); memory = peak above the level before the call, "
            "in a separate call; engine_raw = engine without the value-weighted measures (engine/engine_raw: what "
            "they cost); engine_ar_model = engine_ar with the model's own attention kernel run as well (one_attention "
            "off)", width)
    for n in notes:
        lines += textwrap.wrap(f"note: {n}", width, subsequent_indent="  ")
    return "\n".join(lines)


def _span(r: tuple[float, float] | None) -> str:
    return "n/a" if r is None else f"{r[0]:.2f}-{r[1]:.2f}"


def run_probe_batch_bench(
    model: PreTrainedModel,
    model_name: str = DEFAULT_MODEL,
    n_prompts: int = 16,
    batch_size: int = 8,
    lengths: tuple[int, int] = (200, 600),
    repeats: int = 2,
) -> dict:
    """Probed prompts per second one at a time and ``batch_size`` at a time (AR_k on), measured side by side.

    Args:
        model: a loaded Hugging Face causal LM (eval mode).
        model_name: the row label.
        n_prompts: prompts probed per arm (lengths spread evenly over ``lengths``, as a run's prompts are).
        batch_size: prompts per forward pass in the batched arm (sorted by length, as ``probe run`` batches them).
        lengths: shortest and longest prompt in tokens.
        repeats: rounds over the two arms (alternating which goes first); each keeps its fastest round.

    Returns:
        ``model``, ``n_prompts``, ``batch_size``, ``mean_tokens``, ``b1_s`` / ``batched_s`` (seconds per round),
        ``b1_pps`` / ``batched_pps`` (prompts/s), ``speedup`` and ``max_abs_diff`` (largest difference of any stored
        measure between the arms' results).
    """
    model.eval()
    vocab = int(model.config.get_text_config().vocab_size)
    sizes = np.linspace(lengths[0], lengths[1], n_prompts).round().astype(int)
    prompts = [bench_prompt(int(n), vocab, seed=i) for i, n in enumerate(sizes)]
    ordered = sorted(prompts, key=lambda tp: len(tp.input_ids))

    def one_at_a_time() -> list[SegmentAttention]:
        return [probe_tokenized(model, tp) for tp in ordered]

    def batched() -> list[SegmentAttention]:
        out: list[SegmentAttention] = []
        for i in range(0, len(ordered), batch_size):
            out += probe_batch(model, ordered[i : i + batch_size])
        return out

    if input_device(model).type == "cpu":
        _settled_allocator()
    probe_batch(model, ordered[:2])  # warm-up
    best = {"b1": float("inf"), "batched": float("inf")}
    results: dict[str, list[SegmentAttention]] = {}
    for r in range(repeats):
        for arm, fn in ((("b1", one_at_a_time), ("batched", batched)) if r % 2 == 0
                        else (("batched", batched), ("b1", one_at_a_time))):
            t0 = time.perf_counter()
            results[arm] = fn()
            best[arm] = min(best[arm], time.perf_counter() - t0)
    diff = 0.0
    for a, b in zip(results["b1"], results["batched"]):
        diff = max(diff, *a.max_differences(b).values())
    return {"model": model_name, "n_prompts": n_prompts, "batch_size": batch_size,
            "mean_tokens": float(np.mean(sizes)), "b1_s": best["b1"], "batched_s": best["batched"],
            "b1_pps": n_prompts / best["b1"], "batched_pps": n_prompts / best["batched"],
            "speedup": best["b1"] / best["batched"], "max_abs_diff": diff}


def format_probe_batch_bench(row: dict) -> str:
    """Plain text of :func:`run_probe_batch_bench`'s result."""
    return "\n".join([
        f"batched probing (AR_k on): {row['model']}, {row['n_prompts']} prompts (mean {row['mean_tokens']:.0f} tokens)",
        f"  batch size 1 : {row['b1_pps']:6.2f} prompts/s  ({row['b1_s']:.1f} s)",
        f"  batch size {row['batch_size']:<2d}: {row['batched_pps']:6.2f} prompts/s  ({row['batched_s']:.1f} s)",
        f"  speed-up batched / batch-1: {row['speedup']:.2f}x   (largest difference between the arms: "
        f"{row['max_abs_diff']:.1e})",
    ])
