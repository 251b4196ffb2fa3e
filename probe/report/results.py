"""A results page in Markdown from analysed run folders, its hand-written reading kept: ``probe results``
(docs/records.md#report)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from probe.analysis.results import Analysis, read_analysis
from probe.config import ExperimentConfig, load_config
from probe.interventions import InterventionSpec, LayerWindow, TopHeads
from probe.errors import ProbeError
from probe.report.sections import report_section
from probe.report.tables import md_table, render_markdown
from probe.report.text import MAIN_HEADER, PATH_LEGEND, cell_row
from probe.runfolder import RunFolder, write_atomic

log = logging.getLogger(__name__)

READING_BEGIN = "<!-- reading: begin"
READING_END = "<!-- reading: end -->"
READING_PLACEHOLDER = ("*No reading written yet: write what the numbers below support, and what they do not, "
                       "between these two markers; `probe results` keeps it.*")
_TRIALS = re.compile(r"\b[0-9a-f]{12}\b")  # the stamp's short sha256s, one per run


class ResultsPageError(ProbeError):
    """A run folder cannot go on the results page (not analysed, or its analysis is stale)."""


@dataclass(frozen=True)
class PageRun:
    """One run folder on the page: its analysis and its configuration."""

    run: RunFolder
    analysis: Analysis
    config: ExperimentConfig | None  # None: trials written by another tool (no config.toml)


def _read_run(path: str | Path) -> PageRun:
    run = RunFolder(path)
    if not run.analysis.exists():
        raise ResultsPageError(f"{run.root}: no analysis.json; run `probe analyze {run.root}` (or `probe results`, "
                               "which analyses first)")
    return PageRun(run, read_analysis(run), load_config(run.config) if run.config.exists() else None)


def _manifest(run: RunFolder) -> dict | None:
    """The run's manifest.json, or None when it is absent or unreadable (the page then names no weights)."""
    try:
        return run.read_manifest()
    except ProbeError:
        return None


def _where(conditions: tuple[str, ...] | None, loads: tuple[int, ...] | None) -> str:
    cond = ", ".join(conditions) if conditions else "every condition"
    load = "every load" if loads is None else "load " + ", ".join(f"{x} %" for x in loads)
    return f"{cond}; {load}"


def _weights(name: str, entry: dict) -> str:
    """One model's weights as the manifest recorded them: where they came from, their file and dtype; a served
    model by its server, and the local card it was probed on (two-stage)."""
    if entry.get("backend") not in (None, "transformers"):
        served = f"`{name}`: served (`{entry.get('served_model')}` at {entry.get('base_url')})"
        local = entry.get("probe_with")
        if isinstance(local, dict):
            return f"{served}, probed two-stage on {_weights(str(local.get('name')), local)}"
        return served
    where = (f"GGUF `{entry['gguf_file']}` de-quantised" if entry.get("gguf_file")
             else f"`{entry.get('hub_id') or entry.get('path') or entry.get('served_model') or entry.get('source')}`")
    dtype = f", run in {entry['dtype']}" if entry.get("dtype") else ""
    package = f" (package `{entry['package']}`)" if entry.get("package") else ""
    return f"`{name}`: {where}{package}{dtype}"


def design_lines(cfg: ExperimentConfig, manifest: dict | None = None) -> list[str]:
    """The design of one run in a few Markdown lines: models (their weights and dtype, from the run's manifest),
    tasks, conditions, loads, generation, probe, interventions."""
    tasks = "; ".join(
        f"{t.source} × {t.n}" + (f" ({t.options.hops}-hop)" if t.source == "synthetic" else "")
        + (f" (at most {t.options.max_hops} sub-questions)" if t.source == "fanoutqa" else "") for t in cfg.tasks)
    probe = "off"
    if cfg.probe.enabled:
        probe = f"on (query rows: {cfg.probe.query}" + ("; answer capture" if cfg.probe.answer else "") + ")"
    lines = [f"- models: {', '.join(f'`{m}`' for m in cfg.experiment.models)}; seed {cfg.experiment.seed}"]
    models = (manifest or {}).get("models") or {}
    if isinstance(models, dict) and models:
        lines.append("- weights: " + "; ".join(_weights(n, e) for n, e in models.items() if isinstance(e, dict)))
    lines += [
             f"- tasks: {tasks}",
             f"- conditions: {', '.join(cfg.ice.conditions)} at loads {', '.join(f'{x} %' for x in cfg.ice.loads)}"
             f", {cfg.ice.replications} replication(s), distractors {cfg.ice.distractor_strategy}",
             f"- generation: at most {cfg.generation.max_new_tokens} new tokens, temperature "
             f"{cfg.generation.temperature:g}; probing {probe}"]
    for iv in cfg.interventions:
        if not iv.edits_attention:
            what = ("its germane facts" if iv.keys == "germane" else "as many neutral sentences as it has facts")
            lines.append(f"- intervention `{iv.name}`: reinject: the prompt with {what} repeated right before the "
                         f"question (not probed); on {_where(iv.conditions, iv.loads)}")
            continue
        alpha = f" α = {iv.alpha:g}" if iv.alpha is not None else ""
        lines.append(f"- intervention `{iv.name}`: {iv.kind}{alpha} of the {iv.keys} keys from the {iv.queries} "
                     f"queries, {_layers(iv)}, {_heads(iv)}; on {_where(iv.conditions, iv.loads)}")
    return lines


