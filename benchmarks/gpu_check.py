"""``probe bench gpu-check`` (``make gpu-check``): the probe engine's checks and figures on one CUDA GPU, in one go.

Four parts, in at most ~8 minutes on one large GPU:

1. **Exactness on the device.** Tiny random-weight models of every supported architecture (grouped-query heads, sliding
   windows shorter than the prompt, Gemma 2's soft-capping, Gemma 3's mixed layers), probed one prompt at a time and
   three prompts per batch (left-padded), against eager ``output_attentions`` on the same device: in float32 to 1e-4
   (docs/probes.md#exactness-against-eager-attention), and in bfloat16 to :data:`BF16_TOL`. Why a looser bound in
   bfloat16: eager attention rounds the scores q·kᵀ to bfloat16 (8 significant bits, unit roundoff 2⁻⁸ ≈ 0.4 %) before
   the softmax and the weights to bfloat16 after it, while the engine keeps its scores in float32; at the scores of
   these models (initialiser range 0.2: attention clearly non-uniform) a weight moves by up to about 1 %, and the
   masses, P_ext and AR_k that sum many weights moved by at most 7e-3 in trials — the bound leaves 3x headroom and is
   still far below the differences the probes are used to detect (P_ext between conditions: 0.05-0.3). The chance level
   involves no model arithmetic and is held to 1e-6 in both. The same prompts probed with ``one_attention=False`` (the
   model's own attention kernel gives every layer's output, docs/probes.md#one-attention-per-layer) are held to the same
   reference, and to the default pass within :data:`PATHS_TOL` in float32 (the two outputs differ by float32 rounding)
   and :data:`BF16_TOL` in bfloat16 (the kernel's output is rounded to bfloat16 as the engine's is, after different
   arithmetic).
2. **The attention bench at long context.** A random-weight model with Llama-3-8B's shape (config only, no
   weights, bfloat16) at T = 4k, 8k, 16k, 32k: plain SDPA forward, the engine and the engine with AR_k (each with
   the model's kernel run as well, ``engine_ar_model``), and eager
   ``output_attentions`` where its L·H·T² weights fit; time and peak-memory ratios, and the longest T probed.
3. **Batched generation and probing of the same prompts** on that model: eight left-padded prompts generated
   without and with the probe riding on the prefill (the tokens must be the same), probed again with
   :func:`probe.attention.probe_batch` (the aggregates must agree), and probed two-stage: the generated answers
   teacher-forced in one pass with the answer capture (:func:`probe.attention.probe_forced`, what stage two of a
   run behind vLLM does; its prompt measures must agree with the ride-along's), timed against the generation.
4. **Attention while the answer is written.** On the tiny architectures, three left-padded prompts generated with
   the answer capture on (docs/probes.md#attention-while-the-answer-is-written), each generated token's raw and
   value-weighted segment masses against a post-hoc eager forward over prompt + answer on the same device
   (:func:`probe.attention.decode.reference_answer_attention`), in float32 to :data:`ANSWER_F32_TOL` and in bfloat16
   to :data:`BF16_TOL` (the same reasoning as part 1: eager rounds scores and weights to bfloat16, the capture
   keeps float32 scores). The same answers probed two-stage (:func:`probe.attention.probe_forced`: one
   teacher-forced pass over the three prompts and their answers) are held to the same reference and tolerance.

With ``cpu=True`` the same code runs on the CPU with tiny configs and fewer architectures in a few seconds (the
test suite runs it, so it cannot rot). Without CUDA and without ``cpu=True`` it refuses with :class:`DeviceError`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypedDict, TypeVar

import numpy as np
import torch

from probe.attention import SegmentAttention, left_pad, probe_batch, probe_forced, probe_generation, probe_tokenized
from probe.attention.answer import AnswerAttention
from probe.attention import reference_segment_attention
from probe.attention.measures import measures
from benchmarks.attention import bench_prompt, format_attention_bench, run_attention_bench
from probe.probe_options import ProbeOptions
from probe.errors import ProbeError

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedModel

log = logging.getLogger(__name__)
_T = TypeVar("_T")

F32_TOL = 1e-4
ANSWER_F32_TOL = 2e-5  # the test suite's bound on the CPU (float32 rounding of large random scores: 1.6e-5)
BF16_TOL = 2e-2
CHANCE_TOL = 1e-6
PATHS_TOL = 1e-5  # one attention vs the model's kernel in float32: rounding in another order (1e-6 on the CPU)
GPU_LENGTHS = (4096, 8192, 16384, 32768)
CPU_LENGTHS = (96, 160)


class DeviceError(ProbeError):
    """The check needs a CUDA device and none is available."""


@dataclass
class ExactRow:
    """One architecture in one dtype: the largest difference from eager over its prompts."""

    arch: str
    dtype: str
    max_diff: float
    max_chance_diff: float
    tol: float
    model_kernel_diff: float = float("nan")
    paths_diff: float = float("nan")

    @property
    def paths_tol(self) -> float:
        return PATHS_TOL if self.dtype == "float32" else BF16_TOL

    @property
    def ok(self) -> bool:
        return (self.max_diff <= self.tol and self.max_chance_diff <= CHANCE_TOL and self.model_kernel_diff <= self.tol
                and self.paths_diff <= self.paths_tol)


@dataclass
class GenerationRow:
    """Batched generation with and without the probe, and a separate batched probe of the same prompts."""

    n_prompts: int
    mean_tokens: float
    new_tokens: int
    generate_s: float
    generate_probed_s: float
    probe_batch_s: float
    same_tokens: bool
    max_diff: float
    tol: float
    forced_s: float = float("nan")
    forced_diff: float = float("nan")

    @property
    def ok(self) -> bool:
        return self.same_tokens and self.max_diff <= self.tol and self.forced_diff <= self.tol


@dataclass
class AnswerRow:
    """One architecture in one dtype: the answer capture's largest difference from the post-hoc eager reference."""

    arch: str
    dtype: str
    n_tokens: int
    max_diff: float
    max_vdiff: float
    tol: float
    forced_diff: float = float("nan")

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tol and self.max_vdiff <= self.tol and self.forced_diff <= self.tol


