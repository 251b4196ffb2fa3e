"""``probe bench run``: what probing adds to a run, end to end, measured side by side in one process.

The experiment's first model runs all of the experiment's prompts twice per round — once with ``[probe]`` off and
once with it on — each time into a fresh run folder, through the runner's own model loop (generation, scoring,
trial records and, when probing, the attention records). The model is loaded and the prompts built once, outside
the timings, since both arms share them. The order of the arms alternates over rounds; each arm keeps its fastest
round. Reported: seconds of each arm, their ratio, and whether the two arms recorded the same outputs (probing must
not change what the model generates).

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

    @property
    def ratio(self) -> float:
        return self.probed_s / self.unprobed_s


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
        "unprobed": replace(base, probe=replace(base.probe, enabled=False)),
        "probed": replace(base, experiment=replace(base.experiment, name=base.experiment.name + "-probed"),
                          probe=replace(base.probe, enabled=True)),
    }
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
    for r in range(rounds):
        for name in (("unprobed", "probed") if r % 2 == 0 else ("probed", "unprobed")):
            arm = arms[name]
            shutil.rmtree(arm.run_dir, ignore_errors=True)
            prepare_run_dir(arm, force=True)
            t0 = time.perf_counter()
            run_model(arm, backend, prompts, by_id, progress=False)
            best[name] = min(best[name], time.perf_counter() - t0)
            outputs[name] = {t.trial_id: t.output for t in load_trials(arm.run_dir / "trials.jsonl")}
    n_files = len(list((arms["probed"].run_dir / "attention").rglob("*.npz")))
    return RunBench(model=card.name, n_trials=len(outputs["unprobed"]), unprobed_s=best["unprobed"],
                    probed_s=best["probed"], same_outputs=outputs["unprobed"] == outputs["probed"],
                    n_attention_files=n_files)


def format_run_bench(b: RunBench) -> str:
    return "\n".join([
        f"probed vs unprobed run: {b.model}, {b.n_trials} trials (generation, scoring, records; model loaded and "
        "prompts built once, outside the timings)",
        f"  probing off: {b.unprobed_s:7.1f} s",
        f"  probing on : {b.probed_s:7.1f} s   ({b.n_attention_files} attention records)",
        f"  probed / unprobed: {b.ratio:.3f}x   (same outputs: {'yes' if b.same_outputs else 'NO'})",
    ])


if __name__ == "__main__":  # also runnable against an earlier checkout: PYTHONPATH=<checkout> python run.py
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="experiments/demo.toml")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--output-dir", default="outputs")
    ap.add_argument("--n", type=int, default=None, help="prompts to run (default: all)")
    a = ap.parse_args()
    print(format_run_bench(run_probe_cost_bench(a.experiment, a.rounds, a.output_dir, a.n)))