def _layers(iv: InterventionSpec) -> str:
    if isinstance(iv.layers, LayerWindow):
        return f"windows of {iv.layers.window} layers every {iv.layers.stride}"
    if isinstance(iv.layers, tuple):
        return "layers " + ", ".join(str(x) for x in iv.layers)
    return "every layer"


def _heads(iv: InterventionSpec) -> str:
    if isinstance(iv.heads, TopHeads):
        return (f"the top {iv.heads.top_k} heads by {iv.heads.by} in `{iv.heads.from_run}`"
                + (" (and as many random heads)" if iv.heads.random_control else ""))
    if isinstance(iv.heads, tuple):
        return f"{len(iv.heads)} chosen heads"
    return "every head"


def _demote(markdown: str, by: int = 1) -> str:
    """Every Markdown heading one level deeper (the page's own headings sit above the run's)."""
    return re.sub(r"^(#{1,5}) ", lambda m: "#" * (len(m.group(1)) + by) + " ", markdown, flags=re.M)


def _copy_figures(run: RunFolder, dest: Path, page_dir: Path) -> list[tuple[str, str]]:
    """Copy the report's figures of ``run`` into ``dest`` (emptied first); (caption, path relative to the page).

    The figures come in the report's order with its captions (``figures/index.json``, written by ``probe report``);
    a figure file the index does not name is left out (an earlier report drew it). A run reported before the index
    existed gives its figures in file-name order, captioned by their names.
    """
    if not run.figures.is_dir():
        return []
    if run.figure_index.is_file():
        try:
            listed = [(str(e["file"]), str(e["caption"])) for e in json.loads(run.figure_index.read_text("utf-8"))]
        except (ValueError, KeyError, TypeError) as e:
            raise ProbeError(f"{run.figure_index}: not a figure index ({e}); run `probe report {run.root}` "
                             "again") from None
        figures = [(run.figures / name, caption) for name, caption in listed if (run.figures / name).is_file()]
    else:
        figures = [(fig, fig.stem.replace("_", " ")) for fig in sorted(run.figures.glob("*.png"))]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    out = []
    for fig, caption in figures:
        shutil.copy2(fig, dest / fig.name)
        out.append((caption, (dest / fig.name).relative_to(page_dir).as_posix()))
    return out


def same_design(a: ExperimentConfig, b: ExperimentConfig) -> bool:
    """Whether two runs asked the same questions the same way: tasks, conditions, loads, replications, seed and
    decoding (the batch size aside); their models and probes may differ."""
    def design(c: ExperimentConfig) -> tuple:
        return c.tasks, c.ice, replace(c.generation, batch_size=1), c.experiment.seed

    return design(a) == design(b)


def across_models(runs: Sequence[PageRun]) -> list[str]:
    """The page's parts across models: one per group of runs of one design (:func:`same_design`) on more than one
    model, their ICE tables (and intervention tables, where they have them) merged."""
    groups: list[list[PageRun]] = []
    for r in runs:
        if r.config is None or "ice" not in r.analysis.families:
            continue
        group = next((g for g in groups if g[0].config is not None and same_design(g[0].config, r.config)), None)
        if group is None:
            groups.append([r])
        else:
            group.append(r)
    parts: list[str] = []
    for g in groups:
        if len(g) < 2 or len({m for r in g for m in getattr(r.analysis.families["ice"], "models", ())}) < 2:
            continue
        labels = _unique([r.run.name for r in g])
        ice = report_section("ice")
        merged = ice.merged([(label, r.analysis.families["ice"]) for label, r in zip(labels, g)])
        first = g[0].config
        assert first is not None
        conditions = list(first.ice.conditions)
        order = {m: i for i, m in enumerate(merged.models)}
        rows = sorted(ice.rows(merged), key=lambda cm: (
            conditions.index(cm[0].condition) if cm[0].condition in conditions else len(conditions), cm[0].load,
            order.get(cm[0].model, 0)))
        names = ", ".join(f"`{label}`" for label in labels)
        parts += [f"## Across models: {names}", "",
                  "These runs asked the same questions in the same way (tasks, conditions, loads, replications, "
                  "seed, decoding) of different models. Their tables side by side, each model named `<run>: "
                  "<model>`; every number is its own run's, and nothing is estimated across the runs: a difference "
                  "between the models is read off their two intervals, not tested.", "",
                  "### EM per model × condition × load", "", md_table(MAIN_HEADER, [cell_row(c, m) for c, m in rows]),
                  "", PATH_LEGEND + ".", ""]
        parts += _demote("\n".join(ice.markdown(merged, g[0].analysis.settings)), 1).split("\n")
        with_interventions = [(label, r.analysis.interventions) for label, r in zip(labels, g)
                              if r.analysis.interventions is not None]
        if len(with_interventions) > 1:
            section = report_section("interventions")
            parts += _demote("\n".join(section.markdown(section.merged(with_interventions),
                                                         g[0].analysis.settings)), 1).split("\n")
        parts.append("")
    return parts


