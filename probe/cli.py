"""Command line: ``probe build | run | analyze | report | compare | models | validate | bench``.

Only this module prints; library code logs. File names of a run folder come from :mod:`probe.runfolder`. Every
numeric flag is checked when parsed (a count must be a whole number >= 1); a bad value stops the command with
argparse's usage message and exit status 2, as a :class:`~probe.errors.ProbeError` does (``error: ...``).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from probe import runfolder
from probe.config import shipped_experiments
from probe.errors import ProbeError

if TYPE_CHECKING:  # imported lazily at run time: `probe --help` stays fast
    from probe.config import ExperimentConfig


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a count, a size, a limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give one >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated whole numbers, each >= 1."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated whole numbers >= 1, e.g. 512,2048")
    return tuple(positive_int(p) for p in parts)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """CLI flags that were actually passed (their defaults are None) -> config overrides.

    A passed value is kept whatever it is (an empty name, a zero): the config refuses what is invalid, nothing is
    dropped silently.
    """
    o: dict[str, dict[str, Any]] = {"experiment": {}, "generation": {}, "probe": {}, "ice": {}}
    flags = {"name": ("experiment", "name"), "output_dir": ("experiment", "output_dir"),
             "batch_size": ("generation", "batch_size"), "max_new_tokens": ("generation", "max_new_tokens"),
             "replications": ("ice", "replications"), "probe": ("probe", "enabled")}
    for flag, (section, key) in flags.items():
        if getattr(args, flag, None) is not None:
            o[section][key] = getattr(args, flag)
    if getattr(args, "models", None) is not None:
        o["experiment"]["models"] = [m.strip() for m in args.models.split(",")]
    return {k: v for k, v in o.items() if v}


def _load(args: argparse.Namespace) -> ExperimentConfig:
    """The experiment with the flags applied: section overrides, and ``--limit N`` (at most N tasks from each
    ``[[tasks]]`` section: its ``n``). ``-q`` also silences the libraries' download and weight-loading bars."""
    import dataclasses

    from probe.config import load_config

    if getattr(args, "quiet", False):
        import transformers
        from huggingface_hub.utils import disable_progress_bars

        transformers.logging.disable_progress_bar()
        disable_progress_bars()
    cfg = load_config(args.experiment, _overrides(args))
    limit = getattr(args, "limit", None)
    if limit is not None:
        cfg = dataclasses.replace(cfg, tasks=tuple(
            dataclasses.replace(t, options=dataclasses.replace(t.options, n=min(t.n, limit))) for t in cfg.tasks))
    return cfg


def cmd_validate(args: argparse.Namespace) -> int:
    """Check an experiment as far as it can be checked without loading a model: the file, the model cards and
    their weights (packages, GGUF files, folders), probes and interventions against the cards, the generation
    budget against each context window, every task file, and a separate probe run named by ``heads.from``."""
    from probe.interventions import TopHeads
    from probe.runner.checks import check_inputs

    cfg = _load(args)
    cards, tasks = check_inputs(cfg)
    for iv in cfg.interventions:
        heads = iv.heads
        if isinstance(heads, TopHeads) and not Path(heads.from_run).is_dir():
            raise ProbeError(f"{args.experiment}: interventions {iv.name!r}: heads.from = {heads.from_run!r} is not a "
                             "run folder; run the selection experiment first (probe.enabled = true)")
    print(f"{args.experiment}: ok ({len(cfg.tasks)} task source(s), {len(tasks)} tasks, models: "
          f"{', '.join(c.name for c in cards)})")
    from probe.backends import capabilities

    for c in cards:
        if capabilities(c).local and c.source == "hub":
            print(f"  {c.name}: weights not checked (hub id {c.hub_id}, downloaded on first load; `probe models` "
                  "says whether they are cached here)")
        elif not capabilities(c).local:
            print(f"  {c.name}: served at {c.base_url}; the server is not contacted (`probe models` probes it)")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from probe.runfolder import RunLock
    from probe.runner.checks import check_inputs
    from probe.runner.folder import check_run_dir, prepare_run_dir
    from probe.runner.prompts import build_run_prompts

    cfg = _load(args)
    _, tasks = check_inputs(cfg, generating=False)  # bad input stops the build before anything is written
    check_run_dir(cfg, force=args.force)
    with RunLock(cfg.run_folder):
        prepare_run_dir(cfg, force=args.force)
        by_model = build_run_prompts(cfg, progress=not args.quiet, tasks=tasks)
    n = len({p.prompt_id for ps in by_model.values() for p in ps})
    print(f"{n} prompts in {cfg.run_folder.prompts}")
    return 0


