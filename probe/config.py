"""Experiment definitions: one TOML file -> frozen dataclasses. Unknown keys are errors naming file and key.

Precedence is defaults < file < CLI flags actually passed. ``__post_init__`` only validates. :func:`dump_config`
writes a config back as TOML that reads back equal (every string escaped as TOML requires: newlines, tabs, quotes,
backslashes, control characters); the run folder keeps that text (:func:`read_run_config` reads it back).
"""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.codec import CodecError, decode, encode
from probe.errors import ConfigError, FieldError
from probe.interventions import INTERVENTION_NAME, RESOLUTION_FIELDS, InterventionSpec
from probe.probe_options import ProbeOptions
from probe.runfolder import RunFolder, folder_name_problem
from probe.tasks import SOURCES, TaskSection, get_source
from probe.types import CONDITIONS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExperimentSection:
    name: str
    seed: int = 1234
    models: tuple[str, ...] = ("smollm2-135m-instruct",)
    output_dir: str = "outputs"

    def __post_init__(self) -> None:
        problem = folder_name_problem(self.name) if isinstance(self.name, str) else "is not a string"
        if problem is not None:
            raise ConfigError(f"experiment.name: {self.name!r} {problem}; the run folder's name must be one folder "
                              "name (letters, digits, '-', '_', '.', spaces; not '.' or '..')")
        if not self.models:
            raise ConfigError("experiment.models: give at least one model card name (see `probe models`)")
        _refuse_repeats("experiment.models", self.models)


def _refuse_repeats(field_name: str, values: tuple[Any, ...]) -> None:
    """A list setting that names a value twice would be run (or dropped) silently; refuse it naming the value."""
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{field_name}: {v!r} is listed twice; list each value once")
        seen.add(v)


@dataclass(frozen=True)
class IceSection:
    conditions: tuple[str, ...] = CONDITIONS
    loads: tuple[int, ...] = (20, 50, 80)
    replications: int = 2
    distractor_strategy: str = "random"  # or "stratified" by S_sim (docs/method.md#distractors-and-replications)
    load_tolerance: float = 5.0  # percentage points
    instruction: str | None = None  # None: the default step-by-step + \boxed{} instruction

    def __post_init__(self) -> None:
        if not self.conditions:
            raise ConfigError(f"ice.conditions: empty, which builds no prompt; list some of {', '.join(CONDITIONS)}")
        for c in self.conditions:
            if c not in CONDITIONS:
                raise ConfigError(f"ice.conditions: {c!r} is not one of {', '.join(CONDITIONS)}")
        _refuse_repeats("ice.conditions", self.conditions)
        if not self.loads and set(self.conditions) != {"Control"}:
            loaded = ", ".join(c for c in self.conditions if c != "Control")
            raise ConfigError(f"ice.loads: empty, which drops every prompt of {loaded}; give at least one load in "
                              "percent (e.g. [20, 50, 80]), or keep only \"Control\" in ice.conditions")
        for ld in self.loads:
            if not 0 < ld < 100:
                raise ConfigError(f"ice.loads: {ld} must be a percentage strictly between 0 and 100")
        _refuse_repeats("ice.loads", self.loads)
        if self.replications < 1:
            raise ConfigError(f"ice.replications: {self.replications} must be >= 1")
        if self.distractor_strategy not in ("random", "stratified"):
            raise ConfigError(f"ice.distractor_strategy: {self.distractor_strategy!r} is not 'random' or 'stratified'")


@dataclass(frozen=True)
class GenerationSection:
    max_new_tokens: int = 96
    batch_size: int = 8
    temperature: float = 0.0  # 0 = greedy (docs/method.md#scoring)
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"generation.max_new_tokens: {self.max_new_tokens} must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"generation.batch_size: {self.batch_size} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"generation.temperature: {self.temperature} must be a finite number >= 0 "
                              "(0: greedy decoding)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"generation.top_p: {self.top_p} must lie in (0, 1] (1: no nucleus cut)")


@dataclass(frozen=True)
class ProbeSection(ProbeOptions):
    """The ``[probe]`` table: whether a run probes (``enabled``) and the engine's options
    (:class:`probe.probe_options.ProbeOptions`)."""

    enabled: bool = False


