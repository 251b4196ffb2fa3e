"""The public API: what ``import probe`` offers, for scripts and notebooks; each function is glue over the stages and
has its method on :class:`Model`. Listed with a worked trial in docs/architecture.md#the-python-api."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence, Union

from probe.errors import ArgumentError, ConfigError, ProbeError
from probe.loaded_run import Run, load_run
from probe.loading import LoadedModel

if TYPE_CHECKING:
    from probe.analysis.results import Analysis
    from probe.attention.intervention import EditedBatch
    from probe.attention.result import SegmentAttention
    from probe.backends.base import Generation
    from probe.config import ExperimentConfig, IceSection
    from probe.probe_options import ProbeOptions
    from probe.tasks import TaskSection
    from probe.interventions import Intervention, RowEdit
    from probe.loading import ModelCard
    from probe.prompts.builder import IceBuilder
    from probe.types import Prompt, Task, TokenizedPrompt

log = logging.getLogger(__name__)

Experiment = Union[str, Path, Mapping[str, Any], "ExperimentConfig"]
PromptLike = Union["Prompt", "TokenizedPrompt"]

# the sections of an experiment that ``run`` / ``experiment_config`` overrides change key by key
OVERRIDABLE = ("experiment", "ice", "generation", "probe", "analysis")


@dataclass(repr=False)
class Model(LoadedModel):
    """A loaded model (card, transformers model, tokenizer) with the toolkit's stages as methods.

    :func:`load_model` returns one; every module function of :mod:`probe` that uses a model takes it (or a card
    name) first, and ``probe.f(m, x, ...)`` equals ``m.f(x, ...)``::

        m = probe.load_model()
        p = m.build_prompt(task, "Saturation", load=50)
        tp = m.tokenize(p)
        att = m.probe(p)
        with m.intervention(p, kind="knockout", keys="extraneous") as batch:
            m.model.generate(batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=16)

    Attributes (those of :class:`probe.loading.LoadedModel`): ``card``, ``model`` (the transformers model),
    ``tokenizer``, ``revision``, ``device``.
    """

    def __repr__(self) -> str:
        return f"Model({self.card.name!r}, device={self.device})"

    @classmethod
    def of(cls, loaded: LoadedModel) -> Model:
        """The same loaded model (no copy of its weights) with the methods; a Model is returned as it is."""
        if isinstance(loaded, Model):
            return loaded
        return cls(**{f.name: getattr(loaded, f.name) for f in dataclasses.fields(LoadedModel)})

    @property
    def name(self) -> str:
        """The card name (what prompt and trial records carry as the model)."""
        return self.card.name

    def builder(self, *, seed: int = 1234, ice: IceSection | None = None, embedder: str | None = None,
                use_chat_template: bool | None = None) -> IceBuilder:
        """The ICE prompt builder for this model's tokenizer (what the runner assembles for an experiment).

        Args:
            seed: the experiment seed (distractor draws and placements depend on it, not on the model).
            ice: conditions, loads, replications, distractor strategy, tolerance, instruction (default
                ``IceSection()``).
            embedder: a sentence-transformers model (name or path, e.g. ``"all-MiniLM-L6-v2"``) to record S_sim
                and to draw ``stratified`` distractors; None records no S_sim.
            use_chat_template: override the card's ``use_chat_template``.

        Returns:
            A :class:`~probe.prompts.builder.IceBuilder`.
        """
        from probe.config import IceSection
        from probe.prompts.builder import IceBuilder

        chat = self.card.use_chat_template if use_chat_template is None else use_chat_template
        return IceBuilder.wired(ice or IceSection(), self.tokenizer, self.card.name, seed, embedder=embedder,
                                use_chat_template=chat)

    def build_prompts(self, task: Task | Sequence[Task], *, conditions: Sequence[str] | None = None,
                      loads: Sequence[int] | None = None, replications: int | None = 1, seed: int = 1234,
                      ice: IceSection | None = None, embedder: str | None = None) -> list[Prompt]:
        """Every prompt of one task (or several) for this model's tokenizer, as ``probe build`` makes them.

        An ICE task gives Control per replication and the other conditions per load and replication; a task that
        brings its own segments (CogniLoad, a JSONL line with ``segments``) gives one prompt laid out as written.

        Args:
            task: a :class:`~probe.types.Task` (``probe.load_tasks``) or a sequence of them.
            conditions / loads / replications: override ``ice``'s (defaults: all four conditions, loads
                20/50/80 %, 1 replication).
            seed: the experiment seed.
            ice: the full ``[ice]`` section, when more than the three above is to change.
            embedder: sentence-transformers model for S_sim and stratified draws (None: no S_sim).

        Returns:
            The prompts, in the builder's order (per task: replication, Control, then per load the conditions).

        Raises:
            ArgumentError: ``task`` is not a Task (or a sequence of them).
            BuildError: a load cannot be reached within tolerance. ConfigError: an unknown condition or bad load.
        """
        tasks = _tasks_argument("build_prompts", task)
        seed = _whole("build_prompts", "seed", seed)
        if loads is not None:
            loads = [_whole("build_prompts", "each of loads", x) for x in loads]
        if replications is not None:
            replications = _whole("build_prompts", "replications", replications)
        builder = self.builder(seed=seed, ice=_ice_section(ice, conditions, loads, replications), embedder=embedder)
        return builder.build_all(tasks)

    def build_prompt(self, task: Task, condition: str | None = None, load: int = 50, replication: int = 0, *,
                     seed: int = 1234, ice: IceSection | None = None, embedder: str | None = None) -> Prompt:
        """One prompt: ``task`` under ``condition`` at ``load`` percent, replication ``replication``.

        The prompt equals the one an experiment with the same seed builds for that cell (same distractors, same
        placement). A task that brings its own segments has one prompt, laid out as written: leave ``condition``
        out.

        Args:
            task: the task.
            condition: ``Control``, ``LongControl``, ``Saturation`` or ``Residue`` (default Saturation; Control
                ignores ``load``).
            load: target load ℓ in percent (extraneous share of germane + extraneous tokens; LongControl: the
                filler share it is length-matched to).
            replication: 0-based replication (each draws its own distractor sample and placement).
            seed: the experiment seed.
            ice: tolerance, distractor strategy and instruction (default ``IceSection()``).
            embedder: sentence-transformers model for S_sim (None: no S_sim).

        Raises:
            ArgumentError: ``task`` is not a Task. ProbeError: a condition given for a natively laid out task.
            BuildError: the load cannot be reached. UnknownNameError: an unknown condition.
        """
        from probe.errors import UnknownNameError
        from probe.tasks import get_source
        from probe.types import CONDITIONS, Task

        if not isinstance(task, Task):
            raise ArgumentError(f"build_prompt: task must be a Task (probe.load_tasks(...)[i]), got "
                                f"{_kind(task)}")
        if condition is not None and not isinstance(condition, str):
            raise ArgumentError(f"build_prompt: condition must be a condition name ({', '.join(CONDITIONS)}), got "
                                f"{condition!r}")
        load, replication = _whole("build_prompt", "load", load), _whole("build_prompt", "replication", replication)
        seed = _whole("build_prompt", "seed", seed)
        builder = self.builder(seed=seed, ice=ice, embedder=embedder)
        if get_source(task.source).is_native(task):
            if condition is not None:
                raise ProbeError(f"task {task.task_id!r} is laid out from its own segments (source {task.source!r}); "
                                 f"it has no ICE condition {condition!r}: call build_prompt without a condition")
            return builder.build_native(task)
        condition = condition or "Saturation"
        if condition not in CONDITIONS:
            raise UnknownNameError("condition", condition, CONDITIONS)
        if condition == "LongControl":
            saturation = builder.build(task, "Saturation", load, replication)
            return builder.build_long_control(task, load, replication, saturation)
        return builder.build(task, condition, 0 if condition == "Control" else load, replication)

    def tokenize(self, prompt: Prompt, use_chat_template: bool | None = None) -> TokenizedPrompt:
        """The model input of a prompt with one exact token span per segment (:mod:`probe.prompts.tokenize`).

        Args:
            prompt: a built prompt.
            use_chat_template: override the card's setting.

        Returns:
            A :class:`~probe.types.TokenizedPrompt`: ``input_ids`` (T,) and ``spans`` partitioning them (template
            markup and special tokens are ``sink``).

        Raises:
            ArgumentError: ``prompt`` is not a Prompt. SpanError: a token crosses a segment boundary.
        """
        from probe.prompts.tokenize import encode_prompt
        from probe.types import Prompt

        if not isinstance(prompt, Prompt):
            raise ArgumentError(f"tokenize: prompt must be a built Prompt (build_prompt), got {_kind(prompt)}")
        chat = self.card.use_chat_template if use_chat_template is None else use_chat_template
        return encode_prompt(prompt, self.tokenizer, chat)

    def _tokenized(self, call: str, prompt: Any) -> TokenizedPrompt:
        from probe.types import Prompt, TokenizedPrompt

        if isinstance(prompt, TokenizedPrompt):
            return prompt
        if isinstance(prompt, Prompt):
            return self.tokenize(prompt)
        raise ArgumentError(f"{call}: a prompt must be a built Prompt or a TokenizedPrompt, got {_kind(prompt)}")

    def probe(self, prompt: Prompt | TokenizedPrompt, options: ProbeOptions | None = None,
              generated_ids: Sequence[int] | None = None, **option_values: Any) -> SegmentAttention:
        """Probe one prompt with the attention engine (:func:`probe.attention.probe_tokenized`; docs/probes.md).

        Args:
            prompt: a built prompt (tokenized with this model's tokenizer) or a TokenizedPrompt (any spans that
                partition the tokens).
            options: probe options (default ``ProbeOptions()``: query ``question``, γ = 0.5, cosine residue).
            generated_ids: answer ids appended to the prompt (query ``generated``).
            **option_values: single options to change (``query="last"``, ``gamma=0.7``, ``residue=False`` to skip
                AR_k, which costs every row of the germane, question and extraneous segments, ...).

        Returns:
            The prompt's :class:`~probe.attention.SegmentAttention`: ``seg_mass`` (layer, head, kind),
            ``seg_mass_segment`` (layer, head, segment), ``p_ext`` (layer, head), ``chance`` (layer,),
            ``enrichment`` (layer, head), ``ar_k`` (layer, head, target).

        Raises:
            ArgumentError: ``prompt`` is neither a Prompt nor a TokenizedPrompt.
            HookError: an unsupported architecture. ConfigError: a bad option.
        """
        from probe.attention import probe_tokenized
        from probe.probe_options import ProbeOptions

        opts = options or ProbeOptions()
        if option_values:
            unknown = sorted(set(option_values) - {f.name for f in dataclasses.fields(ProbeOptions)})
            if unknown:
                raise ConfigError(f"probe_prompt: {unknown[0]!r} is not a probe option (ProbeOptions: "
                                  f"{', '.join(f.name for f in dataclasses.fields(ProbeOptions))})")
            opts = dataclasses.replace(opts, **option_values)
        return probe_tokenized(self.model, self._tokenized("probe", prompt), opts, generated_ids)

    @contextlib.contextmanager
    def intervention(self, prompts: PromptLike | Sequence[PromptLike], spec: Intervention | None = None, *,
                     row_edits: Sequence[RowEdit] | None = None, seed: int = 0,
                     **spec_values: Any) -> Iterator[EditedBatch]:
        """Run this model under an attention intervention on some prompts (docs/interventions.md).

        Inside the block, ``m.model.generate(batch.input_ids, attention_mask=batch.attention_mask, ...)`` (or a
        forward pass) runs with the edit: in the chosen layers and heads, the attention of the queries to the keys
        is knocked out (−inf before the softmax) or steered (post-softmax weights × α, rows renormalised). The
        model's attention implementation is restored afterwards.

        Args:
            prompts: built prompts (tokenized with this model's tokenizer) or TokenizedPrompts (any segment spans);
                one or several, left-padded into one batch in the order given.
            spec: the :class:`~probe.interventions.Intervention`; or give its fields as ``spec_values``
                (``kind="knockout", keys="extraneous", queries="answer", layers=(10, 11), heads=None,
                alpha=None``).
            row_edits: per prompt, a :class:`~probe.interventions.RowEdit` (any key mask over its tokens and the
                first query position) instead of the keys and queries derived from the spans.
            seed: seeds ``matched-random`` keys (with each prompt's id, or its index for a TokenizedPrompt).

        Yields:
            The :class:`~probe.attention.intervention.EditedBatch` (``input_ids``, ``attention_mask``, ``pads``,
            ``rows``).

        Raises:
            ArgumentError: a prompt that is neither a Prompt nor a TokenizedPrompt, or both ``spec`` and
                ``spec_values``. ConfigError: a bad field or a layer/head outside the model. HookError: an
            unsupported architecture. SpanError: queries ``answer`` on a prompt without a question.
        """
        from probe.attention.intervention import apply_intervention
        from probe.interventions import Intervention
        from probe.types import Prompt, TokenizedPrompt

        if spec is not None and spec_values:
            raise ArgumentError("intervention: give an Intervention (spec=) or its fields, not both")
        if spec is None:
            spec = Intervention(**spec_values)
        elif not isinstance(spec, Intervention):
            raise ArgumentError(f"intervention: spec must be a probe.Intervention, got {_kind(spec)}")
        items = _items("intervention", prompts, (Prompt, TokenizedPrompt),
                       "prompts must be built Prompts or TokenizedPrompts")
        tokenized = [self._tokenized("intervention", p) for p in items]
        ids = [p.prompt_id if isinstance(p, Prompt) else str(i) for i, p in enumerate(items)]
        pad_id = 0 if self.tokenizer.pad_token_id is None else int(self.tokenizer.pad_token_id)
        with apply_intervention(self.model, tokenized, spec, row_edits=row_edits, seed=seed, prompt_ids=ids,
                                pad_id=pad_id) as batch:
            yield batch

    def generate(self, prompts: Prompt | Sequence[Prompt], *, intervention: Intervention | None = None,
                 probe: ProbeOptions | None = None, seed: int = 0, **generation: Any) -> list[Generation]:
        """Answer prompts as a run does (:class:`probe.backends.local.LocalBackend`: batched, greedy by default).

        Args:
            prompts: one built prompt or several.
            intervention: an :class:`~probe.interventions.Intervention` to generate under (None: the model as it is).
            probe: probe options, to get each prompt's attention in ``Generation.attention`` (None: no probe).
            seed: the seed of sampled decoding and of ``matched-random`` keys (an experiment's seed).
            **generation: ``[generation]`` keys: ``max_new_tokens`` (default 96), ``batch_size``, ``temperature``,
                ``top_p``.

        Returns:
            One :class:`~probe.backends.base.Generation` per prompt, in order: ``text`` (the answer), ``truncated``,
            ``output_ids``; ``skip_reason`` for a prompt longer than the context window allows.

        Raises:
            ArgumentError: a prompt that is not a Prompt. ConfigError: an unknown or invalid ``[generation]`` key.
        """
        from probe.backends.local import LocalBackend
        from probe.config import GenerationSection
        from probe.types import Prompt

        items = _items("generate", prompts, (Prompt,), "prompts must be built Prompts (build_prompt)")
        keys = {f.name for f in dataclasses.fields(GenerationSection)}
        unknown = sorted(set(generation) - keys)
        if unknown:
            raise ConfigError(f"generate: {unknown[0]!r} is not a [generation] key ({', '.join(sorted(keys))})")
        gen = GenerationSection(**generation)
        by_id = {p.prompt_id: g for p, g in LocalBackend(self, seed=seed).generate(items, gen, probe, intervention)}
        return [by_id[p.prompt_id] for p in items]

    def show(self, run: str | Path | Run, prompt_id: str, *, layer: int | None = None, head: int | None = None,
             query: str | None = None, out: str | Path | None = None) -> Path:
        """One prompt of a run of this model as an HTML page of its tokens shaded by attention (:func:`show`)."""
        return show(run, prompt_id, model=self, layer=layer, head=head, query=query, out=out)


def _kind(value: Any) -> str:
    """How an argument is named in an error message: its type, and what it is when it is a toolkit object."""
    from probe.types import Prompt, Task, TokenizedPrompt

    if isinstance(value, Task):
        return f"a Task ({value.task_id!r})"
    if isinstance(value, Prompt):
        return f"a Prompt ({value.prompt_id!r})"
    if isinstance(value, TokenizedPrompt):
        return f"a TokenizedPrompt ({len(value.input_ids)} tokens)"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _whole(call: str, name: str, value: Any) -> int:
    """``value`` as an int when it is a whole number (a numpy integer, 50.0), else ArgumentError naming ``name``."""
    import numbers

    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(f"{call}: {name} must be a whole number, got {value!r} ({_kind(value)})")
    return int(value)


def _items(call: str, value: Any, types: tuple[type, ...], what: str) -> list[Any]:
    """``value`` as a list of ``types``: one of them, or a sequence of them (else ArgumentError: ``call: what``)."""
    items = [value] if isinstance(value, types) else list(value) if isinstance(value, Sequence) else None
    bad = [value] if items is None else [x for x in items if not isinstance(x, types)]
    if bad:
        raise ArgumentError(f"{call}: {what}, got {_kind(bad[0])}")
    return items or []


def _tasks_argument(call: str, task: Any) -> list[Task]:
    from probe.types import Task

    return _items(call, task, (Task,), "task must be a Task or a sequence of Tasks (probe.load_tasks)")


def load_model(card: str | Path | ModelCard | None = None, device: str | None = None) -> Model:
    """Load a model card's model and tokenizer (:func:`probe.loading.load_model`).

    Args:
        card: a card name (``models/<name>.toml``, see ``probe models``), a path to a card TOML, or a ModelCard;
            None loads the default card (``smollm2-135m-instruct``, the embedded SmolLM2-135M-Instruct).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; None picks CUDA when available.

    Returns:
        A :class:`Model` (``.model``, ``.tokenizer``, ``.card``, and the stages as methods).

    Raises:
        UnknownNameError: no such card. ModelUnavailableError: the weights are not available here.
    """
    from probe.config import ExperimentSection
    from probe.loading import ModelCard, get_card
    from probe.loading import load_model as _load_model

    if card is None:
        card = ExperimentSection(name="default").models[0]
    if not isinstance(card, (str, Path, ModelCard)):
        raise ArgumentError(f"load_model: card must be a card name, a card TOML path or a ModelCard, got "
                            f"{_kind(card)}")
    resolved = card if isinstance(card, ModelCard) else get_card(str(card))
    return Model.of(_load_model(resolved, device=device))


def load_tasks(source: str | TaskSection = "synthetic", n: int | None = None, seed: int = 1234,
               **options: Any) -> list[Task]:
    """The tasks of one task source, as a ``[[tasks]]`` section of an experiment would give them.

    Args:
        source: a registered task source (``synthetic``, ``fanoutqa``, ``jsonl``, ``cogniload``; :mod:`probe.tasks`),
            or a whole ``[[tasks]]`` section (:class:`probe.tasks.TaskSection`, then without ``n`` or options).
        n: number of tasks (CogniLoad: puzzles per grid cell); default 1.
        seed: the seed (an experiment's first section uses the experiment seed).
        **options: the source's other keys (``hops``, ``path``, ``max_hops``, ``difficulty``, ``length``,
            ``needle_ratio``); a key the source does not read is refused.

    Returns:
        The tasks, in the source's fixed order.

    Raises:
        ConfigError: an unknown source, or an option the source does not read (named).
        ArgumentError: ``source`` is neither a source name nor a TaskSection, or a section with ``n`` or options.
    """
    from probe.tasks import TaskSection
    from probe.tasks import get_source, load_section

    seed = _whole("load_tasks", "seed", seed)
    if n is not None:
        n = _whole("load_tasks", "n", n)
    if isinstance(source, TaskSection):
        if n is not None or options:
            given = ["n"] * (n is not None) + sorted(options)
            raise ArgumentError(f"load_tasks: a TaskSection carries its own n and options; drop {', '.join(given)} "
                                "(or pass the source name with them)")
        return load_section(source, seed)
    if not isinstance(source, str):
        raise ArgumentError(f"load_tasks: source must be a task source name ('synthetic', 'jsonl', ...) or a "
                            f"TaskSection, got {_kind(source)}")
    src = get_source(source)
    idle = sorted(set(options) - src.options)
    if idle:
        raise ConfigError(f"load_tasks: {idle[0]!r} has no effect for source {source!r} (it reads "
                          f"{', '.join(sorted(src.options))})")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return load_section(TaskSection.of(source, n=1 if n is None else n, **values), seed)


def _ice_section(ice: IceSection | None, conditions: Sequence[str] | None, loads: Sequence[int] | None,
                 replications: int | None) -> IceSection:
    from probe.config import IceSection

    base = ice or IceSection()
    changes: dict[str, Any] = {}
    if conditions is not None:
        changes["conditions"] = tuple(conditions)
    if loads is not None:
        changes["loads"] = tuple(int(x) for x in loads)
    if replications is not None:
        changes["replications"] = int(replications)
    return dataclasses.replace(base, **changes) if changes else base


def _check_overrides(overrides: Any) -> dict[str, dict[str, Any]]:
    """``overrides`` checked (section -> key -> value, sections of :data:`OVERRIDABLE`), None values dropped."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ArgumentError(f"overrides: a dict of section -> key -> value, e.g. {{'generation': "
                            f"{{'max_new_tokens': 16}}}}, got {_kind(overrides)}")
    clean: dict[str, dict[str, Any]] = {}
    for section, values in overrides.items():
        if section not in OVERRIDABLE:
            hint = (" ([[tasks]], [[interventions]] and the model list are whole tables: give the experiment with "
                    "the ones you want, e.g. as a dict)" if section in ("tasks", "interventions", "models") else "")
            raise ConfigError(f"overrides: section {section!r} cannot be overridden key by key; "
                              f"{', '.join(OVERRIDABLE)} can{hint}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"overrides[{section!r}]: a dict of key -> value, got {_kind(values)}")
        kept = {k: v for k, v in values.items() if v is not None}
        if kept:
            clean[section] = kept
    return clean


def experiment_config(experiment: Experiment, overrides: Mapping[str, Mapping[str, Any]] | None = None
                      ) -> ExperimentConfig:
    """An experiment as a validated config, with overrides (section -> key -> value) applied.

    Args:
        experiment: an experiment TOML path, a dict laid out as the TOML file, or an ExperimentConfig.
        overrides: e.g. ``{"experiment": {"output_dir": "/tmp/x"}, "generation": {"max_new_tokens": 16}}``;
            None values are ignored. Only the single-table sections (``experiment``, ``ice``, ``generation``,
            ``probe``, ``analysis``) can be overridden; ``[[tasks]]`` and ``[[interventions]]`` cannot.

    Raises:
        ConfigError: an unknown section or key, a section that cannot be overridden, or an invalid value (named).
        ArgumentError: ``experiment`` or ``overrides`` of the wrong kind.
    """
    from probe.config import ExperimentConfig, config_from_dict, load_config

    clean = _check_overrides(overrides)
    if isinstance(experiment, ExperimentConfig):
        changes: dict[str, Any] = {}
        for section, values in clean.items():
            current = getattr(experiment, section)
            unknown = set(values) - {f.name for f in dataclasses.fields(current)}
            if unknown:
                raise ConfigError(f"overrides: {section}.{sorted(unknown)[0]} is not a key of [{section}]")
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
            changes[section] = dataclasses.replace(current, **values)
        return dataclasses.replace(experiment, **changes) if changes else experiment
    if isinstance(experiment, Mapping):
        data: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in experiment.items()}
        for section, values in clean.items():
            if not isinstance(data.setdefault(section, {}), dict):
                raise ConfigError(f"<experiment dict>: [{section}] must be a table (a dict), got "
                                  f"{type(data[section]).__name__}")
            data[section].update(values)
        return config_from_dict(data, "<experiment dict>")
    if not isinstance(experiment, (str, Path)):
        raise ArgumentError(f"experiment: an experiment TOML path, a dict laid out as the TOML file or an "
                            f"ExperimentConfig, got {_kind(experiment)}")
    return load_config(experiment, clean)


def run(experiment: Experiment, overrides: Mapping[str, Mapping[str, Any]] | None = None, *, analyze: bool = False,
        report: bool = False, device: str | None = None, progress: bool = True, force: bool = False) -> Run:
    """Run an experiment end to end, as ``probe run`` does (resumable: finished trials are not redone).

    Args:
        experiment: an experiment TOML path, a dict laid out as the TOML file, or an ExperimentConfig.
        overrides: section -> key -> value, e.g. ``{"experiment": {"output_dir": tmp}}`` (the single-table
            sections only: see :func:`experiment_config`).
        analyze: also write ``analysis.json`` (``probe analyze``).
        report: with ``analyze``, also write ``report.html`` (``probe report``).
        device: ``"cpu"`` / ``"cuda[:i]"`` for local models (None: CUDA when available).
        progress: show progress bars.
        force: start the run folder over even if its config differs (else that is an error).

    Returns:
        The run folder's records (:class:`~probe.loaded_run.Run`).

    Raises:
        ConfigError: a bad experiment or override (named), or ``report`` without ``analyze``.
    """
    from probe.runner import run_experiment

    if report and not analyze:
        raise ConfigError("run(report=True) needs analyze=True: the report is drawn from the analysis")
    cfg = experiment_config(experiment, overrides)
    run_dir = run_experiment(cfg, progress=progress, force=force, device=device)
    if analyze:
        _analyze_folder(run_dir)
        if report:
            _render_folder(run_dir)
    return load_run(run_dir)


def _analyze_folder(path: Path) -> Analysis:
    from probe.analysis import analyze_run
    from probe.report import write_tables

    analysis = analyze_run(path)
    write_tables(analysis, path)
    return analysis


def _render_folder(path: Path) -> Path:
    from probe.report import render_report as _render

    return _render(path)


def _run_path(call: str, run: Any) -> Path:
    if isinstance(run, Run):
        return run.path
    if isinstance(run, (str, Path)):
        return Path(run)
    raise ArgumentError(f"{call}: run must be a run folder (a path) or a probe.Run, got {_kind(run)}")


def analyze(run: str | Path | Run) -> Analysis:
    """Analyse a run folder (``probe analyze``): writes ``analysis.json``, ``analysis.md`` and ``tables/*.csv``;
    returns the analysis (:class:`probe.analysis.results.Analysis`).

    A folder without ``config.toml`` (trials written by another tool) is analysed with the default settings.

    Raises:
        ProbeError: the folder holds no trial records, or a record is damaged (``file:line``).
    """
    return _analyze_folder(_run_path("analyze", run))


def render_report(run: str | Path | Run) -> Path:
    """Write a run folder's ``report.html`` and ``figures/`` (``probe report``) from its ``analysis.json``;
    returns the report's path.

    Raises:
        RunNotFoundError: not a run folder.
        ProbeError: the analysis is missing or older than the trials (run :func:`analyze` first).
    """
    return _render_folder(load_run(_run_path("render_report", run)).path)


def show(run: str | Path | Run, prompt_id: str, *, model: LoadedModel | str | None = None, layer: int | None = None,
         head: int | None = None, query: str | None = None, out: str | Path | None = None,
         device: str | None = None) -> Path:
    """Write one prompt's attention as a self-contained HTML page (``probe show``).

    The prompt is tokenized as the run did and recomputed with one forward pass (:mod:`probe.prompt_view`); the
    page (:mod:`probe.report.show`) shades every token by the attention the query set gives it and lists the
    per-segment masses (the run's attention record when it has one).

    Args:
        run: the run folder (or a loaded Run).
        prompt_id: the prompt to show (as in ``prompts.jsonl`` / ``trials.jsonl``).
        model: the model to recompute with: a loaded model (a notebook saves loading it again) or the name of one
            of the run's model cards (loaded from the run's card); None: the run's model of that prompt.
        layer: 0-based layer (None: the mean over layers).
        head: 0-based head (None: the mean over heads).
        query: the query set, ``question`` or ``last`` (default: the run's ``probe.query``).
        out: the HTML file to write (default ``<run>/show/<model>/<prompt>[.L<layer>][.H<head>].html``).
        device: where to load the model when it is not given loaded.

    Returns:
        The page's path.

    Raises:
        UnknownPromptError / UnknownNameError: an unknown prompt id / model. ProbeError: a layer or head out of
        range, or a loaded model that is not the run's. ArgumentError: ``model`` of the wrong kind.
    """
    from probe.prompt_view import view_prompt
    from probe.report.show import write_prompt_view

    if model is not None and not isinstance(model, (LoadedModel, str)):
        raise ArgumentError(f"show: model must be a loaded model or the name of one of the run's model cards, got "
                            f"{_kind(model)}")
    view = view_prompt(run, prompt_id, model=model, query=query, device=device)
    view.check_selection(layer, head)
    folder = load_run(run).folder
    path = Path(out) if out is not None else folder.show_page(view.model, prompt_id, layer, head)
    return write_prompt_view(view, path, layer, head, root=None if out is not None else folder.root)


__all__ = ["ArgumentError", "Model", "Run", "analyze", "experiment_config", "load_model", "load_run", "load_tasks",
           "render_report", "run", "show"]