def _dp_rank() -> tuple[int, int]:
    """(rank, world size) under ``accelerate launch`` / torchrun, or mpirun (accelerate's multi-CPU launcher);
    (0, 1) otherwise. Variables are read in accelerate's order (``PartialState`` reads the same ones)."""

    def first(names: tuple[str, ...], default: str) -> int:
        name = next((n for n in names if os.environ.get(n)), None)
        if name is None:
            return int(default)
        try:
            return int(os.environ[name])
        except ValueError:
            raise ProbeError(f"environment variable {name}={os.environ[name]!r} is not a whole number; the launcher "
                             "sets it (accelerate launch, torchrun, mpirun): unset it for a one-process run") from None

    world = first(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"), "1")
    rank = first(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"), "0")
    return rank, world


def cmd_run(args: argparse.Namespace) -> int:
    from probe.runner import run_experiment
    from probe.runner.shards import Shard, merge_shards_into

    cfg = _load(args)
    rank, world = _dp_rank()
    shard = Shard.parse(args.shard) if args.shard is not None else None
    if shard is not None and world > 1:
        raise ProbeError(f"--shard {shard} under a data-parallel launch (WORLD_SIZE={world}): each process of the "
                         "launch is a shard already; launch one `probe run EXP --shard i/N` per machine or array task")
    if world > 1:  # each process runs shard rank+1 of world; rank 0 merges them once every process is done
        from accelerate import PartialState

        state = PartialState(cpu=not _cuda())
        run_experiment(cfg, progress=not args.quiet and rank == 0, force=args.force, shard=Shard(rank + 1, world),
                       device=f"cuda:{state.local_process_index}" if _cuda() else "cpu")
        state.wait_for_everyone()
        if rank != 0:
            return 0
        merge_shards_into(cfg.run_dir, [Shard(i, world).config(cfg).run_dir for i in range(1, world + 1)],
                          force=args.force)
    else:
        run_dir = shard.config(cfg).run_dir if shard is not None else cfg.run_dir
        try:
            run_experiment(cfg, progress=not args.quiet, force=args.force, device=args.device, shard=shard)
        except KeyboardInterrupt:
            print(f"\ninterrupted: the trials recorded so far are in {run_dir}; run the same command again "
                  "to finish the run", file=sys.stderr)
            return 130
        if shard is not None:
            print(f"shard {shard}: {run_dir}; when every shard is done, `probe merge {cfg.run_dir}` joins them")
            return 0
    print(f"run folder: {cfg.run_dir}")
    _print_table(cfg.run_dir)
    if args.analyze:
        return _analyze_and_report(cfg.run_dir, report=args.report)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from probe.runner.shards import merge_shards_into

    s = merge_shards_into(Path(args.run), [Path(p) for p in args.shards] or None, force=args.force)
    print(f"merged {len(s.shards)} shards into {s.run_dir}: {s.n_trials} trials ({s.n_errors} ended in a backend "
          f"error: `probe run` on the merged folder retries them), {s.n_probe_records} probe records")
    _print_table(s.run_dir)
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _print_table(run_dir: Path) -> None:
    from probe.report import main_table

    print(main_table(run_dir))


def _analyze_and_report(run_dir: Path, report: bool) -> int:
    from probe.api import analyze

    analyze(run_dir)
    print(f"analysis: {runfolder.RunFolder(run_dir).analysis}")
    if report:
        from probe.report import render_report

        print(f"report: {render_report(run_dir)}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from probe.analysis import analyze_external
    from probe.api import analyze
    from probe.report import main_table_text, write_tables

    path = Path(args.run)
    if path.is_file():  # trial records written by another tool
        result, out = analyze_external(path, mapping=args.map, out_dir=Path(args.out) if args.out else None,
                                       max_new_tokens=args.max_new_tokens, tokenizer=args.tokenizer)
        write_tables(result, out.parent)
        print(main_table_text(result))
        print(f"analysis: {out}")
        return 0
    result = analyze(path)
    print(main_table_text(result))
    print(f"analysis: {runfolder.RunFolder(path).analysis}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from probe.report import render_report

    print(f"report: {render_report(Path(args.run))}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    """Analyse and report each run folder, then write the results page from their analyses."""
    from probe.api import analyze
    from probe.report import render_report
    from probe.report.results import write_results_page

    for run in args.runs:
        analyze(Path(run))
        render_report(Path(run))
    out = args.out if args.out is not None else str(Path(args.runs[0]) / "results.md")
    command = "probe results " + " ".join(args.runs) + f" --out {out}" + (
        f" --title {shlex.quote(args.title)}" if args.title != "Results" else "")
    page, warnings = write_results_page(args.runs, out, title=args.title, command=command)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"results: {page}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from probe.report import compare_runs

    print(f"comparison: {compare_runs([Path(r) for r in args.runs], Path(args.out))}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from probe.api import show

    if args.answer:
        from probe.loaded_run import Run
        from probe.report.hop_view import write_answer_steps

        model = args.model or Run(args.run).local_model()
        path = write_answer_steps(args.run, model, args.prompt_id, args.out, layer=args.layer, head=args.head)
        print(f"page: {path}")
        return 0
    path = show(args.run, args.prompt_id, layer=args.layer, head=args.head, model=args.model, query=args.query,
                out=args.out, device=args.device)
    print(f"page: {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    if args.check is not None:  # one model's config: what the probe will and will not measure, no weights loaded
        from probe.attention.architecture import describe, read_config

        supported, lines = describe(read_config(args.check))
        print(f"{args.check}:")
        for line in lines:
            print(f"  {line}")
        return 0 if supported else 1

    from probe.backends import capabilities, check_card
    from probe.errors import ConfigError
    from probe.loading import availability, card_files, hidden_shipped, read_card, served_reachability

    cards, rows = [], []
    for name, path in card_files().items():  # a bad card is a row saying what is wrong, not the end of the list
        try:
            card = read_card(path, catalogued=True)
            check_card(card)
            cards.append(card)
        except ConfigError as e:
            rows.append((name, "?", "no", f"bad card: {e}"))
    served = [c for c in cards if not capabilities(c).local]
    with ThreadPoolExecutor(max_workers=8) as pool:  # a short probe of each server's URL, all at once
        reach = dict(zip([c.name for c in served], pool.map(served_reachability, served)))
    for c in cards:
        ok, why = availability(c)
        if capabilities(c).local or not ok:
            rows.append((c.name, c.backend, "yes" if ok else "no", why))
        else:
            state = reach[c.name]
            rows.append((c.name, c.backend, "yes" if state == "reachable" else state.split(" (")[0],
                         f"{why}: {state}"))
    hidden = hidden_shipped()
    rows = [(r[0], r[1], r[2], f"{r[3]} [your card {hidden[r[0]]} hides the shipped one of this name]")
            if r[0] in hidden else r for r in rows]
    rows.sort(key=lambda r: r[0])
    w = [max(len(r[i]) for r in rows + [("model", "backend", "loadable", "")]) for i in range(3)]
    print(f"{'model':<{w[0]}}  {'backend':<{w[1]}}  {'loadable':<{w[2]}}  where")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
    return 0


LENGTHS_DEFAULT = (512, 2048, 4096, 8192)


def lengths_or_none(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated prompt lengths, or an empty string for none."""
    return positive_int_list(text) if text.strip() else ()


def _benchmarks() -> None:
    """Make the checkout's ``benchmarks/`` importable (they sit beside ``probe/``, not in the wheel).

    Raises:
        ProbeError: no checkout beside the installed package.
    """
    try:
        import benchmarks  # noqa: F401 - importable already (run from the checkout's root)
        return
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parents[1]
        if not (root / "benchmarks" / "__init__.py").is_file():
            raise ProbeError("probe bench: the benchmarks live in the source checkout (benchmarks/), not in the "
                             "installed package; install the toolkit from a clone (`pip install -e .`) to run "
                             "them") from None
        sys.path.insert(0, str(root))


def cmd_bench(args: argparse.Namespace) -> int:
    _benchmarks()
    if args.what == "gpu-check":
        from benchmarks.gpu_check import format_gpu_check, run_gpu_check

        lengths = args.lengths if args.lengths != LENGTHS_DEFAULT else None
        report = run_gpu_check(cpu=args.cpu, lengths=lengths, repeats=args.repeats)
        print(format_gpu_check(report))
        return 0 if report.ok else 1
    if args.what == "run":
        from benchmarks.run import format_run_bench, run_probe_cost_bench

        print(format_run_bench(run_probe_cost_bench(args.experiment, rounds=args.repeats, n_prompts=args.n)))
    elif args.what == "generate":
        from benchmarks.generate import format_generate_bench, run_generate_bench

        from benchmarks.generate import format_intervention_bench, run_intervention_bench

        bench = run_generate_bench(args.experiment, n_prompts=args.n or 32, batch_size=args.batch_size)
        print(format_generate_bench(bench))
        row = run_intervention_bench(args.experiment, n_prompts=args.n or 32, batch_size=args.batch_size)
        print(format_intervention_bench(row))
    else:
        from benchmarks.attention import (
            DEFAULT_MODEL,
            format_attention_bench,
            format_probe_batch_bench,
            run_attention_bench,
            run_probe_batch_bench,
        )
        from probe.loading import get_card, load_model

        name = args.model or DEFAULT_MODEL
        card = get_card(name)
        too_long = [n for n in args.lengths or () if n > card.context_window]
        if too_long:
            raise ProbeError(f"--lengths: {', '.join(map(str, too_long))} exceed(s) the {card.context_window}-token "
                             f"context window of {name} ({card.card_path or 'its card'}); measure shorter prompts")
        model = load_model(name).model
        if args.lengths:
            print(format_attention_bench(run_attention_bench(lengths=args.lengths, model=model, model_name=name,
                                                             repeats=args.repeats)))
        if args.probe_batch:
            print(format_probe_batch_bench(run_probe_batch_bench(model, model_name=name, batch_size=args.probe_batch,
                                                                 repeats=args.repeats)))
    return 0


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ice-probe")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``probe`` command line: one sub-command per stage of a run, then the tools."""
    p = argparse.ArgumentParser(prog="probe", description="ICE-Probe: extraneous load, behaviour and attention.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"%(prog)s (ICE-Probe) {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run_commands(sub)
    _add_analysis_commands(sub)
    _add_tool_commands(sub)
    return p


def _experiment_args(sp: argparse.ArgumentParser, writes: bool = True) -> None:
    """The arguments of the commands that read an experiment file (validate, build, run)."""
    sp.add_argument("experiment", help="experiment TOML (a path; or a shipped experiment by name: "
                                       f"{', '.join(shipped_experiments())})")
    sp.add_argument("--name", help="run name (folder under the output dir)")
    sp.add_argument("--models", help="comma-separated model card names, replacing experiment.models")
    sp.add_argument("--output-dir", help="parent folder of run folders (default: the experiment's output_dir, "
                                         "outputs/ of the working directory unless it says otherwise)")
    sp.add_argument("--replications", type=positive_int, help="replications per (task, condition, load)")
    if writes:  # validate writes nothing: it has nothing to start over
        sp.add_argument("--force", action="store_true",
                        help="start the run over when the folder holds records of another configuration (they "
                             "are moved into <run>/superseded-<time>/)")
    sp.add_argument("--limit", type=positive_int, metavar="N",
                    help="at most N tasks from each [[tasks]] section (its n), for a quick try of an experiment; "
                         "the run folder records the smaller n")
    sp.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bars (the toolkit's, and the libraries' download and weight-loading bars)")


def _add_run_commands(sub: argparse._SubParsersAction) -> None:
    """validate, build, run, merge: from an experiment file to a run folder."""
    sp = sub.add_parser("validate", help="check an experiment file without loading a model")
    _experiment_args(sp, writes=False)
    sp.set_defaults(fn=cmd_validate)
    sp = sub.add_parser("build", help=f"build the prompts (outputs/<name>/{runfolder.PROMPTS})")
    _experiment_args(sp)
    sp.set_defaults(fn=cmd_build)
    sp = sub.add_parser("run", help="build prompts and run every model (resumable; one process per run folder at a "
                                    "time, a second stops naming the first's pid)")
    _experiment_args(sp)
    sp.add_argument("--batch-size", type=positive_int, help="prompts generated together")
    sp.add_argument("--max-new-tokens", type=positive_int, help="generation limit in tokens")
    sp.add_argument("--device", help="cpu, cuda, cuda:1 (default: CUDA when available)")
    sp.add_argument("--probe", dest="probe", action="store_true", default=None, help="turn attention probing on")
    sp.add_argument("--no-probe", dest="probe", action="store_false", help="turn attention probing off")
    sp.add_argument("--analyze", action="store_true", help=f"also write {runfolder.ANALYSIS}")
    sp.add_argument("--report", action="store_true", help=f"with --analyze, also write {runfolder.REPORT}")
    sp.add_argument("--shard", metavar="I/N", help="run the I-th of N shares of the prompts into <run>/shards/I-of-N "
                                                   "(no rendezvous: SLURM arrays, independent machines; then probe "
                                                   "merge)")
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("merge", help="join the shards of a run (probe run --shard I/N) into its run folder")
    sp.add_argument("run", help="the run folder (outputs/<name>); its shards are read from <run>/shards/")
    sp.add_argument("shards", nargs="*", help="shard folders elsewhere (default: every <run>/shards/I-of-N)")
    sp.add_argument("--force", action="store_true", help="where the run folder holds trials the shards do not, move "
                                                         "its records aside into superseded-<time>/ and merge")
    sp.set_defaults(fn=cmd_merge)


def _add_analysis_commands(sub: argparse._SubParsersAction) -> None:
    """analyze, report, results, compare, show: from run folders to tables, pages and figures."""
    sp = sub.add_parser("analyze", help="statistics of a run folder, or of a CSV/JSONL written by another tool")
    sp.add_argument("run", help="run folder (outputs/<name>) or a CSV / JSONL file of trials")
    sp.add_argument("--map", help="column mapping for external files: field=column,... or a TOML mapping file")
    sp.add_argument("--out", help="output folder for an external file's analysis")
    sp.add_argument("--max-new-tokens", type=positive_int, default=None,
                    help="external files: the generation limit used, to recognise cut-off outputs")
    sp.add_argument("--tokenizer", help="external files: a local tokenizer folder to count output tokens with")
    sp.set_defaults(fn=cmd_analyze)
    sp = sub.add_parser("report", help=f"write {runfolder.REPORT} and figures for a run folder",
                        description=f"Write <run>/{runfolder.REPORT} (self-contained) and <run>/figures/*.png from the "
                                    f"run's {runfolder.ANALYSIS} (run `probe analyze` first); nothing is re-estimated.")
    sp.add_argument("run", help=f"an analysed run folder (outputs/<name>, holding {runfolder.ANALYSIS})")
    sp.set_defaults(fn=cmd_report)
    sp = sub.add_parser("results", help="analyse and report run folders, then write a results page (Markdown) "
                        "from their analyses, keeping its hand-written reading")
    sp.add_argument("runs", nargs="+", help="run folders, the main one first")
    sp.add_argument("--out", default=None, help="the page (default: results.md in the first run folder, its "
                                                "figures under img/results/ there)")
    sp.add_argument("--title", default="Results", help="the page's heading")
    sp.set_defaults(fn=cmd_results)
    sp = sub.add_parser("compare", help="several runs side by side",
                        description="One page of several analysed runs side by side, each model named <run>: <model> "
                                    "(their tables merged; the attention figures stay in each run's own report).")
    sp.add_argument("runs", nargs="+", help=f"analysed run folders (each holding {runfolder.ANALYSIS})")
    sp.add_argument("--out", default="outputs/comparison",
                    help="the folder of the comparison page (default outputs/comparison, under the working directory)")
    sp.set_defaults(fn=cmd_compare)
    sp = sub.add_parser("show", help="one prompt's tokens shaded by the attention its query set gives them (HTML)")
    sp.add_argument("run", help="run folder (outputs/<name>)")
    sp.add_argument("prompt_id", help="a prompt id of the run (prompts.jsonl, trials.jsonl)")
    sp.add_argument("--layer", type=int, default=None, help="0-based layer (default: the mean over layers)")
    sp.add_argument("--head", type=int, default=None, help="0-based head (default: the mean over heads)")
    sp.add_argument("--model", help="model card of the run (default: the run's one local model)")
    sp.add_argument("--query", choices=["question", "last"], help="query set (default: the run's probe.query)")
    sp.add_argument("--out", help="HTML file (default: <run>/show/<model>/<prompt>[.L<l>][.H<h>].html)")
    sp.add_argument("--device", help="cpu, cuda, cuda:1 (default: CUDA when available)")
    sp.add_argument("--answer", action="store_true",
                    help="step through the answer: for each generated token, the prompt shaded by where that token's "
                         "attention went (a run probed with [probe] answer = true; <stem>.answer.html)")
    sp.set_defaults(fn=cmd_show)


def _add_tool_commands(sub: argparse._SubParsersAction) -> None:
    """models, bench."""
    sp = sub.add_parser("models", help="list model cards and whether each is loadable here; --check: whether the "
                                       "probe supports a model, from its config.json alone")
    sp.add_argument("--check", metavar="PATH_OR_HUB_ID", default=None,
                    help="a model folder (or its config.json), or a hub id in the local hub cache: say whether the "
                         "architecture is supported, which layers have attention and what the probe measures, "
                         "without loading weights (exit 1 when it is refused)")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("bench", help="benchmarks: generate (batching speed-up), attention (probe cost), run "
                                      "(a probed run against an unprobed one), gpu-check (make gpu-check)")
    sp.add_argument("what", choices=["generate", "attention", "run", "gpu-check"])
    sp.add_argument("--experiment", default="demo", help="generate, run: the experiment (a path, or a shipped "
                                                         "experiment by name; default: demo)")
    sp.add_argument("--n", type=positive_int, default=None, help="generate: prompts to time (default 32); run: "
                    "prompts to run (default: all)")
    sp.add_argument("--batch-size", type=positive_int, default=None,
                    help="generate: batched size (default: the experiment's)")
    sp.add_argument("--lengths", type=lengths_or_none, default=LENGTHS_DEFAULT,
                    help="attention, gpu-check: prompt lengths in tokens, comma-separated (attention: an empty value "
                         "leaves the per-length table out; gpu-check: default 4096-32768)")
    sp.add_argument("--repeats", type=positive_int, default=1,
                    help="attention, run, gpu-check: rounds over the arms (fastest kept)")
    sp.add_argument("--model", default=None,
                    help="attention: the model card (name or path) to measure (default: the embedded default model)")
    sp.add_argument("--probe-batch", type=int, default=8,
                    help="attention: batch size of the batched-probing figure (0: leave it out)")
    sp.add_argument("--cpu", action="store_true",
                    help="gpu-check: run on the CPU with tiny models (default: refuse without a CUDA device)")
    sp.set_defaults(fn=cmd_bench)


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.fn(args) or 0)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only folder: records are appended or renamed whole, none is lost
        if e.errno not in _WRITE_ERRORS:
            raise
        where = f" {e.filename}" if e.filename else ""
        print(f"error: writing or reading{where} failed: {e.strerror or e}. Nothing already recorded is lost (every "
              "record is appended whole or written under a temporary name and renamed); free space or fix the "
              "folder's permissions, then run the same command again to finish", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