def _unique(names: list[str]) -> list[str]:
    """Run names made unique (``study``, ``study#1``) for labels."""
    out: list[str] = []
    for n in names:
        out.append(n if n not in out else f"{n}#{len(out)}")
    return out


def _reading(old: str | None, runs: Sequence[PageRun]) -> tuple[str, list[str]]:
    """The hand-written block of the page being replaced (or a placeholder), and warnings on stale readings."""
    shas = {r.analysis.inputs.trials_sha256[:12] for r in runs}
    stamp = f"{READING_BEGIN}: written for trials {' '.join(sorted(shas))} -->"
    if old is None or READING_BEGIN not in old or READING_END not in old:
        return f"{stamp}\n{READING_PLACEHOLDER}\n{READING_END}", []
    start = old.index(READING_BEGIN)
    head_end = old.index("\n", start)
    body = old[head_end + 1:old.index(READING_END)].rstrip("\n")
    written_for = set(_TRIALS.findall(old[start:head_end]))
    warnings = []
    if body.strip() and body.strip() != READING_PLACEHOLDER and written_for != shas:
        warnings.append(f"the reading was written for trials {' '.join(sorted(written_for)) or '(unnamed)'}; the "
                        f"runs now hold {' '.join(sorted(shas))}: read it again against the new numbers, then change "
                        "its first line's sha256 to the new one")
        stamp = old[start:head_end]
    return f"{stamp}\n{body}\n{READING_END}", warnings


def _statistics_link(out: Path) -> str:
    """The definitions page as a link where the page sits beside it (the toolkit's docs/), else as a plain name."""
    return "[statistics.md](statistics.md)" if (out.parent / "statistics.md").is_file() else "docs/statistics.md"


def write_results_page(run_dirs: Sequence[str | Path], out: str | Path, *, title: str = "Results",
                       command: str = "", img_dir: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write the results page for analysed (and reported) run folders.

    Args:
        run_dirs: run folders, the main one first.
        out: the Markdown file (its reading block, if any, is kept).
        title: the page's heading.
        command: the command that regenerates the page (named on it).
        img_dir: where the figures are copied (default ``img/results`` beside ``out``), each run's into
            ``<run folder name>-<first 8 hex digits of its trials' sha256>/``: two runs whose folders share a
            name keep their own figures, and the same run gets the same folder on every machine.

    Returns:
        The page's path and the warnings (a reading written for other trials).

    Raises:
        ResultsPageError: a folder without ``analysis.json``.
    """
    out = Path(out)
    runs = [_read_run(d) for d in run_dirs]
    images = Path(img_dir) if img_dir is not None else out.parent / "img" / "results"
    old = out.read_text(encoding="utf-8") if out.exists() else None
    reading, warnings = _reading(old, runs)
    parts = [f"# {title}", "",
             "This page is written from the run folders' `analysis.json` and report figures"
             + (f" by `{command}`" if command else "") + ": every number below is the analysis's own, with its "
             "interval and, where a family of tests is corrected, its Benjamini–Hochberg q (definitions in "
             f"{_statistics_link(out)}). The reading is written by hand and kept when the page is written "
             "again.", "",
             "## Reading", "", reading, ""]
    for r in runs:
        a = r.analysis
        parts += [f"## Run `{r.run.name}`", "",
                  f"{a.n_trials} trials (`{r.run.root.name}/trials.jsonl`, sha256 {a.inputs.trials_sha256[:12]}…)"
                  f"; toolkit as recorded in the run's `manifest.json`.", "",
                  *(design_lines(r.config, _manifest(r.run)) if r.config is not None
                    else ["- design: the folder has no `config.toml` (trials written by another tool)"]), ""]
        # its own heading and trial-count line give way to the run's
        body = render_markdown(a).split("\n\n", 2)[2]
        parts += [_demote(body, 1).strip(), ""]
        figures = _copy_figures(r.run, images / f"{r.run.name}-{a.inputs.trials_sha256[:8]}", out.parent)
        if figures:
            parts += [f"### Figures of `{r.run.name}`", ""]
            for cap, path in figures:  # alt text the file's name (a caption may hold brackets), the caption below
                parts += [f"![{Path(path).stem}]({path})", "", f"*{cap.strip()}*", ""]
    parts += across_models(runs)
    write_atomic(out, "\n".join(parts).rstrip() + "\n")
    for w in warnings:
        log.warning("%s: %s", out, w)
    return out, warnings


__all__ = ["READING_BEGIN", "READING_END", "ResultsPageError", "across_models", "design_lines", "same_design",
           "write_results_page"]