@dataclass(frozen=True)
class AnalysisSection:
    brittle_em: float = 0.10  # Control EM below this -> intrinsic-load brittle
    confound_rate: float = 0.20  # truncated-or-uninterpretable rate above this -> confounded
    alpha: float = 0.05
    embedder: str = "all-MiniLM-L6-v2"
    n_bootstrap: int = 500
    # δ of the equivalence test of paired comparisons, in EM
    # (docs/statistics.md#equivalence-two-one-sided-tests-tost)
    equivalence_margin: float = 0.10

    def __post_init__(self) -> None:
        if not 0 < self.equivalence_margin < 1:
            raise ConfigError(f"analysis.equivalence_margin: {self.equivalence_margin} must lie in (0, 1) (a "
                              "difference of EM, e.g. 0.10 for one question in ten)")


@dataclass(frozen=True)
class ExperimentConfig:
    experiment: ExperimentSection
    tasks: tuple[TaskSection, ...]
    ice: IceSection = field(default_factory=IceSection)
    generation: GenerationSection = field(default_factory=GenerationSection)
    probe: ProbeSection = field(default_factory=ProbeSection)
    analysis: AnalysisSection = field(default_factory=AnalysisSection)
    interventions: tuple[InterventionSpec, ...] = ()

    @property
    def run_dir(self) -> Path:
        """The run folder's path, ``<output_dir>/<name>`` (its files: :attr:`run_folder`)."""
        return Path(self.experiment.output_dir) / self.experiment.name

    @property
    def run_folder(self) -> RunFolder:
        """The run folder, which names every file of the run (:class:`probe.runfolder.RunFolder`)."""
        return RunFolder(self.run_dir)

    def to_dict(self) -> dict[str, Any]:
        """The plain form (:func:`probe.codec.encode`) without the unset (None) values, which TOML cannot hold."""
        plain: dict[str, Any] = _drop_none(encode(self))
        plain["probe"] = {"enabled": plain["probe"].pop("enabled"), **plain["probe"]}  # as the table is written
        plain["tasks"] = [{"source": t.source, **_drop_none(encode(t.options))} for t in self.tasks]
        plain["interventions"] = [{"name": i.pop("name"), **{k: v for k, v in i.items() if k not in RESOLUTION_FIELDS}}
                                  for i in plain["interventions"]]  # the name first; as declared
        return plain


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


def _build(cls: type, data: Any, where: str) -> Any:
    """A section of type ``cls`` from its TOML table (:func:`probe.codec.decode`): every key and value checked."""
    try:
        return decode(cls, data)
    except CodecError as e:
        raise ConfigError(f"{where}.{e.where}: {e.problem}" if e.where else f"{where}: {e.problem}") from None


def _retire_kernel(table: Any, where: str) -> Any:
    """The ``[probe]`` table without ``kernel``, which chose between two engines that gave the same arrays to float32
    rounding; one engine is left (docs/probes.md#one-attention-per-layer), so a config or a run folder that names
    either still reads, and means what it meant."""
    if isinstance(table, dict) and table.get("kernel") in ("rows", "fused"):
        if table["kernel"] == "fused":
            log.warning("%s: probe.kernel = 'fused' is retired and ignored: one engine computes every probe, with "
                        "the same arrays to float32 rounding (docs/probes.md#one-attention-per-layer)", where)
        return {k: v for k, v in table.items() if k != "kernel"}
    return table


def config_from_dict(data: dict[str, Any], where: str = "<config>") -> ExperimentConfig:
    sections = {"experiment", "tasks", "ice", "generation", "probe", "analysis", "interventions"}
    unknown = set(data) - sections
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(sections))}")
    if "experiment" not in data:
        raise ConfigError(f"{where}: missing [experiment] section (needs at least `name`)")
    raw_tasks = data.get("tasks")
    if raw_tasks is None:
        raise ConfigError(f"{where}: missing [[tasks]] (at least one task source)")
    if isinstance(raw_tasks, dict):
        raw_tasks = [raw_tasks]
    raw_interventions = data.get("interventions", [])
    if isinstance(raw_interventions, dict):
        raw_interventions = [raw_interventions]
    try:
        cfg = ExperimentConfig(
            experiment=_build(ExperimentSection, data["experiment"], "experiment"),
            tasks=tuple(_task_section(t, i) for i, t in enumerate(raw_tasks)),
            ice=_build(IceSection, data.get("ice", {}), "ice"),
            generation=_build(GenerationSection, data.get("generation", {}), "generation"),
            probe=_build(ProbeSection, _retire_kernel(data.get("probe", {}), where), "probe"),
            analysis=_build(AnalysisSection, data.get("analysis", {}), "analysis"),
            interventions=tuple(_declared_intervention(t, i) for i, t in enumerate(raw_interventions)),
        )
        _check_intervention_names(cfg.interventions)
        _check_intervention_cells(cfg)
        _refuse_idle_ice(cfg.tasks, data.get("ice", {}))
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    return cfg


