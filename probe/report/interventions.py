"""The causal tests' part of the report: the recovery table, the layer-window curves and the heads used
(docs/interventions.md#the-effect-and-the-recovered-share)."""

from __future__ import annotations

import textwrap
from functools import partial

from matplotlib.figure import Figure

from probe import formatting as fmt
from probe.analysis.estimate import Estimate
from probe.analysis.interventions import Contrast, InterventionResult, InterventionRow, Sweep
from probe.analysis.paired_ratio import PairedDifference
from probe.config import AnalysisSection
from probe.interventions import Intervention
from probe.report.figures import file_stem, short
from probe.report.blocks import Block, Bullets, Heading, Note, Plot, table_of
from probe.report.sections import ReportSection, Rows
from probe.report.tables import rows_of

SECTION_NAME = "interventions"
RECOVERY_HEADER = ["model", "condition", "load", "intervention", "keys", "n (questions)", "EM base → int",
                   "paired diff [CI]", "p", "recovered share [CI]", "vs matched control [CI]", "q"]


def _effect_of(spec: Intervention | None) -> str:
    """What a claimed contrast of ``spec`` shows, in words."""
    if spec is not None and not spec.edits_attention:
        return "repeating the germane facts before the question recovers EM beyond repeating as many neutral sentences"
    if spec is not None and spec.keys == "germane":
        return "a causal effect of attention to the germane facts is shown"
    return "a causal effect of attention to the extraneous segments is shown"


def _diff(d: PairedDifference | None, digits: int = 3, ci_digits: int = 2) -> str:
    """``+0.250 [+0.10, +0.40]``, or the estimate with why it has no interval (the reason's first clause; the whole
    reason is in the CSV and analysis.json), or a dash."""
    e = None if d is None else d.estimate
    if e is None or e.value is None:
        return fmt.DASH
    if e.ci_low is None or e.ci_high is None:
        return f"{e.value:+.{digits}f}" + (f" (no interval: {fmt.first_clause(e.reason)})" if e.reason else "")
    return f"{e.value:+.{digits}f} [{e.ci_low:+.{ci_digits}f}, {e.ci_high:+.{ci_digits}f}]"


def _share(row: InterventionRow, brief: bool = False) -> str:
    """The recovered share with its interval, or why it has none: the whole reason, or with ``brief`` its first
    clause (the page's table, where one reason repeated over every row of a cell made each row ten lines tall)."""
    r = row.recovered.estimate
    why = "" if r.reason is None else fmt.first_clause(r.reason) if brief else r.reason
    if r.value is None:
        return f"undefined: {why}"
    if r.ci_low is None or r.ci_high is None:
        return f"{r.value:.2f} (no interval: {why})"
    return f"{r.value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"


def _specific_of(result: InterventionResult, row: InterventionRow) -> Contrast | None:
    return next((c for c in result.specific if (c.model, c.family, c.condition, c.load, c.a)
                 == (row.model, row.family, row.condition, row.load, row.intervention)), None)


def recovery_rows(result: InterventionResult, brief: bool = False) -> list[list[str]]:
    """The recovery table's rows (:data:`RECOVERY_HEADER`), as plain text; ``brief``: each recovered share's reason
    cut to its first clause, as the paired differences' always are."""
    out = []
    for row in result.rows:
        d = row.diff
        c = _specific_of(result, row)
        em = (fmt.DASH if d.em_a is None or d.em_b is None else f"{d.em_b:.3f} → {d.em_a:.3f}")
        vs = fmt.DASH if c is None else f"{_diff(c.test)} (vs {c.b})"
        out.append([row.model, row.condition, str(row.load), row.intervention, row.keys or "undeclared",
                    f"{d.n_prompts} ({d.n_questions})", em, _diff(d), fmt.p_value(d.estimate.p), _share(row, brief), vs,
                    fmt.DASH if c is None else fmt.p_value(c.q)])
    return out


