"""``probe bench generate``: trials per second at batch size 1 and batched, measured side by side in one run; and
the cost of an attention intervention (generation with it against without, batched).

The same prompts (a spread of conditions and loads from the experiment) are generated both ways by the same
loaded model, alternating the order of the two arms over rounds so that machine noise falls on both. Reported:
trials/s of each arm, their ratio, and how many greedy outputs agree between the arms (left padding can change
the arithmetic of a batch slightly, so a few outputs may differ; the figure says how many). The prompts are built in
a run folder of their own, ``<output_dir>/<name>-bench``, so the experiment's run folder is left as it is.

The intervention row times the same prompts, batched, with and without an intervention, arms alternated; the
target is a time ratio of at most 1.10. The timed intervention is the experiment's first one (an extraneous-key
knockout in every layer when it declares none, or when its first one selects heads from another run) turned into
a steer with α = 1: the same keys, queries, layers and heads, so the same work per step, but outputs that do not
change, so both arms generate the same tokens (a knockout changes the answers and with them the number of decoding
steps, which would be timed instead of the intervention).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from probe.backends import LocalBackend
from probe.config import ExperimentConfig, load_config
from probe.errors import ConfigError
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts
from probe.types import Prompt


@dataclass(frozen=True)
class GenerateBench:
    model: str
    n_prompts: int
    mean_prompt_tokens: float
    max_new_tokens: int
    batch_size: int
    seconds_b1: float
    seconds_batched: float
    agree: int

    @property
    def tps_b1(self) -> float:
        return self.n_prompts / self.seconds_b1

    @property
    def tps_batched(self) -> float:
        return self.n_prompts / self.seconds_batched

    @property
    def speedup(self) -> float:
        return self.seconds_b1 / self.seconds_batched


def _spread(prompts: list[Prompt], n: int) -> list[Prompt]:
    """``n`` distinct prompts taken evenly across the list (so every condition and load is represented)."""
    seen: dict[str, Prompt] = {}
    for p in prompts:
        seen.setdefault(p.text, p)
    uniq = list(seen.values())
    step = max(1, len(uniq) // n)
    return uniq[::step][:n]



def _bench_setup(experiment: str, **counts: int | None) -> tuple[ExperimentConfig, str, list[Prompt], LocalBackend]:
    """Check the counts (each >= 1 or None), build the experiment's prompts in a ``<name>-bench`` run folder and load
    its first model: (config, model name, that model's prompts, its backend).

    Raises:
        ConfigError: a count below 1.
    """
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"bench generate: {name} = {value} must be >= 1")
    cfg = load_config(experiment)
    cfg = replace(cfg, experiment=replace(cfg.experiment, name=cfg.experiment.name + "-bench"))
    prepare_run_dir(cfg, force=True)
    model_name = cfg.experiment.models[0]
    prompts = build_run_prompts(cfg, progress=False)[model_name]
    from probe.loading import load_model  # looked up when called (a test may stand in for it)

    return cfg, model_name, prompts, LocalBackend(load_model(model_name), seed=cfg.experiment.seed)


def run_generate_bench(experiment: str, n_prompts: int = 32, batch_size: int | None = None,
                       rounds: int = 2) -> GenerateBench:
    """Time batch-1 against batched generation of the experiment's first model on ``n_prompts`` of its prompts.

    Args:
        experiment: the experiment TOML.
        n_prompts: distinct prompts to time (>= 1).
        batch_size: the batched arm's batch size (>= 1; None: the experiment's).
        rounds: rounds of both arms, alternating their order (>= 1).

    Raises:
        ConfigError: a count below 1.
    """
    cfg, model_name, all_prompts, backend = _bench_setup(experiment, n_prompts=n_prompts, batch_size=batch_size,
                                                         rounds=rounds)
    prompts = _spread(all_prompts, n_prompts)
    bs = batch_size if batch_size is not None else cfg.generation.batch_size
    g1 = replace(cfg.generation, batch_size=1)
    gb = replace(cfg.generation, batch_size=bs)
    list(backend.generate(prompts[:2], gb))  # warm-up
    t1 = tb = 0.0
    out1: dict[str, str | None] = {}
    outb: dict[str, str | None] = {}
    for r in range(rounds):
        for arm in ((g1, gb) if r % 2 == 0 else (gb, g1)):
            t = time.perf_counter()
            res = {p.prompt_id: g.text for p, g in backend.generate(prompts, arm)}
            dt = time.perf_counter() - t
            if arm is g1:
                t1 += dt
                out1 = res
            else:
                tb += dt
                outb = res
    n_tok = [len(backend.tokenize(p).input_ids) for p in prompts]
    return GenerateBench(model=model_name, n_prompts=len(prompts), mean_prompt_tokens=sum(n_tok) / len(n_tok),
                         max_new_tokens=cfg.generation.max_new_tokens, batch_size=bs, seconds_b1=t1 / rounds,
                         seconds_batched=tb / rounds, agree=sum(out1[k] == outb[k] for k in out1))


@dataclass(frozen=True)
class InterventionBench:
    model: str
    intervention: str
    n_prompts: int
    batch_size: int
    max_new_tokens: int
    seconds_plain: float
    seconds_edited: float
    changed: int  # outputs that differ between the arms

    @property
    def ratio(self) -> float:
        return self.seconds_edited / self.seconds_plain


def run_intervention_bench(experiment: str, n_prompts: int = 16, batch_size: int | None = None,
                           rounds: int = 2) -> InterventionBench:
    """Time batched generation with an intervention against without, on ``n_prompts`` of the experiment's prompts.

    Args:
        experiment: the experiment TOML.
        n_prompts: distinct prompts to time (>= 1).
        batch_size: batch size (None: the experiment's).
        rounds: rounds of both arms, alternating their order (>= 1).

    Raises:
        ConfigError: a count below 1.
    """
    from probe.attention.implementation import layers_and_heads
    from probe.interventions import Intervention, TopHeads
    from probe.runner.resolve import resolve_interventions

    cfg, model_name, all_prompts, backend = _bench_setup(experiment, n_prompts=n_prompts, batch_size=batch_size,
                                                         rounds=rounds)
    prompts = _spread([p for p in all_prompts if p.condition != "Control"] or all_prompts, n_prompts)
    spec = Intervention(kind="knockout", keys="extraneous", name="knockout-extraneous")
    sections = [s for s in cfg.interventions if not isinstance(s.heads, TopHeads)]
    if sections:
        n_layers, n_heads = layers_and_heads(backend.loaded.model)
        first = replace(cfg, interventions=(sections[0],))
        spec = resolve_interventions(first, model_name, n_layers, n_heads)[0]
    spec = replace(spec, kind="steer", alpha=1.0, name=f"{spec.name} (as a steer with alpha = 1)")
    gen = replace(cfg.generation, batch_size=batch_size if batch_size is not None else cfg.generation.batch_size)
    list(backend.generate(prompts[:2], gen, intervention=spec))  # warm-up
    plain = edited = 0.0
    out_plain: dict[str, str | None] = {}
    out_edited: dict[str, str | None] = {}
    for r in range(rounds):
        for arm in ((None, spec) if r % 2 == 0 else (spec, None)):
            t = time.perf_counter()
            res = {p.prompt_id: g.text for p, g in backend.generate(prompts, gen, intervention=arm)}
            dt = time.perf_counter() - t
            if arm is None:
                plain += dt
                out_plain = res
            else:
                edited += dt
                out_edited = res
    return InterventionBench(model=model_name, intervention=spec.name, n_prompts=len(prompts),
                             batch_size=gen.batch_size, max_new_tokens=gen.max_new_tokens,
                             seconds_plain=plain / rounds, seconds_edited=edited / rounds,
                             changed=sum(out_plain[k] != out_edited[k] for k in out_plain))


def format_intervention_bench(b: InterventionBench) -> str:
    return "\n".join([
        f"intervention cost: {b.model}, {b.n_prompts} prompts, batch {b.batch_size}, max_new_tokens "
        f"{b.max_new_tokens}, intervention {b.intervention!r}",
        f"  without: {b.seconds_plain:.1f} s   with: {b.seconds_edited:.1f} s   ratio with / without: {b.ratio:.3f} "
        f"(target <= 1.10; outputs changed: {b.changed}/{b.n_prompts})",
    ])


def format_generate_bench(b: GenerateBench) -> str:
    return "\n".join([
        f"generation benchmark: {b.model}, {b.n_prompts} prompts (mean {b.mean_prompt_tokens:.0f} tokens), "
        f"max_new_tokens {b.max_new_tokens}, greedy",
        f"  batch size 1 : {b.tps_b1:6.2f} trials/s  ({b.seconds_b1:.1f} s)",
        f"  batch size {b.batch_size:<2d}: {b.tps_batched:6.2f} trials/s  ({b.seconds_batched:.1f} s)",
        f"  speed-up batched / batch-1: {b.speedup:.2f}x   (identical outputs: {b.agree}/{b.n_prompts})",
    ])
