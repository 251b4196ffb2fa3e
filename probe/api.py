"""The public API: what ``import probe`` offers, for scripts and notebooks.

One trial's path, by hand::

    import probe
    lm = probe.load_model()                                   # the default card, smollm2-135m-instruct
    task = probe.load_tasks("synthetic", n=1)[0]
    prompt = probe.build_prompt(task, lm, "Saturation", load=50)
    tp = probe.tokenize_prompt(prompt, lm)                    # token ids + one span per segment
    att = probe.probe_prompt(lm, prompt)                      # SegmentAttention: p_ext, chance, enrichment, ...

A whole experiment::

    run = probe.run("experiments/demo.toml", analyze=True, report=True)   # -> Run (the run folder's records)
    run = probe.load_run("outputs/demo")
    run.trials, run.prompts, run.config, run.attention(prompt_id)
    probe.show(run, prompt_id)                                # one prompt's attention as an HTML page

Each function here is glue over the stages (:mod:`probe.tasks`, :mod:`probe.prompts`, :mod:`probe.loading`,
:mod:`probe.attention`, :mod:`probe.runner`, :mod:`probe.analysis`, :mod:`probe.report`); it assembles the objects
a stage needs from what a researcher has at hand (a task and a model) and adds no behaviour of its own. Torch and
transformers are imported only when a function that needs them is called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence, Union

from probe.errors import ConfigError, ProbeError
from probe.loaded_run import Run, load_run

if TYPE_CHECKING:
    from probe.analysis.results import Analysis
    from probe.attention.intervention import EditedBatch, Intervention, RowEdit
    from probe.attention.result import SegmentAttention
    from probe.config import ExperimentConfig, IceSection, ProbeSection
    from probe.loading import LoadedModel, ModelCard
    from probe.prompts.builder import IceBuilder
    from probe.types import Prompt, Task, TokenizedPrompt

log = logging.getLogger(__name__)

# What the prompt functions accept as "the model": a loaded model, a card (or its name / TOML path), or a
# transformers tokenizer (prompts are built and tokenized in a tokenizer; the weights are not needed).
ModelLike = Union["LoadedModel", "ModelCard", str, Any]
Experiment = Union[str, Path, Mapping[str, Any], "ExperimentConfig"]


def load_model(card: str | ModelCard | None = None, device: str | None = None) -> LoadedModel:
    """Load a model card's model and tokenizer (:func:`probe.loading.load_model`).

    Args:
        card: a card name (``models/<name>.toml``, see ``probe models``), a path to a card TOML, or a ModelCard;
            None loads the default card (``smollm2-135m-instruct``, the embedded SmolLM2-135M-Instruct).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; None picks CUDA when available.

    Returns:
        A :class:`~probe.loading.LoadedModel` (``.model``, ``.tokenizer``, ``.card``).

    Raises:
        UnknownNameError: no such card. ModelUnavailableError: the weights are not available here.
    """
    from probe.config import ExperimentSection
    from probe.loading import load_model as _load_model

    return _load_model(card if card is not None else ExperimentSection(name="default").models[0], device=device)


def load_tasks(source: str = "synthetic", n: int = 1, seed: int = 1234, **options: Any) -> list[Task]:
    """The tasks of one task source, as a ``[[tasks]]`` section of an experiment would give them.

    Args:
        source: a registered task source (``synthetic``, ``fanoutqa``, ``jsonl``, ``cogniload``; :mod:`probe.tasks`).
        n: number of tasks (CogniLoad: puzzles per grid cell).
        seed: the seed (an experiment's first section uses the experiment seed).
        **options: the source's other keys (``hops``, ``path``, ``max_hops``, ``difficulty``, ``length``,
            ``needle_ratio``); a key the source does not read is refused.

    Returns:
        The tasks, in the source's fixed order.

    Raises:
        ConfigError: an unknown source, or an option the source does not read (named).
    """
    from probe.config import TaskSection
    from probe.tasks import get_source
    from probe.tasks import load_tasks as _load_tasks

    src = get_source(source)
    idle = sorted(set(options) - src.options)
    if idle:
        raise ConfigError(f"load_tasks: {idle[0]!r} has no effect for source {source!r} (it reads "
                          f"{', '.join(sorted(src.options))})")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return _load_tasks(TaskSection(source=source, n=n, **values), seed)


def _tokenizer_of(model: ModelLike) -> tuple[Any, str, bool]:
    """(tokenizer, its name for prompt records, whether to apply the chat template) of anything model-like."""
    from probe.loading import LoadedModel, ModelCard, get_card, load_tokenizer

    if isinstance(model, LoadedModel):
        return model.tokenizer, model.card.name, model.card.use_chat_template
    if isinstance(model, (str, Path)):
        model = get_card(str(model))
    if isinstance(model, ModelCard):
        return load_tokenizer(model), model.name, model.use_chat_template
    if callable(model) and hasattr(model, "convert_ids_to_tokens"):  # a transformers tokenizer
        return model, str(getattr(model, "name_or_path", "") or type(model).__name__), True
    raise ProbeError(f"expected a loaded model, a model card (or its name) or a tokenizer, got {type(model).__name__}")


def make_builder(model: ModelLike, *, seed: int = 1234, ice: IceSection | None = None,
                 embedder: str | None = None, use_chat_template: bool | None = None) -> IceBuilder:
    """The ICE prompt builder for one model's tokenizer (what the runner assembles for an experiment).

    Args:
        model: a loaded model, a card (name or TOML path) or a tokenizer; loads are counted in its tokenizer.
        seed: the experiment seed (distractor draws and placements depend on it, not on the model).
        ice: conditions, loads, replications, distractor strategy, tolerance, instruction (default
            ``IceSection()``).
        embedder: a sentence-transformers model (name or path, e.g. ``"all-MiniLM-L6-v2"``) to record S_sim and to
            draw ``stratified`` distractors; None records no S_sim.
        use_chat_template: override the card's ``use_chat_template`` (a bare tokenizer: True).

    Returns:
        A :class:`~probe.prompts.builder.IceBuilder`.
    """
    from probe.config import IceSection
    from probe.prompts.builder import IceBuilder
    from probe.prompts.distractors import distractor_facts
    from probe.prompts.filler import neutral_filler

    tokenizer, name, chat = _tokenizer_of(model)
    similarity = s_sim = None
    if embedder:
        from probe.prompts.similarity import get_embedder

        emb = get_embedder(embedder)
        similarity, s_sim = emb.similarity_to, emb.s_sim
    return IceBuilder(ice=ice or IceSection(), tokenizer=tokenizer, tokenizer_name=name, seed=seed,
                      distractors=distractor_facts, filler=neutral_filler, similarity=similarity, s_sim=s_sim,
                      use_chat_template=chat if use_chat_template is None else use_chat_template)


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


def build_prompts(task: Task | Sequence[Task], model: ModelLike, *, conditions: Sequence[str] | None = None,
                  loads: Sequence[int] | None = None, replications: int | None = 1, seed: int = 1234,
                  ice: IceSection | None = None, embedder: str | None = None) -> list[Prompt]:
    """Every prompt of one task (or several) for one model's tokenizer, as ``probe build`` makes them.

    An ICE task gives Control per replication and the other conditions per load and replication; a task that
    brings its own segments (CogniLoad, a JSONL line with ``segments``) gives one prompt laid out as written.

    Args:
        task: a :class:`~probe.types.Task` (``probe.load_tasks``) or a sequence of them.
        model: a loaded model, a card (name or TOML path) or a tokenizer.
        conditions / loads / replications: override ``ice``'s (defaults: all four conditions, loads 20/50/80 %,
            1 replication).
        seed: the experiment seed.
        ice: the full ``[ice]`` section, when more than the three above is to change.
        embedder: sentence-transformers model for S_sim and stratified draws (None: no S_sim).

    Returns:
        The prompts, in the builder's order (per task: replication, Control, then per load the conditions).

    Raises:
        BuildError: a load cannot be reached within tolerance. ConfigError: an unknown condition or bad load.
    """
    tasks = [task] if not isinstance(task, Sequence) else list(task)
    builder = make_builder(model, seed=seed, ice=_ice_section(ice, conditions, loads, replications),
                           embedder=embedder)
    return builder.build_all(tasks)


def build_prompt(task: Task, model: ModelLike, condition: str | None = None, load: int = 50, replication: int = 0,
                 *, seed: int = 1234, ice: IceSection | None = None, embedder: str | None = None) -> Prompt:
    """One prompt: ``task`` under ``condition`` at ``load`` percent, replication ``replication``.

    The prompt equals the one an experiment with the same seed builds for that cell (same distractors, same
    placement). A task that brings its own segments has one prompt, laid out as written: leave ``condition`` out.

    Args:
        task: the task.
        model: a loaded model, a card (name or TOML path) or a tokenizer (loads are counted in it).
        condition: ``Control``, ``LongControl``, ``Saturation`` or ``Residue`` (default Saturation; Control ignores
            ``load``).
        load: target load ℓ in percent (extraneous share of germane + extraneous tokens; LongControl: the filler
            share it is length-matched to).
        replication: 0-based replication (each draws its own distractor sample and placement).
        seed: the experiment seed.
        ice: tolerance, distractor strategy and instruction (default ``IceSection()``).
        embedder: sentence-transformers model for S_sim (None: no S_sim).

    Raises:
        ProbeError: a condition given for a natively laid out task. BuildError: the load cannot be reached.
        UnknownNameError: an unknown condition.
    """
    from probe.errors import UnknownNameError
    from probe.tasks import get_source
    from probe.types import CONDITIONS

    builder = make_builder(model, seed=seed, ice=ice, embedder=embedder)
    if get_source(task.source).is_native(task):
        if condition is not None:
            raise ProbeError(f"task {task.task_id!r} is laid out from its own segments (source {task.source!r}); it "
                             f"has no ICE condition {condition!r}: call build_prompt without a condition")
        return builder.build_native(task)
    condition = condition or "Saturation"
    if condition not in CONDITIONS:
        raise UnknownNameError("condition", condition, CONDITIONS)
    if condition == "LongControl":
        return builder.build_long_control(task, load, replication, builder.build(task, "Saturation", load, replication))
    return builder.build(task, condition, 0 if condition == "Control" else load, replication)


def tokenize_prompt(prompt: Prompt, model: ModelLike, use_chat_template: bool | None = None) -> TokenizedPrompt:
    """The model input of a prompt with one exact token span per segment (:mod:`probe.prompts.tokenize`).

    Args:
        prompt: a built prompt.
        model: a loaded model, a card (name or TOML path) or a tokenizer.
        use_chat_template: override the card's setting (a bare tokenizer: True).

    Returns:
        A :class:`~probe.types.TokenizedPrompt`: ``input_ids`` (T,) and ``spans`` partitioning them (template
        markup and special tokens are ``sink``).

    Raises:
        SpanError: a token crosses a segment boundary.
    """
    from probe.prompts.tokenize import tokenize_prompt as _tokenize

    tokenizer, _, chat = _tokenizer_of(model)
    return _tokenize(prompt, tokenizer, chat if use_chat_template is None else use_chat_template)


def probe_prompt(model: Any, prompt: Prompt | TokenizedPrompt, options: ProbeSection | None = None, *,
                 generated_ids: Sequence[int] | None = None, compute_residue: bool = True,
                 **option_values: Any) -> SegmentAttention:
    """Probe one prompt with the attention engine (:func:`probe.attention.probe_prompt`; docs/probes.md).

    Args:
        model: a loaded model (``probe.load_model``), or a transformers causal LM when ``prompt`` is tokenized.
        prompt: a built prompt (tokenized with the model's tokenizer) or a TokenizedPrompt (any spans that
            partition the tokens).
        options: probe options (default ``ProbeSection()``: query ``question``, γ = 0.5, cosine residue).
        generated_ids: answer ids appended to the prompt (query ``generated``).
        compute_residue: compute AR_k (costs more: every row of the germane, question and extraneous segments).
        **option_values: single options to change (``query="last"``, ``gamma=0.7``, ...).

    Returns:
        The prompt's :class:`~probe.attention.SegmentAttention`: ``seg_mass`` (layer, head, kind),
        ``seg_mass_segment`` (layer, head, segment), ``p_ext`` (layer, head), ``chance`` (layer,), ``enrichment``
        (layer, head), ``ar_k`` (layer, head, target).

    Raises:
        ProbeError: a Prompt with a bare transformers model (give the loaded model, or tokenize first).
        HookError: an unsupported architecture. ConfigError: a bad option.
    """
    from probe.attention import probe_prompt as _probe
    from probe.config import ProbeSection
    from probe.loading import LoadedModel
    from probe.types import Prompt

    opts = options or ProbeSection()
    if option_values:
        opts = dataclasses.replace(opts, **option_values)
    if isinstance(prompt, Prompt):
        if not isinstance(model, LoadedModel):
            raise ProbeError("probe_prompt: a built Prompt needs the loaded model (probe.load_model) to tokenize it; "
                             "or pass probe.tokenize_prompt(prompt, tokenizer)")
        prompt = tokenize_prompt(prompt, model)
    hf_model = model.model if isinstance(model, LoadedModel) else model
    return _probe(hf_model, prompt, opts, generated_ids=generated_ids, compute_residue=compute_residue)


@contextlib.contextmanager
def intervention(model: Any, prompts: Prompt | TokenizedPrompt | Sequence[Prompt | TokenizedPrompt],
                 spec: Intervention | None = None, *, row_edits: Sequence[RowEdit] | None = None, seed: int = 0,
                 **spec_values: Any) -> Iterator[EditedBatch]:
    """Run a model under an attention intervention on some prompts (:mod:`probe.attention.intervention`).

    Inside the block, ``model.generate(batch.input_ids, attention_mask=batch.attention_mask, ...)`` (or a forward
    pass) runs with the edit: in the chosen layers and heads, the attention of the queries to the keys is knocked
    out (−inf before the softmax) or steered (post-softmax weights × α, rows renormalised). The model's attention
    implementation is restored afterwards.

    Args:
        model: a loaded model (``probe.load_model``), or a transformers causal LM when the prompts are tokenized.
        prompts: built prompts (tokenized with the model's tokenizer) or TokenizedPrompts (any segment spans); one
            or several, left-padded into one batch in the order given.
        spec: the :class:`~probe.attention.intervention.Intervention`; or give its fields as ``spec_values``
            (``kind="knockout", keys="extraneous", queries="answer", layers=(10, 11), heads=None, alpha=None``).
        row_edits: per prompt, a :class:`~probe.attention.intervention.RowEdit` (any key mask over its tokens and
            the first query position) instead of the keys and queries derived from the spans.
        seed: seeds ``matched-random`` keys (with each prompt's id, or its index for a TokenizedPrompt).

    Yields:
        The :class:`~probe.attention.intervention.EditedBatch` (``input_ids``, ``attention_mask``, ``pads``,
        ``rows``).

    Raises:
        ProbeError: a Prompt with a bare transformers model, or both ``spec`` and ``spec_values``.
        ConfigError: a bad field or a layer/head outside the model. HookError: an unsupported architecture.
        SpanError: queries ``answer`` on a prompt without a question.
    """
    from probe.attention.intervention import Intervention
    from probe.attention.intervention import intervention as _intervention
    from probe.loading import LoadedModel
    from probe.types import Prompt, TokenizedPrompt

    if spec is not None and spec_values:
        raise ProbeError("intervention: give an Intervention or its fields, not both")
    if spec is None:
        spec = Intervention(**spec_values)
    items = [prompts] if isinstance(prompts, (Prompt, TokenizedPrompt)) else list(prompts)
    tokenized: list[TokenizedPrompt] = []
    ids: list[str] = []
    for i, p in enumerate(items):
        if isinstance(p, Prompt):
            if not isinstance(model, LoadedModel):
                raise ProbeError("intervention: a built Prompt needs the loaded model (probe.load_model) to tokenize "
                                 "it; or pass probe.tokenize_prompt(prompt, tokenizer)")
            tokenized.append(tokenize_prompt(p, model))
            ids.append(p.prompt_id)
        else:
            tokenized.append(p)
            ids.append(str(i))
    hf_model = model.model if isinstance(model, LoadedModel) else model
    pad_id = 0
    if isinstance(model, LoadedModel) and model.tokenizer.pad_token_id is not None:
        pad_id = int(model.tokenizer.pad_token_id)
    with _intervention(hf_model, tokenized, spec, row_edits=row_edits, seed=seed, prompt_ids=ids,
                       pad_id=pad_id) as batch:
        yield batch


def experiment_config(experiment: Experiment, overrides: Mapping[str, Mapping[str, Any]] | None = None
                      ) -> ExperimentConfig:
    """An experiment as a validated config, with overrides (section -> key -> value) applied.

    Args:
        experiment: an experiment TOML path, a dict laid out as the TOML file, or an ExperimentConfig.
        overrides: e.g. ``{"experiment": {"output_dir": "/tmp/x"}, "generation": {"max_new_tokens": 16}}``;
            None values are ignored.

    Raises:
        ConfigError: an unknown section or key, or an invalid value (named).
    """
    from probe.config import ExperimentConfig, config_from_dict, load_config

    clean = {s: {k: v for k, v in vals.items() if v is not None} for s, vals in (overrides or {}).items()}
    clean = {s: v for s, v in clean.items() if v}
    if isinstance(experiment, ExperimentConfig):
        changes: dict[str, Any] = {}
        for section, values in clean.items():
            if section not in ("experiment", "ice", "generation", "probe", "analysis"):
                raise ConfigError(f"overrides: section {section!r} cannot be overridden (experiment, ice, "
                                  "generation, probe, analysis can)")
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
            data.setdefault(section, {}).update(values)
        return config_from_dict(data, "<experiment dict>")
    return load_config(experiment, clean)


def run(experiment: Experiment, overrides: Mapping[str, Mapping[str, Any]] | None = None, *, analyze: bool = False,
        report: bool = False, device: str | None = None, progress: bool = True, force: bool = False) -> Run:
    """Run an experiment end to end, as ``probe run`` does (resumable: finished trials are not redone).

    Args:
        experiment: an experiment TOML path, a dict laid out as the TOML file, or an ExperimentConfig.
        overrides: section -> key -> value, e.g. ``{"experiment": {"output_dir": tmp}}``.
        analyze: also write ``analysis.json`` (``probe analyze``).
        report: with ``analyze``, also write ``report.html`` (``probe report``).
        device: ``"cpu"`` / ``"cuda[:i]"`` for local models (None: CUDA when available).
        progress: show progress bars.
        force: overwrite a run folder's config even if it differs (else that is an error).

    Returns:
        The run folder's records (:class:`~probe.loaded_run.Run`).
    """
    from probe.runner import run_experiment

    cfg = experiment_config(experiment, overrides)
    run_dir = run_experiment(cfg, progress=progress, force=force, device=device)
    if analyze:
        _analyze_folder(run_dir)
        if report:
            _render_folder(run_dir)
    elif report:
        raise ConfigError("run(report=True) needs analyze=True: the report is drawn from the analysis")
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


def analyze(run: str | Path | Run) -> Analysis:
    """Analyse a run folder (``probe analyze``): writes ``analysis.json``, ``analysis.md`` and ``tables/*.csv``;
    returns the analysis (:class:`probe.analysis.results.Analysis`).

    A folder without ``config.toml`` (trials written by another tool) is analysed with the default settings.

    Raises:
        ProbeError: the folder holds no trial records, or a record is damaged (``file:line``).
    """
    return _analyze_folder(run.path if isinstance(run, Run) else Path(run))


def render_report(run: str | Path | Run) -> Path:
    """Write a run folder's ``report.html`` and ``figures/`` (``probe report``) from its ``analysis.json``;
    returns the report's path.

    Raises:
        RunNotFoundError: not a run folder.
        ProbeError: the analysis is missing or older than the trials (run :func:`analyze` first).
    """
    return _render_folder(load_run(run).path)


def show(run: str | Path | Run, prompt_id: str, *, layer: int | None = None, head: int | None = None,
         model: str | None = None, query: str | None = None, out: str | Path | None = None,
         loaded: LoadedModel | None = None, device: str | None = None) -> Path:
    """Write one prompt's attention as a self-contained HTML page (``probe show``).

    The prompt is tokenized as the run did and recomputed with one forward pass (:mod:`probe.prompt_view`); the
    page (:mod:`probe.report.show`) shades every token by the attention the query set gives it and lists the
    per-segment masses (the run's attention record when it has one).

    Args:
        run: the run folder (or a loaded Run).
        prompt_id: the prompt to show (as in ``prompts.jsonl`` / ``trials.jsonl``).
        layer: 0-based layer (None: the mean over layers).
        head: 0-based head (None: the mean over heads).
        model: the run's model card (may be left out when the run has one local model).
        query: the query set, ``question`` or ``last`` (default: the run's ``probe.query``).
        out: the HTML file to write (default ``<run>/show/<model>/<prompt>[.L<layer>][.H<head>].html``).
        loaded: the model already loaded (a notebook saves loading it again).
        device: where to load the model when ``loaded`` is None.

    Returns:
        The page's path.

    Raises:
        UnknownPromptError / UnknownNameError: an unknown prompt id / model. ProbeError: a layer or head out of range.
    """
    from probe.prompt_view import view_prompt
    from probe.report.show import write_prompt_view

    view = view_prompt(run, prompt_id, model=model, loaded=loaded, query=query, device=device)
    view.check_selection(layer, head)
    path = Path(out) if out is not None else load_run(run).folder.show_page(view.model, prompt_id, layer, head)
    return write_prompt_view(view, path, layer, head)


__all__ = ["Run", "analyze", "build_prompt", "build_prompts", "experiment_config", "load_model", "load_run",
           "load_tasks", "make_builder", "probe_prompt", "render_report", "run", "show", "tokenize_prompt"]