def summary_lines(result: InterventionResult) -> list[str]:
    """One sentence per specific contrast (claim or "no causal effect shown" with its interval), and the reason
    when no contrast could be made."""
    alpha = result.alpha
    lines = []
    for c in result.specific:
        t = c.test.estimate
        where = f"{c.model}, {c.condition} at load {c.load}"
        ci = fmt.ci(t.ci_low, t.ci_high)
        if c.claim and c.q is not None and t.value is not None:
            lines.append(f"{where}: {c.a} raises EM by {t.value:+.3f} (95% CI {ci}) over its matched control "
                         f"{c.b} (BH q = {c.q:.3g} < {alpha}): {_effect_of(result.spec(c.a, c.model))}.")
        elif (c.q is not None and c.q < alpha and t.value is not None and t.value > 0 and c.unmatched is None
              and c.a_alone is not None):
            a = c.a_alone.estimate
            a_ci = fmt.ci(a.ci_low, a.ci_high)
            a_est = fmt.DASH if a.value is None else f"{a.value:+.3f}"
            lines.append(f"{where}: no causal effect shown: {c.a} beats its matched control {c.b} by "
                         f"{t.value:+.3f} (95% CI {ci}; BH q = {c.q:.3g}), but {c.a} alone changes EM by {a_est} "
                         f"(95% CI {a_ci}; p = {fmt.p_value(a.p)}) against the baseline: the contrast is carried by "
                         f"the harm {c.b} does, not by what {c.a} recovers.")
        else:
            why = (f"control not matched: {c.unmatched}" if c.unmatched is not None else t.reason if t.p is None else
                   f"q = {fmt.p_value(c.q)}" + ("" if c.q is not None and c.q < alpha else f" >= {alpha}")
                   + ("" if t.value is None or t.value > 0 else ", and the contrast is not positive"))
            est = fmt.DASH if t.value is None else f"{t.value:+.3f}"
            lines.append(f"{where}: no causal effect shown: {c.a} vs its matched control {c.b}: "
                         f"{est} (95% CI {ci}; {why}).")
    if not result.specific:
        lines.append("No causal effect shown: no intervention has a matched control with trials (extraneous keys "
                     "and matched-random, germane and matched-germane, a germane and a filler reinject), so no "
                     "specific contrast was tested.")
    return lines


def _heads_text(spec: Intervention | None) -> str:
    if spec is None:
        return "undeclared"
    layers, heads = spec.layers, spec.heads
    if heads is None:
        return "all heads" if layers is None else f"all heads of layers {_layers(layers)}"
    return ", ".join(f"L{layer}.H{head}" for layer, head in heads)


def _layers(layers: tuple[int, ...]) -> str:
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}–{layers[-1]}"
    return ", ".join(map(str, layers))


def heads_rows(result: InterventionResult) -> list[list[str]]:
    """Top-k interventions, their random-heads controls and the heads each acts on, per model (each model resolves its
    own heads)."""
    out = []
    for s in result.specs:
        if s.selection is None:
            continue
        role = (f"random control of {s.selection.control_of}" if s.selection.control_of
                else f"top-k by {s.selection.by or 'enrichment'}")  # by: recorded since the first file version
        out.append([s.model or fmt.DASH, s.name, role, str(s.selection.k), s.selection.from_run or fmt.DASH,
                    _heads_text(s)])
    return out


def heads_contrast_rows(result: InterventionResult) -> list[list[str]]:
    """Top-k heads against their random heads, per cell."""
    return [[c.model, c.condition, str(c.load), c.a, c.b, f"{c.test.n_prompts} ({c.test.n_questions})",
             _diff(c.test), fmt.p_value(c.test.estimate.p)] for c in result.heads]


def _undefined_note(estimates: list[Estimate]) -> str:
    """Why a panel of :func:`draw_sweep` has no point: the first window's reason, and whether others differ."""
    reasons = list(dict.fromkeys(e.reason for e in estimates if e.reason))
    text = f"no value at any of the {len(estimates)} windows"
    if reasons:
        text += ":\n" + textwrap.fill(reasons[0], 48)
    if len(reasons) > 1:
        text += f"\n(other windows: {len(reasons) - 1} other reason(s), in intervention_sweeps.csv)"
    return text


def draw_sweep(sweep: Sweep) -> Figure | None:
    """The layer-window curve of one sweep: paired difference (left) and recovered share (right) against the
    window's centre layer, with 95% CI bars; None without points. A panel with no value at any window says why."""
    if not sweep.points:
        return None
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax_d, ax_r = fig.subplots(1, 2)
    x = [p.centre for p in sweep.points]
    for ax, estimates, label in ((ax_d, [p.diff.estimate for p in sweep.points], "EM_int − EM_base"),
                                 (ax_r, [p.recovered.estimate for p in sweep.points], "recovered share")):
        shown = [(xi, e.value, e.ci_low, e.ci_high) for xi, e in zip(x, estimates) if e.value is not None]
        ax.plot([s[0] for s in shown], [s[1] for s in shown], "o-", color="#d95f02")
        for xi, y, lo, hi in shown:
            if lo is not None and hi is not None:
                ax.errorbar([xi], [y], yerr=[[y - lo], [hi - y]], color="#d95f02", capsize=3)
        if not shown:  # e.g. at Control the baseline lost nothing, so no share is defined anywhere
            ax.text(0.5, 0.5, _undefined_note(estimates), transform=ax.transAxes, ha="center", va="center",
                    fontsize=8, color="#555")
        ax.axhline(0, color="#999", lw=0.8)
        if label == "recovered share":
            ax.axhline(1, color="#999", lw=0.8, ls="--")
        ax.set_xticks(x)
        ax.set_xlabel("layer-window centre")
        ax.set_ylabel(label)
    fig.suptitle(f"{short(sweep.model)} · {sweep.condition} {sweep.load} · {sweep.group}", fontsize=10)
    return fig


MOVED_HEADER = ["model", "condition", "load", "edit", "segment kind", "target", "baseline mass", "under the edit",
                "n (questions)", "Δ [CI]", "p"]