def _task_section(raw: Any, i: int) -> TaskSection:
    """One ``[[tasks]]`` table: its source, and the other keys as that source's options type; an error names the
    table by its index and source (``tasks[1].n (source 'synthetic'): ...``)."""
    if not isinstance(raw, dict) or "source" not in raw:
        raise ConfigError(f"tasks[{i}]: expected a table with a `source` key, got {raw!r}")
    source, values = raw["source"], {k: v for k, v in raw.items() if k != "source"}
    label = f"source {source!r}"
    if not isinstance(source, str) or source not in SOURCES:
        raise ConfigError(f"tasks[{i}].source ({label}): {source!r} is not one of {', '.join(SOURCES.names())}")
    try:
        get_source(source).check_keys(values)
    except FieldError as e:
        raise ConfigError(f"tasks[{i}].{e.field}: {e.problem}") from None
    try:
        return TaskSection(source, decode(get_source(source).options_type, values))
    except CodecError as e:
        raise ConfigError(f"tasks[{i}]{'.' + e.where if e.where else ''} ({label}): {e.problem}") from None
    except FieldError as e:
        raise ConfigError(f"tasks[{i}].{e.field} ({label}): {e.problem}") from None


def _declared_intervention(raw: Any, i: int) -> InterventionSpec:
    """One ``[[interventions]]`` table: an :class:`~probe.interventions.InterventionSpec`, with no value that has no
    effect."""
    where = f"interventions[{i}]"
    if isinstance(raw, dict):
        if "name" not in raw:
            raise ConfigError(f"{where}: missing key(s) name (trial ids and record folders carry it)")
        set_later = [k for k in RESOLUTION_FIELDS if k in raw]
        if set_later:
            raise ConfigError(f"{where}.{set_later[0]}: the runner sets it when it resolves the intervention for a "
                              "model (interventions.json); remove it")
    iv: InterventionSpec = _build(InterventionSpec, raw, where)
    if not INTERVENTION_NAME.match(iv.name):
        raise ConfigError(f"interventions.name: {iv.name!r}; use letters, digits, '_', '.' or '-'")
    if not iv.edits_attention and iv.layers is not None:
        raise ConfigError(f"interventions[{iv.name!r}].layers: a reinject edits the prompt, not attention: remove "
                          "layers and heads")
    return iv


def _check_intervention_names(sections: tuple[InterventionSpec, ...]) -> None:
    """Intervention names must be unique (trial ids and record folders carry them)."""
    seen: set[str] = set()
    for s in sections:
        if s.name in seen:
            raise ConfigError(f"interventions.name: {s.name!r} is used twice; give each intervention its own name")
        seen.add(s.name)


def _check_intervention_cells(cfg: "ExperimentConfig") -> None:
    """An intervention's ``conditions`` / ``loads`` must be ones the experiment runs (else it would run nowhere)."""
    for s in cfg.interventions:
        what = f"interventions[{s.name!r}]"
        if s.conditions is not None:
            unknown = [c for c in s.conditions if c not in cfg.ice.conditions]
            if unknown:
                raise ConfigError(f"{what}.conditions: {unknown} not in ice.conditions {list(cfg.ice.conditions)}")
        if s.loads is not None:
            runs = set(cfg.ice.loads) | ({0} if "Control" in cfg.ice.conditions else set())
            unknown_loads = [x for x in s.loads if x not in runs]
            if unknown_loads:
                raise ConfigError(f"{what}.loads: {unknown_loads} not in ice.loads {list(cfg.ice.loads)} "
                                  "(0 is Control's load)")


