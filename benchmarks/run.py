"""``probe bench run``: what probing adds to a run, end to end, measured side by side in one process.

The experiment's first model runs the experiment's prompts in three arms — with ``[probe]`` off, with it on, and
with it on and the answer capture too (``answer = true``: the attention of every generated token; skipped for query
``generated``, which refuses it) — each into its own fresh run folder, through the runner's own model loop
(generation, scoring, trial records and, when probing, the attention records). The model is loaded and the prompts
built once, outside the timings, since the arms share them.

The arms are interleaved batch by batch: the prompts are cut into the generation batches the runner would form
(sorted by token count, ``batch_size`` at a time), and each batch runs in every arm before the next batch starts,
the arms' order rotating from batch to batch. A slow spell of a shared machine then falls on all arms alike instead
of on whichever arm ran during it. Each arm's time is the sum over the batches of its fastest round on that batch;
reported beside it are the ratios of whole rounds (their spread shows how noisy the machine was), the median and
quartiles of the per-batch ratios (each batch's arms ran back to back, so a drift of the machine's speed cancels in
them), and whether the arms recorded the same outputs (probing must not change what the model generates).

Uses only the runner's public functions, so the same measurement can be made on an earlier version of the toolkit.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
import time
from dataclasses import dataclass, replace

import numpy as np

from probe.backends import make_backend
from probe.config import load_config
from probe.loading import get_card
from probe.records import load_trials
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts, load_all_tasks
from probe.runner.trials import run_model


@dataclass(frozen=True)
class RunBench:
    model: str
    n_trials: int
    unprobed_s: float  # each arm: the sum over batches of its fastest round on the batch
    probed_s: float
    same_outputs: bool
    n_attention_files: int
    answer_s: float | None = None  # the probed arm with the answer capture (None: not run)
    round_ratios: tuple[float, ...] = ()  # probed / unprobed of each whole round
    round_answer_ratios: tuple[float, ...] = ()  # answer capture / unprobed of each whole round
    n_batches: int = 1
    batch_ratios: tuple[float, ...] = ()  # probed / unprobed of each batch in each round (the arms run back to back)
    batch_answer_ratios: tuple[float, ...] = ()  # answer capture / unprobed, likewise

    @property
    def ratio(self) -> float:
        return self.probed_s / self.unprobed_s

    @property
    def answer_ratio(self) -> float | None:
        """Probed run with answer capture / unprobed run (fastest per batch), or None when not run."""
        return None if self.answer_s is None else self.answer_s / self.unprobed_s


def _batches(backend: object, prompts: list, batch_size: int) -> list[list]:
    """The prompts cut into the runner's generation batches: sorted by token count (when the backend tokenizes
    locally, as the local backend's own batching sorts them), ``batch_size`` at a time."""
    tokenize = getattr(backend, "tokenize", None)
    if tokenize is not None:
        prompts = sorted(prompts, key=lambda p: len(tokenize(p).input_ids))
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def arm_order(names: list[str], round_: int, batch: int) -> list[str]:
    """The order of the arms on ``batch`` in ``round_``: rotated by one from batch to batch and from round to round,
    so that over ``len(names)`` rounds every batch runs in every rotation (each arm leads it once)."""
    k = (round_ + batch) % len(names)
    return names[k:] + names[:k]


