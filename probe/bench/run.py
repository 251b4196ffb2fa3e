"""``probe bench run``: what probing adds to a run, end to end, measured side by side in one process.

The experiment's first model runs all of the experiment's prompts three times per round — with ``[probe]`` off, with
it on, and with it on and the answer capture too (``answer = true``: the attention of every generated token;
skipped for query ``generated``, which refuses it) — each time into a fresh run folder, through the runner's own
model loop (generation, scoring, trial records and, when probing, the attention records). The model is loaded and
the prompts built once, outside the timings, since the arms share them. The order of the arms rotates over rounds; each arm keeps its fastest
round. Reported: seconds of each arm, the ratios to the unprobed arm (of the fastest rounds, and their spread over
the rounds: on a shared machine one round's ratio can be far off), and whether the arms recorded the same outputs
(probing must not change what the model generates).

Uses only the runner's public functions, so the same measurement can be made on an earlier version of the toolkit.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass, replace

from probe.backends import make_backend
from probe.config import load_config
from probe.loading import get_card
from probe.records import load_trials
from probe.runner import build_run_prompts, load_all_tasks, prepare_run_dir, run_model


@dataclass(frozen=True)
class RunBench:
    model: str
    n_trials: int
    unprobed_s: float
    probed_s: float
    same_outputs: bool
    n_attention_files: int
    answer_s: float | None = None  # the probed arm with the answer capture (None: not run)
    round_ratios: tuple[float, ...] = ()  # probed / unprobed of each round
    round_answer_ratios: tuple[float, ...] = ()  # answer capture / unprobed of each round

    @property
    def ratio(self) -> float:
        return self.probed_s / self.unprobed_s

    @property
    def answer_ratio(self) -> float | None:
        """Probed run with answer capture / unprobed run (fastest rounds), or None when not run."""
        return None if self.answer_s is None else self.answer_s / self.unprobed_s


def run_probe_cost_bench(experiment: str = "experiments/demo.toml", rounds: int = 1,
                         output_dir: str = "outputs", n_prompts: int | None = None) -> RunBench:
    """Time the experiment's prompts through ``run_model`` without and with probing (see the module docstring).

    Args:
        experiment: the experiment TOML (its ``[probe]`` options are used for the probed arm).
        rounds: rounds over the two arms.
        output_dir: parent folder of the two scratch run folders (removed before each round).
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
    best = {name: float("inf") for name in arms}
    outputs: dict[str, dict[str, str | None]] = {}
    names = list(arms)
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        seconds: dict[str, float] = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            arm = arms[name]
            shutil.rmtree(arm.run_dir, ignore_errors=True)
            prepare_run_dir(arm, force=True)
            t0 = time.perf_counter()
            run_model(arm, backend, prompts, by_id, progress=False)
            seconds[name] = time.perf_counter() - t0
            best[name] = min(best[name], seconds[name])
            outputs[name] = {t.trial_id: t.output for t in load_trials(arm.run_dir / "trials.jsonl")}
        per_round.append(seconds)
    n_files = len(list((arms["probed"].run_dir / "attention").rglob("*.npz")))
    return RunBench(model=card.name, n_trials=len(outputs["unprobed"]), unprobed_s=best["unprobed"],
                    probed_s=best["probed"], same_outputs=all(o == outputs["unprobed"] for o in outputs.values()),
                    n_attention_files=n_files, answer_s=best.get("answer"),
                    round_ratios=tuple(s["probed"] / s["unprobed"] for s in per_round),
                    round_answer_ratios=tuple(s["answer"] / s["unprobed"] for s in per_round if "answer" in s))


def _spread(ratios: tuple[float, ...]) -> str:
    return f"   (rounds: {min(ratios):.3f}-{max(ratios):.3f}x)" if len(ratios) > 1 else ""


def format_run_bench(b: RunBench) -> str:
    lines = [
        f"probed vs unprobed run: {b.model}, {b.n_trials} trials (generation, scoring, records; model loaded and "
        "prompts built once, outside the timings)",
        f"  probing off: {b.unprobed_s:7.1f} s",
        f"  probing on : {b.probed_s:7.1f} s   ({b.n_attention_files} attention records)",
    ]
    if b.answer_s is not None:
        lines.append(f"  probing on, answer capture: {b.answer_s:7.1f} s")
    lines.append(f"  probed / unprobed: {b.ratio:.3f}x{_spread(b.round_ratios)}   "
                 f"(same outputs: {'yes' if b.same_outputs else 'NO'})")
    if b.answer_ratio is not None:
        lines.append(f"  probed run with answer capture / unprobed run: {b.answer_ratio:.3f}x"
                     f"{_spread(b.round_answer_ratios)}")
    return "\n".join(lines)


if __name__ == "__main__":  # also runnable against an earlier checkout: PYTHONPATH=<checkout> python run.py
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="experiments/demo.toml")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--output-dir", default="outputs")
    ap.add_argument("--n", type=int, default=None, help="prompts to run (default: all)")
    a = ap.parse_args()
    print(format_run_bench(run_probe_cost_bench(a.experiment, a.rounds, a.output_dir, a.n)))
