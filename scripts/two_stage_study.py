"""The study's baseline two ways on this machine, side by side: vLLM + teacher-forced probe against all-torch.

    python scripts/two_stage_study.py                 # both arms, then the comparison
    python scripts/two_stage_study.py --arms compare  # the comparison of two finished run folders only
    python scripts/two_stage_study.py --arms vllm --experiment experiments/study-confirm.toml  # one experiment,
                                                      # two-stage only (its run folder: outputs/<its name>)

Arm ``vllm`` runs ``experiments/study-two-stage.toml``: the study's baseline (140 trials, probing with the answer
capture) with vLLM's OpenAI-compatible server (the environment of ``make setup-vllm``) writing the answers in
float32 from the local card's de-quantised folder, and the toolkit probing each answer in one teacher-forced pass on
the local card. The server is stopped as soon as every trial is recorded, so stage two has the core to itself.
Arm ``torch`` runs the same experiment on the local card (generation with the answer capture). Both arms run on the
same cores (``--cores``; one OpenMP thread per core), each timed from its command's start to its end; an arm whose
run folder already holds trials is resumed, not timed.

The comparison prints trials per hour for each arm (stage one and stage two of the vLLM arm apart), the trials
whose greedy answer text differs between the engines, the two analyses compared value by value (the model's name
aside: every behavioural number must be equal; the attention-derived ones are held to 1e-5 relative, the
difference of float32 sums taken in one forced pass against per-step decoding), their arrays, and the two results
pages line by line (what a reader sees, at the page's precision). It writes ``outputs/two-stage-timing.json``. docs/performance.md#the-studys-baseline-two-stage-on-this-cpu shows
its output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from probe.loading import get_card, weights_folder  # noqa: E402
from tests.serving import VllmServer, served_copy  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "study-two-stage.toml"
SERVED, LOCAL = "qwen2.5-coder-0.5b-vllm", "qwen2.5-coder-0.5b-instruct"
N_TRIALS = 140
TOL = 1e-5  # float32 attention sums taken in one forced pass against per-step decoding (tests/runs/test_vllm.py)


def trial_count(run_dir: Path, name: str = "trials.jsonl") -> int:
    """The records of ``run_dir/name`` (trials; with ``prompts.jsonl``, the prompts the run writes, there before
    stage one's first answer); 0 before the file exists."""
    path = run_dir / name
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else 0


def run_probe(args: list[str], cores: str, on_poll: Any = None) -> float:
    """``probe run *args`` on ``cores`` (taskset) with one thread per core; returns its wall-clock seconds."""
    threads = str(len(cpu_list(cores)))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
    cmd = ["taskset", "-c", cores, str(Path(sys.executable).with_name("probe")), "run", *args, "-q"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    while proc.poll() is None:
        if on_poll is not None:
            on_poll()
        time.sleep(5)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with code {proc.returncode}")
    return time.perf_counter() - started


def cpu_list(cores: str) -> list[int]:
    out: list[int] = []
    for part in cores.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def vllm_name(dtype: str) -> str:
    return "study-two-stage" if dtype == "float32" else f"study-two-stage-{dtype}"


def arm_vllm(out: Path, cores: str, dtype: str, experiment: Path = EXPERIMENT, name: str | None = None
             ) -> dict[str, Any]:
    name = name or vllm_name(dtype)
    run_dir = out / name
    fresh = trial_count(run_dir) == 0
    folder = served_copy(weights_folder(get_card(LOCAL)), out / "served" / LOCAL)
    server = VllmServer(folder, port=8000, served_model=LOCAL, cores=cores, kv_cache_gb=2, max_model_len=4096,
                        dtype=dtype)
    t0 = time.perf_counter()
    server.start()
    startup = time.perf_counter() - t0
    print(f"vLLM ({dtype}) ready in {startup:.0f} s", flush=True)
    stage_one: dict[str, float] = {}
    started = time.perf_counter()

    def stop_when_answered() -> None:
        n = trial_count(run_dir, "prompts.jsonl")
        if "seconds" not in stage_one and n and trial_count(run_dir) >= n:
            stage_one["seconds"] = time.perf_counter() - started
            server.stop()
            print(f"stage one: {n} answers in {stage_one['seconds']:.0f} s; server stopped", flush=True)

    try:
        total = run_probe([str(experiment), "--name", name, "--output-dir", str(out)], cores, stop_when_answered)
    finally:
        server.stop()
    one = stage_one.get("seconds", total)
    return {"fresh": fresh, "startup_s": startup, "seconds": total, "stage_one_s": one, "stage_two_s": total - one}


def arm_torch(out: Path, cores: str, dtype: str) -> dict[str, Any]:
    fresh = trial_count(out / "study-two-stage-torch") == 0
    args = [str(EXPERIMENT), "--models", LOCAL, "--name", "study-two-stage-torch", "--output-dir", str(out)]
    return {"fresh": fresh, "seconds": run_probe(args, cores)}


def numbers(x: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON tree by its path, the served model's name replaced by the local one's."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from numbers(v, f"{path}/{k.replace(SERVED, LOCAL)}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}[{i}]")
    else:
        yield path, (x.replace(SERVED, LOCAL) if isinstance(x, str) else x)


ATTENTION_PARTS = ("attention_behaviour", "attention_cells", "residue_attention", "retrieval", "hop_tracking")


def results_page(run_dir: Path, out: Path) -> list[str]:
    """``probe results`` of one run folder, its run and model names replaced, as lines."""
    page = out / f"{run_dir.name}.results.md"
    subprocess.run([str(Path(sys.executable).with_name("probe")), "results", str(run_dir), "--out", str(page)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    text = page.read_text()
    for name in (run_dir.name, SERVED):
        text = text.replace(name, "RUN" if name == run_dir.name else LOCAL)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<trials sha256>", text)  # the trial files' hashes (lines in another order)
    text = re.sub(r"RUN-[0-9a-f]{8}", "RUN-<sha>", text)
    # the weights line says how each arm ran (served and probed two-stage, or local): not a result
    return [line for line in text.splitlines() if not line.startswith("- weights:")]


def compare(out: Path, dtype: str) -> dict[str, Any]:
    """The vLLM arm against the torch arm: answers, every analysis value, every array, the results page."""
    a, b = out / vllm_name(dtype), out / "study-two-stage-torch"
    for d in (a, b):
        subprocess.run([str(Path(sys.executable).with_name("probe")), "analyze", str(d)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    texts = [{json.loads(line)["prompt_id"]: json.loads(line)["output"] for line in (d / "trials.jsonl").open()}
             for d in (a, b)]
    differ = sorted(p for p in texts[1] if texts[0].get(p) != texts[1][p])
    left = dict(numbers(json.loads((a / "analysis.json").read_text())["families"]))
    right = dict(numbers(json.loads((b / "analysis.json").read_text())["families"]))
    behaviour_unequal, attention_gap, attention_unequal = [], 0.0, []
    for k in sorted(left.keys() | right.keys()):
        x, y = left.get(k, "<absent>"), right.get(k, "<absent>")
        if not any(f"/{part}" in k for part in ATTENTION_PARTS):
            if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                behaviour_unequal.append((k, x, y))
        elif isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y):
            gap = abs(x - y) / max(1.0, abs(y))
            attention_gap = max(attention_gap, gap)
            if gap > TOL:
                attention_unequal.append((k, x, y))
        elif x != y and not (isinstance(x, float) and isinstance(y, float)):
            attention_unequal.append((k, x, y))
    arrays = [np.load(d / "attention_summary.npz") for d in (a, b)]
    names = {n.replace(SERVED, LOCAL): n for n in arrays[0].files}
    array_gap, arrays_unequal = 0.0, []
    for name in sorted(set(names) | {n.replace(SERVED, LOCAL) for n in arrays[1].files}):
        if name not in names or name not in arrays[1].files:
            arrays_unequal.append(name)
            continue
        x, y = arrays[0][names[name]], arrays[1][name]
        if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
            arrays_unequal.append(name)
        elif x.dtype.kind == "f":
            gap = float(np.nanmax(np.abs(x - y), initial=0.0)) if x.size else 0.0
            array_gap = max(array_gap, gap)
            if gap > TOL or not np.array_equal(np.isnan(x), np.isnan(y)):
                arrays_unequal.append(name)
        elif not np.array_equal(x, y):
            arrays_unequal.append(name)
    pages = [results_page(d, out) for d in (a, b)]
    page_diff = [(i + 1, x, y) for i, (x, y) in enumerate(zip(pages[0], pages[1])) if x != y]
    if len(pages[0]) != len(pages[1]):
        page_diff.append((min(len(pages[0]), len(pages[1])) + 1, f"{len(pages[0])} lines", f"{len(pages[1])} lines"))
    return {"answers_differ": len(differ), "differing_prompts": differ[:20], "n_values": len(left.keys() | right.keys()),
            "behaviour_unequal": behaviour_unequal[:10], "n_behaviour_unequal": len(behaviour_unequal),
            "attention_unequal": attention_unequal[:10], "n_attention_unequal": len(attention_unequal),
            "largest_attention_difference": attention_gap, "n_arrays": len(names), "arrays_unequal": arrays_unequal,
            "largest_array_difference": array_gap, "page_lines": len(pages[1]), "page_lines_differ": page_diff[:20],
            "n_page_lines_differ": len(page_diff)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="vllm,torch,compare", help="comma list of vllm, torch, compare")
    ap.add_argument("--cores", default="1", help="the cores both arms run on, e.g. 1 or 0-1 (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs")
    ap.add_argument("--experiment", type=Path, help="run this experiment two-stage (arm vllm only; its served card "
                    "must serve the local card's weights as qwen2.5-coder-0.5b-instruct)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="vLLM's dtype (the local card probes in float32); bfloat16 writes study-two-stage-bfloat16")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if args.experiment is not None:
        import tomllib

        name = tomllib.loads(args.experiment.read_text())["experiment"]["name"]
        t = arm_vllm(args.out, args.cores, args.dtype, args.experiment.resolve(), name)
        n = trial_count(args.out / name)
        print(f"{name}: {n} trials in {t['seconds']:.0f} s ({n / t['seconds'] * 3600:.0f} trials/hour on cores "
              f"{args.cores}; stage one {t['stage_one_s']:.0f} s, stage two {t['stage_two_s']:.0f} s, server start "
              f"{t['startup_s']:.0f} s not counted){'' if t['fresh'] else '  [resumed: not a clean time]'}")
        return
    timing_file = args.out / "two-stage-timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
    vllm = "vllm" if args.dtype == "float32" else f"vllm-{args.dtype}"
    for arm, fn in ((vllm, arm_vllm), ("torch", arm_torch)):
        if arm.split("-")[0] in arms:
            result = fn(args.out, args.cores, args.dtype)
            if result["fresh"] or arm not in timing:
                timing[arm] = {**result, "cores": args.cores}
            timing_file.write_text(json.dumps(timing, indent=2))
    if "compare" in arms:
        timing[f"compare-{vllm}"] = compare(args.out, args.dtype)
        timing_file.write_text(json.dumps(timing, indent=2))
    for arm in (vllm, "torch"):
        if arm in timing:
            t = timing[arm]
            rate = N_TRIALS / t["seconds"] * 3600
            extra = (f" (stage one {t['stage_one_s']:.0f} s, stage two {t['stage_two_s']:.0f} s; server start "
                     f"{t['startup_s']:.0f} s not counted)" if arm != "torch" else "")
            print(f"{arm:14s} {t['seconds']:7.0f} s  {rate:6.0f} trials/hour on cores {t['cores']}{extra}"
                  f"{'' if t['fresh'] else '  [resumed: not a clean time]'}")
    if vllm in timing and "torch" in timing:
        print(f"all-torch time / two-stage time: {timing['torch']['seconds'] / timing[vllm]['seconds']:.2f}")
    if f"compare-{vllm}" in timing:
        c = timing[f"compare-{vllm}"]
        print(f"answers that differ: {c['answers_differ']} of {N_TRIALS}")
        print(f"analysis values: {c['n_values']}; behavioural values that differ: {c['n_behaviour_unequal']}; "
              f"attention-derived values beyond {TOL:g} (relative): {c['n_attention_unequal']}, largest "
              f"{c['largest_attention_difference']:.1e}")
        print(f"arrays: {c['n_arrays']}, beyond {TOL:g} (or in shape, NaN pattern): {len(c['arrays_unequal'])}, "
              f"largest difference {c['largest_array_difference']:.1e}")
        print(f"results page: {c['page_lines']} lines, {c['n_page_lines_differ']} differ")
        for k, x, y in [*c["behaviour_unequal"], *c["attention_unequal"], *c["page_lines_differ"]]:
            print(f"  {k}: {x!r}\n  {' ' * len(str(k))}  {y!r}")


if __name__ == "__main__":
    main()
