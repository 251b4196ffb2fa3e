"""Where the time of a probed forward goes, against a plain one: one ``torch.profiler`` pass of each arm of
``probe bench attention`` (``plain``, ``engine``, ``engine_ar``) per prompt length, the CPU operators' self time summed
by kind (docs/performance.md#where-the-time-goes).

    python scripts/profile_attention.py --lengths 2048,8192

Kinds: ``gemm`` (mm, bmm, addmm, matmul, linear), ``sdpa`` (the model's own attention kernel), ``elementwise``
(arithmetic, exp, masks, softmax, fill), ``reduction`` (sum, max, mean, cumsum, sort, topk), ``copy`` (copy, cat,
index, gather, to, contiguous, clone), ``other``. The probe's share of a kind is its time in the probed arm minus its
time in ``plain``, which runs the same model on the same prompt. A profiled call is slower than an unprofiled one (each
operator is recorded), so the seconds here are for comparing kinds and arms, and the bench's ratios remain the
measure of cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = {
    "gemm": ("mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "einsum"),
    "sdpa": ("scaled_dot_product", "_flash_attention", "_efficient_attention"),
    "reduction": ("sum", "amax", "max", "mean", "cumsum", "sort", "topk", "argmax", "logsumexp", "norm",
                  "count_nonzero"),
    "copy": ("copy_", "cat", "index", "gather", "scatter", "to", "_to_copy", "contiguous", "clone", "stack",
             "repeat", "expand", "masked_select", "nonzero", "where", "empty", "zeros", "ones"),
    "elementwise": ("add", "sub", "mul", "div", "exp", "log", "softmax", "tanh", "silu", "pow", "rsqrt", "neg",
                    "masked_fill", "fill_", "clamp", "sqrt", "eq", "ne", "lt", "gt", "le", "ge", "abs", "sigmoid",
                    "cos", "sin", "relu", "gelu", "bitwise", "logical", "minimum", "maximum", "reciprocal"),
}
ORDER = ("gemm", "sdpa", "elementwise", "reduction", "copy", "other")


def kind_of(name: str) -> str:
    """The kind of an aten operator's name (``aten::bmm`` -> ``gemm``)."""
    op = name.split("::")[-1].lstrip("_")
    for kind in ("sdpa", "gemm", "reduction", "copy", "elementwise"):
        if any(op.startswith(k.rstrip("_")) for k in KINDS[kind]):
            return kind
    return "other"


def profile(fn: Callable[[], object], rounds: int = 1) -> tuple[dict[str, float], float]:
    """Self CPU seconds of ``fn`` per kind of aten operator, and the profiled call's wall seconds (the last round's;
    earlier rounds warm the allocator)."""
    import time

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(rounds - 1):
        fn()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    out = dict.fromkeys(ORDER, 0.0)
    for e in prof.key_averages():
        if e.key.startswith("aten::"):
            out[kind_of(e.key)] += e.self_cpu_time_total / 1e6
    return out, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,8192", help="comma-separated prompt lengths")
    ap.add_argument("--model", default=None, help="card name (default: the bench's default model)")
    args = ap.parse_args()
    from benchmarks.attention import DEFAULT_MODEL, _arms, bench_prompt
    from probe.compat import input_device
    from probe.loading import load_model

    name = args.model or DEFAULT_MODEL
    model = load_model(name).model.eval()
    cfg = model.config.get_text_config()
    device = input_device(model)
    print(f"model {name}, {torch.get_num_threads()} thread(s); self CPU seconds of aten operators by kind, one "
          "profiled call after one warm-up")
    for n in (int(x) for x in args.lengths.split(",")):
        tp = bench_prompt(n, int(cfg.vocab_size))
        ids = torch.tensor([tp.input_ids], device=device)
        arms = _arms(model, tp, ids, int(cfg.num_hidden_layers), residue=True, full=False, bridge=None)
        rows = {arm: profile(arms[arm], rounds=2) for arm in ("plain", "engine", "engine_ar")}
        print(f"\nT = {n}")
        print(f"{'arm':<10} " + " ".join(f"{k:>11}" for k in ORDER) + f" {'sum':>8} {'wall':>8} {'wall/plain':>10}")
        for arm, (kinds, wall) in rows.items():
            print(f"{arm:<10} " + " ".join(f"{kinds[k]:>11.2f}" for k in ORDER)
                  + f" {sum(kinds.values()):>8.2f} {wall:>8.2f} {wall / rows['plain'][1]:>10.2f}")
        for arm in ("engine", "engine_ar"):
            extra = {k: rows[arm][0][k] - rows["plain"][0][k] for k in ORDER}
            print(f"{arm + ' - plain':<18} " + "  ".join(f"{k} {v:+.2f}" for k, v in extra.items() if abs(v) >= 0.005))


if __name__ == "__main__":
    main()