@dataclass
class GpuCheckReport:
    device: str
    exact: list[ExactRow] = field(default_factory=list)
    answer: list[AnswerRow] = field(default_factory=list)
    bench: list[dict] = field(default_factory=list)
    generation: GenerationRow | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def longest_probed(self) -> int | None:
        done = [r["n_tokens"] for r in self.bench if r.get("engine_ar_s") is not None]
        return max(done) if done else None

    @property
    def ok(self) -> bool:
        return (all(r.ok for r in self.exact) and bool(self.exact) and all(r.ok for r in self.answer)
                and bool(self.answer) and self.generation is not None
                and self.generation.ok and self.longest_probed is not None)


# ---------------------------------------------------------------------------------------------------------------
# Models


TINY_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2")
CPU_ARCHS = ("llama", "gemma2", "gemma3")  # the CPU mode's subset (test_attention covers every one on the CPU)


class _TinyShape(TypedDict):
    """The config fields every tiny architecture but GPT-2 shares."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    initializer_range: float


def tiny_model(arch: str, init_range: float, seed: int = 0) -> PreTrainedModel:
    """A 2-layer random-weight model of ``arch`` (vocabulary 128, 4 heads over 2 key/value heads, windows of 16)."""
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                              GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    small = _TinyShape(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       initializer_range=init_range)
    torch.manual_seed(seed)
    m: PreTrainedModel
    if arch == "llama":
        m = LlamaForCausalLM(LlamaConfig(**small))
    elif arch == "mistral":
        m = MistralForCausalLM(MistralConfig(**small, sliding_window=16))
    elif arch == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(**small, use_sliding_window=True, sliding_window=16, max_window_layers=1))
    elif arch == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(**small, head_dim=8, use_sliding_window=True, sliding_window=16,
                                         max_window_layers=1))
    elif arch == "gemma2":
        m = Gemma2ForCausalLM(Gemma2Config(**small, head_dim=8, sliding_window=16, attn_logit_softcapping=2.0,
                                           query_pre_attn_scalar=8))
    elif arch == "gemma3":
        m = Gemma3ForCausalLM(Gemma3TextConfig(**small, head_dim=8, sliding_window=16, query_pre_attn_scalar=1,
                                               layer_types=["sliding_attention", "full_attention"]))
    elif arch == "gpt2":
        m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                       initializer_range=init_range, bos_token_id=0, eos_token_id=0))
    else:
        raise KeyError(arch)
    return m.eval()


def llama3_8b_shaped(device: torch.device, tiny: bool) -> LlamaForCausalLM:
    """A random-weight Llama with Llama-3-8B's shape in bfloat16 on ``device`` (``tiny``: a 2-layer stand-in)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    else:
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=max(GPU_LENGTHS) + 64,
                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