def moved_rows(result: InterventionResult) -> list[list[str]]:
    """The manipulation check's rows (:class:`MovedMass`), as plain text."""
    return [[m.model, m.condition, str(m.load), m.intervention, m.kind, "yes" if m.target else "no",
             fmt.num(m.base, ".4f"), fmt.num(m.under, ".4f"), str(m.diff.n_questions), _diff(m.diff, 4, 4),
             fmt.p_value(m.diff.estimate.p)] for m in result.moved]


def blocks(result: InterventionResult, settings: AnalysisSection) -> list[Block]:
    """The causal tests' section: summary, recovery table, layer-window curves, heads (the section's notes are listed
    once, under the report's Notes)."""
    out: list[Block] = [
        Heading("Causal tests: interventions"), Bullets(tuple(summary_lines(result))), Heading("Recovery", 3),
        table_of(RECOVERY_HEADER, recovery_rows(result, brief=True), left=5, text=(9, 10)),
        Note("Paired by prompt: the mean over questions of the per-question mean difference, question-level sign-flip "
             "p, CR2 t interval (Bell–McCaffrey df). Recovered share = (EM_int − EM_base) / (EM_Control − EM_base), "
             "Fieller interval. q: Benjamini–Hochberg across the model's contrasts against matched controls; a causal "
             f"effect is claimed only where q < {result.alpha}, the contrast is positive and the intervention alone "
             f"raises EM (p < {result.alpha}). Why an estimate has no interval or is undefined is cut to its first "
             "clause here; the whole reason is in tables/interventions.csv.")]
    if result.moved:
        out += [Heading("Manipulation check: the attention each edit moved", 3),
                table_of(MOVED_HEADER, moved_rows(result), left=5),
                Note("The answer rows' attention mass on each kind of prompt segment (summed over its segments, "
                     "averaged over answer tokens, layers and heads), under the edit and on the same prompt's baseline; "
                     "Δ = under − baseline, mean over questions, sign-flip p, CR2 t interval. Target: the edit's keys "
                     "lie in that kind (a matched draw's keys are some of that kind's tokens, so its Δ there is a "
                     "lower bound on the mass moved onto its keys). A row \"a − b\" compares the mass each edit moved "
                     "onto its own keys' kinds; its two mass columns hold what a moved and what b moved "
                     "(docs/interventions.md#the-manipulation-check).")]
    if result.sweeps:
        out += [Heading("Layer-window sweeps", 3)] + [
            Plot(f"intervention_sweep_{file_stem(f'{s.model}_{s.condition}_{s.load}_{s.group}')}",
                 f"Layer-window sweep {s.group}: {s.model}, {s.condition} at load {s.load}; 95% CI bars",
                 partial(draw_sweep, s)) for s in result.sweeps]
    if result.heads or heads_rows(result):
        out += [Heading("Heads", 3),
                table_of(["model", "intervention", "role", "k", "selected from", "heads"], heads_rows(result), left=3,
                         text=(5,)),
                table_of(["model", "condition", "load", "top-k", "random", "n (questions)", "diff [CI]", "p"],
                         heads_contrast_rows(result), left=5)]
    return out


def tables(result: InterventionResult) -> list[tuple[str, Rows]]:
    """``tables/interventions.csv`` (one row per intervention and cell), ``intervention_contrasts.csv`` (specific
    and heads contrasts), ``intervention_sweeps.csv`` (one row per sweep point) and ``interventions_declared.csv``."""
    specific = {(c.model, c.family, c.condition, c.load, c.a): c for c in result.specific}
    rows: Rows = []
    for r in result.rows:
        c = specific.get((r.model, r.family, r.condition, r.load, r.intervention))
        rows += rows_of([r], specific_vs=None if c is None else c.b,
                        specific_delta=None if c is None else c.test.estimate.value,
                        specific_ci_low=None if c is None else c.test.estimate.ci_low,
                        specific_ci_high=None if c is None else c.test.estimate.ci_high,
                        specific_q=None if c is None else c.q, claim=None if c is None else c.claim)
    sweeps: Rows = [row for s in result.sweeps
                    for row in rows_of(s.points, model=s.model, family=s.family, condition=s.condition,
                                       load=s.load, group=s.group)]
    return [("interventions", rows), ("intervention_contrasts", rows_of([*result.specific, *result.heads])),
            ("intervention_sweeps", sweeps), ("interventions_declared", rows_of(result.specs)),
            ("intervention_moved_mass", rows_of(result.moved))]


def main_lines(result: InterventionResult, settings: AnalysisSection) -> list[str]:
    """The causal claims (or "no causal effect shown") below the main table."""
    return ["Interventions:", *[f"  {s}" for s in summary_lines(result)]]


SECTION = ReportSection(family=SECTION_NAME, blocks=blocks, tables=tables, main_lines=main_lines)


__all__ = ["RECOVERY_HEADER", "SECTION", "blocks", "draw_sweep", "heads_contrast_rows", "heads_rows",
           "recovery_rows", "summary_lines"]
