"""The run's tasks and prompts: every ``[[tasks]]`` section's tasks, built into prompts once per tokenizer and
recorded in the run folder (``tasks.jsonl``, ``prompts.jsonl``)."""

from __future__ import annotations

from probe.backends import capabilities
from probe.config import ExperimentConfig
from probe.errors import ConfigError
from probe.loading import ModelCard, get_card, load_tokenizer
from probe.prompts.builder import IceBuilder
from probe.records import load_prompts, write_jsonl
from probe.tasks import get_family, get_source, load_section
from probe.types import Prompt, Task


def load_all_tasks(cfg: ExperimentConfig) -> list[Task]:
    """The tasks of every ``[[tasks]]`` section (section ``i`` seeded with ``seed + i``); ids must be unique."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, section in enumerate(cfg.tasks):
        for t in load_section(section, cfg.experiment.seed + i):
            if t.task_id in seen:
                raise ConfigError(f"task id {t.task_id!r} comes from two task sources; give them distinct ids")
            seen.add(t.task_id)
            tasks.append(t)
    return tasks


def tokenizer_groups(cfg: ExperimentConfig) -> dict[str, list[ModelCard]]:
    """Prompts are built once per tokenizer, keyed by the card whose tokenizer builds them (the first of its list):
    local models each count tokens in their own; a served model with ``probe_with`` in its local card's (which need
    not be in the experiment); other served models share the first local model's prompts (their tokenizer is
    unknown here)."""
    cards = [get_card(m) for m in cfg.experiment.models]
    local = [c for c in cards if capabilities(c).local]
    groups: dict[str, list[ModelCard]] = {c.name: [c] for c in local}
    for c in cards:
        if not capabilities(c).local and c.probe_with is not None:
            groups.setdefault(c.probe_with, [get_card(c.probe_with)]).append(c)
    served = [c for c in cards if not capabilities(c).local and c.probe_with is None]
    if served:
        if not groups:
            raise ConfigError(
                "an experiment of served models only needs one local model card in experiment.models to count "
                "loads in (its tokenizer); add e.g. \"smollm2-135m-instruct\""
            )
        groups[next(iter(groups))] += served
    return groups


def needs_embedder(cfg: ExperimentConfig) -> bool:
    """Whether building the prompts needs the sentence embedder: stratified distractor draws, or S_sim
    (docs/method.md#task-similarity-s_sim)
    for some prompt that can hold extraneous segments in a family where S_sim is defined (``analysis.embedder``
    empty turns S_sim off)."""
    if cfg.ice.distractor_strategy == "stratified":
        return True
    if not cfg.analysis.embedder:
        return False
    distracted = bool({"Saturation", "Residue"} & set(cfg.ice.conditions))
    for section in cfg.tasks:
        source = get_source(section.source)
        if get_family(source.family).has_s_sim and (source.layout != "ice" or distracted):
            return True
    return False


def build_run_prompts(cfg: ExperimentConfig, progress: bool = True,
                  tasks: list[Task] | None = None) -> dict[str, list[Prompt]]:
    """Build (or reuse from the run folder's prompts file) the prompts of every tokenizer group.

    The prompts file is rewritten whole (atomically) when a group is added, so it never holds part of a group.
    ``tasks`` are the experiment's tasks when the caller has them already; otherwise they are loaded only if some
    tokenizer group still needs its prompts built or the folder has no ``tasks.jsonl`` yet. The tasks the prompts
    are built from are recorded in ``tasks.jsonl`` (question, gold, hops: what the analysis needs of them, so that
    it never loads a task source), rewritten whole with the prompts.

    Returns:
        model card name -> its prompts.

    Raises:
        RecordError: the prompts file holds a damaged line.
    """
    from tqdm import tqdm

    run = cfg.run_folder
    groups = tokenizer_groups(cfg)
    on_disk = load_prompts(run.prompts)
    existing: dict[str, list[Prompt]] = {}
    for p in on_disk:
        existing.setdefault(p.tokenizer, []).append(p)
    by_model: dict[str, list[Prompt]] = {}
    shared: dict = {}  # distractor sequences do not depend on the tokenizer: drawn once for every group
    if any(name not in existing for name in groups) or not run.tasks.is_file():  # (an older folder has none)
        tasks = tasks if tasks is not None else load_all_tasks(cfg)
        write_jsonl(run.tasks, (t.to_dict() for t in tasks), root=run.root)
    for tok_name, cards in groups.items():
        prompts = existing.get(tok_name)
        if prompts is None:
            assert tasks is not None
            card = cards[0]
            builder = IceBuilder.wired(cfg.ice, load_tokenizer(card), card.name, cfg.experiment.seed,
                                       embedder=cfg.analysis.embedder if needs_embedder(cfg) else None,
                                       use_chat_template=card.use_chat_template,
                                       id_tokenizer=tok_name if len(groups) > 1 else None, shared_candidates=shared)
            prompts = []
            for task in tqdm(tasks, desc=f"build prompts [{tok_name}]", disable=not progress, unit="task"):
                prompts += builder.build_all([task])
            on_disk += prompts
            write_jsonl(run.prompts, (p.to_dict() for p in on_disk), root=run.root)
        for c in cards:
            by_model[c.name] = prompts
    return by_model


__all__ = ["build_run_prompts", "load_all_tasks", "needs_embedder", "tokenizer_groups"]