# ---------------------------------------------------------------------------------------------------------------
# Parts


def _max_diff(a: SegmentAttention, b: SegmentAttention) -> tuple[float, float]:
    """The largest difference over every measure (each registered one the results hold), and over chance."""
    diffs = a.max_differences(b)
    chance = diffs.pop("chance")
    return max(diffs.values()), chance


def check_exactness(device: torch.device, archs: tuple[str, ...] = TINY_ARCHS) -> list[ExactRow]:
    """Tiny architectures in float32 (init 0.5, tolerance 1e-4) and bfloat16 (init 0.2, :data:`BF16_TOL`)."""
    rows = []
    for dtype, init, tol in ((torch.float32, 0.5, F32_TOL), (torch.bfloat16, 0.2, BF16_TOL)):
        for arch in archs:
            # transformers decorates PreTrainedModel.to with functools.wraps(Module.to), whose stub drops the bound self
            model = tiny_model(arch, init).to(device=device, dtype=dtype)  # type: ignore[call-arg]
            prompts = [bench_prompt(n, 128, n_pairs=3, seed=s) for s, n in enumerate((96, 70, 83))]
            worst, worst_chance, worst_model, paths = 0.0, 0.0, 0.0, 0.0
            options = ProbeOptions(block_size=16)
            batched = probe_batch(model, prompts, options)
            batched_model = probe_batch(model, prompts, options, one_attention=False)
            for tp, res, res_model in zip(prompts, batched, batched_model):
                ref = reference_segment_attention(model, tp, options)
                # batched with batched, one prompt with one prompt: in bfloat16 left padding moves the hidden states
                for got, got_model in ((res, res_model), (probe_tokenized(model, tp, options),
                                                          probe_tokenized(model, tp, options, one_attention=False))):
                    d, c = _max_diff(got, ref)
                    worst, worst_chance = max(worst, d), max(worst_chance, c)
                    worst_model = max(worst_model, *_max_diff(got_model, ref))
                    paths = max(paths, *_max_diff(got_model, got))
            rows.append(ExactRow(arch, str(dtype).removeprefix("torch."), worst, worst_chance, tol, worst_model,
                                 paths))
            log.info("exactness %s %s: %.2e (model's kernel %.2e, the two passes %.2e)", arch, dtype, worst,
                     worst_model, paths)
            del model
    return rows


def check_answer_capture(device: torch.device, archs: tuple[str, ...] = TINY_ARCHS,
                         n_new: int = 8) -> list[AnswerRow]:
    """Tiny architectures in float32 and bfloat16: the decode-step capture of three left-padded prompts against
    :func:`~probe.attention.decode.reference_answer_attention` of each prompt + its answer."""
    from probe.attention.decode import reference_answer_attention

    rows = []
    for dtype, init, tol in ((torch.float32, 0.5, ANSWER_F32_TOL), (torch.bfloat16, 0.2, BF16_TOL)):
        for arch in archs:
            model = tiny_model(arch, init).to(device=device, dtype=dtype)  # type: ignore[call-arg]
            prompts = [bench_prompt(n, 128, n_pairs=3, seed=20 + s) for s, n in enumerate((72, 56, 64))]
            ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
            with torch.no_grad(), probe_generation(model, prompts, pads, ProbeOptions(answer=True)) as cap:
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=n_new,
                                     min_new_tokens=n_new, do_sample=False, pad_token_id=0, eos_token_id=None)
            answers = [out[i, ids.shape[1]:].tolist() for i in range(len(prompts))]
            assert cap.answer is not None
            got = cap.answer.results(answers, [tp.input_ids for tp in prompts])
            forced = [r.answer for r in probe_forced(model, prompts, answers, ProbeOptions(answer=True))]
            worst, worst_v, worst_forced = 0.0, 0.0, 0.0
            for tp, a, g, f in zip(prompts, answers, got, forced):
                ref = reference_answer_attention(model, tp, a)
                worst = max(worst, float(np.abs(g.mass - ref.mass).max()))
                worst_v = max(worst_v, _vmass_diff(g, ref))
                worst_forced = (float("inf") if f is None else
                                max(worst_forced, float(np.abs(f.mass - ref.mass).max()), _vmass_diff(f, ref)))
            rows.append(AnswerRow(arch, str(dtype).removeprefix("torch."), n_new, worst, worst_v, tol, worst_forced))
            log.info("answer capture %s %s: %.2e / %.2e (two-stage %.2e)", arch, dtype, worst, worst_v, worst_forced)
            del model
    return rows