def run_probe_cost_bench(experiment: str = "demo", rounds: int = 1,
                         output_dir: str = "outputs", n_prompts: int | None = None) -> RunBench:
    """Time the experiment's prompts through ``run_model`` without and with probing (see the module docstring).

    Args:
        experiment: the experiment TOML (its ``[probe]`` options are used for the probed arm).
        rounds: rounds over the batches (each batch runs once per arm per round).
        output_dir: parent folder of the scratch run folders (removed before each round).
        n_prompts: run only this many of the prompts, taken evenly across the list (every condition and load
            represented); None: all of them.

    Returns:
        The timings and checks.
    """
    cfg = load_config(experiment)
    model_name = cfg.experiment.models[0]
    base = replace(cfg, experiment=replace(cfg.experiment, name=cfg.experiment.name + "-bench-run",
                                           models=(model_name,), output_dir=output_dir))
    arms = {
        "unprobed": replace(base, probe=replace(base.probe, enabled=False, answer=False)),
        "probed": replace(base, experiment=replace(base.experiment, name=base.experiment.name + "-probed"),
                          probe=replace(base.probe, enabled=True, answer=False)),
    }
    if base.probe.query != "generated":
        arms["answer"] = replace(base, experiment=replace(base.experiment, name=base.experiment.name + "-answer"),
                                 probe=replace(base.probe, enabled=True, answer=True))
    tasks = load_all_tasks(base)
    prepare_run_dir(arms["unprobed"], force=True)
    card = get_card(model_name)
    prompts = build_run_prompts(arms["unprobed"], progress=False, tasks=tasks)[card.name]
    if n_prompts is not None and n_prompts < len(prompts):
        prompts = prompts[:: len(prompts) // n_prompts][:n_prompts]
    by_id = {t.task_id: t for t in tasks}
    backend = make_backend(card, seed=cfg.experiment.seed)
    batches = _batches(backend, prompts, base.generation.batch_size)
    names = list(arms)
    outputs: dict[str, dict[str, str | None]] = {}
    paired: list[dict[str, float]] = []  # per round and batch: each arm's seconds
    for r in range(rounds):
        for arm in arms.values():
            shutil.rmtree(arm.run_dir, ignore_errors=True)
            prepare_run_dir(arm, force=True)
        for b, batch in enumerate(batches):
            times: dict[str, float] = {}
            for name in arm_order(names, r, b):
                t0 = time.perf_counter()
                run_model(arms[name], backend, batch, by_id, progress=False)
                times[name] = time.perf_counter() - t0
            paired.append(times)
        for name, arm in arms.items():
            outputs[name] = {t.trial_id: t.output for t in load_trials(arm.run_dir / "trials.jsonl")}
    n_b = len(batches)  # paired[r * n_b + b]: batch b of round r
    total = {name: sum(min(t[name] for t in paired[b::n_b]) for b in range(n_b)) for name in names}
    per_round = [{name: sum(t[name] for t in paired[r * n_b:(r + 1) * n_b]) for name in names} for r in range(rounds)]
    n_files = len(list((arms["probed"].run_dir / "attention").rglob("*.npz")))
    return RunBench(model=card.name, n_trials=len(outputs["unprobed"]), unprobed_s=total["unprobed"],
                    probed_s=total["probed"], same_outputs=all(o == outputs["unprobed"] for o in outputs.values()),
                    n_attention_files=n_files, answer_s=total.get("answer"),
                    round_ratios=tuple(s["probed"] / s["unprobed"] for s in per_round),
                    round_answer_ratios=tuple(s["answer"] / s["unprobed"] for s in per_round if "answer" in s),
                    n_batches=len(batches), batch_ratios=tuple(t["probed"] / t["unprobed"] for t in paired),
                    batch_answer_ratios=tuple(t["answer"] / t["unprobed"] for t in paired if "answer" in t))


def _spread(ratios: tuple[float, ...], paired: tuple[float, ...] = ()) -> str:
    text = f"   (whole rounds: {min(ratios):.3f}-{max(ratios):.3f}x)" if len(ratios) > 1 else ""
    if len(paired) > 2:  # the batches' own ratios, each of three arms run back to back: robust to slow drifts
        q1, med, q3 = np.percentile(paired, [25, 50, 75])
        text += f"   (per batch, {len(paired)} paired: median {med:.3f}x, quartiles {q1:.3f}-{q3:.3f}x)"
    return text


def format_run_bench(b: RunBench) -> str:
    lines = [
        *textwrap.wrap(f"probed vs unprobed run: {b.model}, {b.n_trials} trials in {b.n_batches} batches (generation, "
                       "scoring, records; model loaded and prompts built once, outside the timings; the arms "
                       "interleaved batch by batch, each arm's time the sum of its fastest round on each batch)", 100),
        f"  probing off: {b.unprobed_s:7.1f} s",
        f"  probing on : {b.probed_s:7.1f} s   ({b.n_attention_files} attention records)",
    ]
    if b.answer_s is not None:
        lines.append(f"  probing on, answer capture: {b.answer_s:7.1f} s")
    lines.append(f"  probed / unprobed: {b.ratio:.3f}x{_spread(b.round_ratios, b.batch_ratios)}   "
                 f"(same outputs: {'yes' if b.same_outputs else 'NO'})")
    if b.answer_ratio is not None:
        lines.append(f"  probed run with answer capture / unprobed run: {b.answer_ratio:.3f}x"
                     f"{_spread(b.round_answer_ratios, b.batch_answer_ratios)}")
    return "\n".join(lines)


if __name__ == "__main__":  # also runnable against an earlier checkout: PYTHONPATH=<checkout> python run.py
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="demo")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--output-dir", default="outputs")
    ap.add_argument("--n", type=int, default=None, help="prompts to run (default: all)")
    a = ap.parse_args()
    print(format_run_bench(run_probe_cost_bench(a.experiment, a.rounds, a.output_dir, a.n)))