def _refuse_idle_ice(tasks: tuple[TaskSection, ...], raw_ice: dict[str, Any]) -> None:
    """Refuse an ``[ice]`` section when every task source lays out its own prompts: it would be silently ignored (a
    ``[[tasks]]`` key its source does not read is refused where the table is read)."""
    sources = [get_source(t.source) for t in tasks]
    if raw_ice and not any(s.uses_ice for s in sources):
        key = sorted(raw_ice)[0]
        names = ", ".join(repr(s.name) for s in sources)
        raise ConfigError(f"ice.{key}: the [ice] section has no effect: source(s) {names} lay out their own "
                          "prompts (no conditions, loads or distractors); remove the section")


# The experiments shipped with the toolkit (the repository's experiments/, installed as package data): a bare name
# such as ``demo`` names one of them wherever the toolkit is installed.
SHIPPED_EXPERIMENTS = Path(__file__).resolve().parent / "experiments"


def shipped_experiments() -> list[str]:
    """The names of the shipped experiments (``demo``, ``study``, ...), sorted."""
    return sorted(p.stem for p in SHIPPED_EXPERIMENTS.glob("*.toml"))


def experiment_path(path: str | Path) -> Path:
    """The experiment file ``path`` names: the file itself, or, for a bare name without a folder or suffix that is
    no file here (``demo``), the shipped experiment of that name.

    Raises:
        ConfigError: neither a file nor a shipped experiment (names the shipped ones).
    """
    p = Path(path)
    if p.is_file():
        return p
    if p.suffix == "" and len(p.parts) == 1 and (SHIPPED_EXPERIMENTS / f"{p.name}.toml").is_file():
        return SHIPPED_EXPERIMENTS / f"{p.name}.toml"
    raise ConfigError(f"{p}: no such experiment file (or a shipped experiment by name: "
                      f"{', '.join(shipped_experiments()) or 'none installed'})")


def load_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> ExperimentConfig:
    """Read an experiment TOML (a path, or a shipped experiment's name: :func:`experiment_path`); ``overrides``
    (section -> key -> value) are CLI flags actually passed."""
    p = experiment_path(path)
    data = _read_toml(p, "fix the line it names")
    for section, values in (overrides or {}).items():
        data.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    return config_from_dict(data, str(p))


def _read_toml(path: Path, fix: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); {fix}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); {fix}") from None
    except RecursionError:
        raise ConfigError(f"{path}: tables nested deeper than any experiment's; {fix}") from None


def read_run_config(run: str | Path | RunFolder) -> ExperimentConfig | None:
    """The resolved experiment a run folder was made with (its ``config.toml``), or None when it has none.

    Args:
        run: the run folder.

    Raises:
        ConfigError: the file exists but is not valid TOML or not a valid experiment; the message names the file
            and says how to write it again (``probe run EXP.toml --force`` rewrites it from the experiment).
    """
    path = RunFolder(run).config
    if not path.is_file():
        return None
    fix = ("this file is written by `probe run` / `probe build`; restore it, or write it again from the experiment "
           "with `probe run EXP.toml --force`")
    data = _read_toml(path, fix)
    try:
        return config_from_dict(data, str(path))
    except ConfigError as e:
        raise ConfigError(f"{e} ({fix})") from None


def dump_config(cfg: ExperimentConfig) -> str:
    """TOML text of a config; ``config_from_dict(tomllib.loads(dump_config(c))) == c``.

    Only options with an effect are written: each ``[[tasks]]`` section holds the keys its source reads, and
    ``[ice]`` is left out when every source lays out its own prompts (so the file passes the same validation).
    """
    d = cfg.to_dict()
    sources = [get_source(t.source) for t in cfg.tasks]
    lines: list[str] = []
    for section in ("experiment", "ice", "generation", "probe", "analysis"):
        if section == "ice" and not any(s.uses_ice for s in sources):
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in d[section].items()]
        lines.append("")
    for t in d["tasks"]:
        lines.append("[[tasks]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in t.items()]
        lines.append("")
    for iv in d["interventions"]:
        lines.append("[[interventions]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in iv.items()]
        lines.append("")
    return "\n".join(lines)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quoted, one line): quotes, backslashes and control characters escaped.

    Raises:
        ConfigError: ``text`` holds a lone surrogate (not a Unicode character; TOML cannot hold it).
    """
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ConfigError(f"{text!r}: holds the lone surrogate U+{code:04X}, which is not a character; "
                              "fix the value (is the text UTF-8?)")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise ConfigError(f"cannot write {v!r} (a {type(v).__name__}) as a TOML value")