def _vmass_diff(got: AnswerAttention, ref: AnswerAttention) -> float:
    """The largest difference of the value-weighted rows; ``inf`` when either lacks them (that fails the check)."""
    if got.vmass is None or ref.vmass is None:
        return float("inf")
    return float(np.abs(got.vmass - ref.vmass).max())


def check_generation(model: LlamaForCausalLM, tiny: bool) -> GenerationRow:
    """Eight left-padded prompts (four when ``tiny``): generate, generate with the probe on the prefill,
    probe_batch; compare."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    sizes = (64, 80, 100, 120) if tiny else (1024, 1280, 1536, 1792, 2048, 2304, 2560, 3072)
    prompts = [bench_prompt(n, vocab, seed=10 + i) for i, n in enumerate(sizes)]
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    ids, mask = ids.to(device), mask.to(device)
    n_new = 4 if tiny else 32
    kwargs = dict(max_new_tokens=n_new, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0,
                  eos_token_id=None)

    def timed(fn: Callable[[], _T]) -> tuple[_T, float]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    options = ProbeOptions()
    with torch.inference_mode():
        plain, t_plain = timed(lambda: model.generate(input_ids=ids, attention_mask=mask, **kwargs))

        def probed_generate() -> tuple[torch.Tensor, list[SegmentAttention]]:
            with probe_generation(model, prompts, pads, options) as capture:
                out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            return out, capture.results()

        (probed, riding), t_probed = timed(probed_generate)
    separate, t_batch = timed(lambda: probe_batch(model, prompts, options))
    answers = [probed[i, ids.shape[1]:].tolist() for i in range(len(prompts))]
    forced, t_forced = timed(lambda: probe_forced(model, prompts, answers, ProbeOptions(answer=True)))
    diff = max(_max_diff(a, b)[0] for a, b in zip(riding, separate))
    forced_diff = max(_max_diff(a, b)[0] for a, b in zip(riding, forced))
    tol = F32_TOL if next(model.parameters()).dtype == torch.float32 else BF16_TOL
    return GenerationRow(n_prompts=len(prompts), mean_tokens=float(np.mean(sizes)), new_tokens=n_new,
                         generate_s=t_plain, generate_probed_s=t_probed, probe_batch_s=t_batch,
                         same_tokens=bool(torch.equal(plain, probed)), max_diff=diff, tol=tol, forced_s=t_forced,
                         forced_diff=forced_diff)


def run_gpu_check(cpu: bool = False, lengths: tuple[int, ...] | None = None, time_budget_s: float = 420.0,
                  repeats: int = 1) -> GpuCheckReport:
    """Run the four parts (see the module docstring).

    Args:
        cpu: run on the CPU with tiny configs (three architectures, lengths 96 and 160) instead of a CUDA GPU.
        lengths: bench lengths (default 4k-32k on the GPU).
        time_budget_s: the bench skips the lengths left once this much time has passed since the start.
        repeats: bench rounds over the arms.

    Returns:
        The report (``ok`` is whether every check passed).

    Raises:
        DeviceError: no CUDA device and ``cpu`` not asked for.
    """
    if not cpu and not torch.cuda.is_available():
        raise DeviceError("no CUDA device is available (torch.cuda.is_available() is False); run on a GPU machine "
                          "with a CUDA build of torch, or pass --cpu for the CPU mode with tiny models")
    device = torch.device("cpu" if cpu else "cuda")
    start = time.perf_counter()
    report = GpuCheckReport(device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu")
    report.exact = check_exactness(device, TINY_ARCHS if not cpu else CPU_ARCHS)
    report.answer = check_answer_capture(device, TINY_ARCHS if not cpu else CPU_ARCHS)
    model = llama3_8b_shaped(device, tiny=cpu)
    lengths = lengths or (CPU_LENGTHS if cpu else GPU_LENGTHS)
    full_gb = (torch.cuda.get_device_properties(0).total_memory / 1e9 * 0.45) if device.type == "cuda" else 0.05
    for n in lengths:
        if time.perf_counter() - start > time_budget_s:
            report.notes.append(f"bench at T={n} skipped: the time budget of {time_budget_s:.0f} s was spent")
            continue
        report.bench += run_attention_bench(lengths=(n,), model=model, model_name="llama-3-8b-shape (random, bf16)"
                                            if not cpu else "tiny llama (random, bf16)", repeats=repeats,
                                            full_attention_limit_gb=full_gb, include_lens=False)
    report.generation = check_generation(model, tiny=cpu)
    report.seconds = time.perf_counter() - start
    return report


def format_gpu_check(report: GpuCheckReport) -> str:
    """Plain text of a :class:`GpuCheckReport`."""
    lines = [f"gpu-check on {report.device}", "", "1. exactness against eager output_attentions (max |difference| "
             f"over every measure: {', '.join(m.id for m in measures())}; chance separately)"]
    for r in report.exact:
        lines.append(f"   {r.arch:8s} {r.dtype:9s} {r.max_diff:9.2e}  (tolerance {r.tol:.0e})  chance "
                     f"{r.max_chance_diff:.1e}  model's kernel {r.model_kernel_diff:.1e}, the two passes "
                     f"{r.paths_diff:.1e} (tolerance {r.paths_tol:.0e})  {'ok' if r.ok else 'FAILED'}")
    lines += ["", "2. attention bench", format_attention_bench(report.bench) if report.bench else "   (no rows)"]
    lines.append(f"   longest T probed (engine with AR_k): {report.longest_probed}")
    g = report.generation
    if g is not None:
        lines += ["", f"3. batched generation and probing: {g.n_prompts} prompts (mean {g.mean_tokens:.0f} tokens), "
                      f"{g.new_tokens} new tokens",
                  f"   generate {g.generate_s:.2f} s; generate with the probe on the prefill "
                  f"{g.generate_probed_s:.2f} s ({g.generate_probed_s / g.generate_s:.2f}x); "
                  f"probe_batch {g.probe_batch_s:.2f} s",
                  f"   two-stage: the answers teacher-forced with the answer capture (probe_forced) {g.forced_s:.2f} s "
                  f"({g.forced_s / g.generate_probed_s:.2f}x the probed generation)",
                  f"   same tokens: {'yes' if g.same_tokens else 'NO'}; ride-along vs probe_batch max |difference| "
                  f"{g.max_diff:.1e}, vs two-stage {g.forced_diff:.1e} (tolerance {g.tol:.0e})  "
                  f"{'ok' if g.ok else 'FAILED'}"]
    lines += ["", "4. attention while the answer is written: the decode-step capture against a post-hoc eager forward "
                  "(max |difference|, raw / value-weighted segment mass per generated token; two-stage: the same "
                  "answers teacher-forced, both masses)"]
    for a in report.answer:
        lines.append(f"   {a.arch:8s} {a.dtype:9s} {a.max_diff:9.2e} / {a.max_vdiff:9.2e}  two-stage {a.forced_diff:9.2e}"
                     f"  ({a.n_tokens} tokens, tolerance {a.tol:.0e})  {'ok' if a.ok else 'FAILED'}")
    if not report.answer:
        lines.append("   (no rows)")
    lines += [f"note: {n}" for n in report.notes]
    lines += ["", f"{'PASSED' if report.ok else 'FAILED'} in {report.seconds:.0f} s"]
    return "\n".join(lines)

