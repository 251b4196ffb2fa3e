"""The hop-tracking part of the ICE report: label shares per cell, the tests of the hop masses, and their CSV tables
(docs/probes.md#hop-tracking)."""

from __future__ import annotations

from functools import partial

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probe import formatting as fmt
from probe.analysis.hop_tests import HopMassTest
from probe.analysis.hops import HopCell, HopTracking
from probe.report.figures import file_stem, short
from probe.report.blocks import Block, Heading, Note, Plot, table_of
from probe.report.sections import Rows

TITLE = "Hop tracking: what the model read while it named each hop's answer"
NOT_RUN = ("not run: no probe record of this run holds attention while the answer was written (hop tracking reads "
           "the attention of the generated tokens that name each hop's answer, captured when the run probes with "
           "answer = true in [probe]; docs/probes.md#hop-tracking)")
LEGEND = ("read right fact: among the content segments, the germane fact stating the hop held the most attention "
          "while its answer was first written; read distractor: an extraneous segment that names the written entity "
          "did; other: another segment did; not named: the output never names the hop's answer. Rows “right entity "
          "named” count the hops whose own answer the output names; rows “wrong answers” count only the last hop of "
          "wrong trials, tracked on the wrong answer. Shares with 95% intervals "
          "clustered by question (Wilson at the Korn–Graubard effective size); masses: mean share of attention on "
          "the hop's fact, the other facts, the extraneous segments and the question, over the named hops, pooled "
          "over heads and the layers of the window.")
SUBSET_LABELS = {"all": "all hops", "correct_named": "right entity named", "wrong_answer": "wrong answers"}
SHOWN = ("read_right_fact", "read_distractor", "other", "not_named")
MASSES = ("hop", "other_germane", "extraneous", "question")


def _share(c: HopCell, label: str) -> str:
    s = c.share_of(label)
    return f"{fmt.pct(s.share)} {fmt.ci(s.ci_low, s.ci_high, '.2f')}" if s.ci_low is not None else fmt.pct(s.share)


def _cells(h: HopTracking, measure: str) -> list[HopCell]:
    return [c for c in h.cells if c.measure == measure]


def _row(h: HopTracking, c: HopCell) -> list[str]:
    mass = dict(zip(h.categories, c.mass)) if c.mass is not None else {}
    return ([c.model, c.condition, str(c.load), SUBSET_LABELS[c.subset],
             str(c.n), str(c.n_questions)] + [_share(c, lab) for lab in SHOWN]
            + [fmt.num(mass.get(k), ".3f") for k in MASSES] + [f"{c.layers[0]}–{c.layers[1] - 1}"])


HEADER = (["model", "condition", "load", "hops", "n", "questions"] + [lab.replace("_", " ") for lab in SHOWN]
          + ["mass: hop's fact", "other facts", "extraneous", "question", "layers"])


TESTS_TITLE = "Does the mass on the hop's fact, or on the extraneous segments, differ by outcome and condition?"
TESTS_LEGEND = ("One row per test: the attention of the tokens that first name a hop's answer on the hop's own fact "
                "(or on the extraneous segments), failed − correct over the Saturation and Residue trials at equal "
                "load, placement and hop position, Saturation − Control at each load at equal hop position, and "
                "Saturation − LongControl at each load (equal prompt length: what the distractors add beyond "
                "length). "
                "Per layer: the head-pooled mass, CR2 clustered by question (Bell–McCaffrey df), BH across the "
                "layers; per head: the same fit, BH across the layer × head map, and the max-T sign-flip "
                "correction over the map (family-wise; per question, the mean of one side minus the other, of "
                "adjusted residuals, questions with both sides). Layers and heads are listed where q < 0.05 (max-T: "
                "p < 0.05), with the sign of the difference; docs/statistics.md#hop-mass-tests.")
TESTS_HEADER = ["model", "attention", "contrast", "mass", "trial-hops", "questions", "layers (q < α)",
                "largest layer difference", "heads (q < α)", "heads (max-T p < α)", "top head"]


def _signed(layer: int, value: float | None) -> str:
    return f"{layer}{'+' if (value or 0) > 0 else '−'}"


def _test_row(t: HopMassTest, alpha: float) -> list[str]:
    contrast = t.contrast + ("" if t.load is None else f" ({t.load} %)")
    head = [t.model, "value-weighted" if t.measure == "value" else "weights", contrast,
            "hop's fact" if t.category == "hop" else t.category, str(t.n)]
    if t.layers is None or t.heads is None:
        return head + [str(t.n_questions), f"not tested: {t.reason}"] + [""] * 4
    qs = f"{t.n_questions} ({t.heads.max_t.n_questions if t.heads.max_t is not None else 0} both sides)"
    if not t.layers.is_test:
        return head + [qs, f"descriptive: {t.layers.reason}"] + [""] * 4
    sig = [lt for lt in t.layers.layers if lt.layer in t.layers.significant]
    layers = ", ".join(_signed(lt.layer, lt.estimate.value) for lt in sig) or "none"
    big = max(t.layers.layers, key=lambda lt: abs(lt.estimate.value or 0.0))
    e = big.estimate
    largest = (f"layer {big.layer}: {fmt.num(e.value, '+.3f')} {fmt.ci(e.ci_low, e.ci_high, '+.3f')}, "
               f"q {fmt.p_value(e.q)}")
    listed = t.heads.listed()
    mt = t.heads.max_t.significant if t.heads.max_t is not None else ()
    top = min(listed, key=lambda x: x[0].estimate.p if x[0].estimate.p is not None else 1.0)[0] if listed else None
    top_s = "none" if top is None else (f"L{top.layer}.H{top.head} {fmt.num(top.estimate.value, '+.3f')}, q "
                                        f"{fmt.p_value(top.estimate.q)}, max-T p {fmt.p_value(top.p_max_t)}")
    return head + [qs, layers, largest, str(len(t.heads.significant)), str(len(mt)), top_s]


def _tests_rows(h: HopTracking, alpha: float = 0.05) -> list[list[str]]:
    """Rows of the tests that were fitted (descriptive ones included); the others go to :func:`_untested`."""
    return [_test_row(t, alpha) for t in h.tests if t.layers is not None]


def _untested(h: HopTracking) -> str:
    """One sentence on the tests that could not be fitted, grouped by reason ("" when none)."""
    why: dict[str, list[str]] = {}
    for t in h.tests:
        if t.layers is None:
            what = f"{t.contrast}{'' if t.load is None else f' ({t.load} %)'} {t.category} ({t.measure})"
            why.setdefault(str(t.reason), []).append(what)
    return " ".join(f"Not tested: {', '.join(v)}: {k}." for k, v in why.items())


ROLE_COLOURS = {"hop": "#1b9e77", "other_germane": "#66a61e", "extraneous": "#d95f02", "question": "#c51b7d"}
ROLE_NAMES = {"hop": "the hop's fact", "other_germane": "other facts", "extraneous": "extraneous",
              "question": "question"}


PANELS_PER_ROW = 4


def _panel_grid(n: int, width: float, height: float) -> tuple[Figure, list]:
    """A figure of ``n`` panels sharing the y axis, at most :data:`PANELS_PER_ROW` to a row (the empty places of the
    last row hidden), each ``width`` × ``height`` inches."""
    cols = min(n, PANELS_PER_ROW)
    rows = -(-n // cols)
    fig = Figure(figsize=(max(6.4, width * cols), height * rows + 0.6), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False, sharey=True)
    axes = list(grid.ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def draw_layers(h: HopTracking, model: str) -> Figure | None:
    """Per layer, the head-pooled mass of the named hops' tokens on the hop's fact, the other facts, the extraneous
    segments and the question: one panel per condition × load (raw attention), the depth window shaded."""
    cells = [c for c in h.cells if c.model == model and c.measure == "raw" and c.subset == "all" and c.grid is not None]
    if not cells:
        return None
    fig, axes = _panel_grid(len(cells), 3.2, 3.0)
    for ax, c in zip(axes, cells):
        assert c.grid is not None
        grid = c.grid.values  # (layer, head, role)
        layers = np.arange(grid.shape[0])
        for role in MASSES:
            ax.plot(layers, grid[:, :, h.categories.index(role)].mean(axis=1), marker=".", lw=1.2,
                    color=ROLE_COLOURS[role], label=ROLE_NAMES[role])
        ax.axvspan(c.layers[0] - 0.5, c.layers[1] - 0.5, color="#999", alpha=0.12, lw=0)
        ax.set_title(f"{c.condition}" + ("" if c.condition == "Control" else f" {c.load}%"), fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
        ax.grid(alpha=0.3)
    for ax in axes[:: min(len(axes), PANELS_PER_ROW)]:
        ax.set_ylabel("attention mass (heads pooled)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{short(model)}: where the tokens naming a hop's answer look, by layer (grey: the window)",
                 fontsize=11, wrap=True)
    return fig


def draw_tests(h: HopTracking, model: str) -> Figure | None:
    """Per layer, the head-pooled difference of each fitted test of the model's raw hop masses with its 95 %
    interval (one panel per test; filled markers: q < α across the layers). None without a fitted test."""
    tests = [t for t in h.tests if t.model == model and t.measure == "raw" and t.layers is not None]
    if not tests:
        return None
    fig, axes = _panel_grid(len(tests), 3.0, 2.9)
    for ax, t in zip(axes, tests):
        assert t.layers is not None
        rows = t.layers.layers
        x = np.array([lt.layer for lt in rows])
        est = np.array([np.nan if lt.estimate.value is None else lt.estimate.value for lt in rows])
        lo = np.array([np.nan if lt.estimate.ci_low is None else lt.estimate.ci_low for lt in rows])
        hi = np.array([np.nan if lt.estimate.ci_high is None else lt.estimate.ci_high for lt in rows])
        colour = ROLE_COLOURS.get(t.category, "#333")
        ax.axhline(0, color="#999", lw=0.8)
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
        ax.plot(x, est, color=colour, lw=1.2)
        sig = np.isin(x, t.layers.significant)
        ax.scatter(x[~sig], est[~sig], s=12, facecolors="white", edgecolors=colour, zorder=3)
        ax.scatter(x[sig], est[sig], s=18, color=colour, zorder=3)
        what = t.contrast + ("" if t.load is None else f" {t.load}%")
        ax.set_title(f"{what}\n{ROLE_NAMES.get(t.category, t.category)}", fontsize=9)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
        ax.grid(alpha=0.3)
    for ax in axes[:: min(len(axes), PANELS_PER_ROW)]:
        ax.set_ylabel("difference in mass (heads pooled)")
    fig.suptitle(f"{short(model)}: hop masses by outcome and condition, per layer (95% CI, filled: q < α)",
                 fontsize=11, wrap=True)
    return fig


def blocks(h: HopTracking | None, alpha: float) -> list[Block]:
    """The hop-tracking part of the ICE section: label shares per cell, the tests of the hop masses, the figures."""
    out: list[Block] = [Heading(TITLE, 3)]
    if h is None or h.reason is not None:
        return out + [Note(f"Hop tracking {NOT_RUN if h is None else f'not available: {h.reason}'}.")]
    out.append(Note(f"{LEGEND} Window: {h.window}. {h.n_trials} trials tracked"
                    + (f", {h.n_skipped} skipped (see the notes)" if h.n_skipped else "") + "."))
    for measure, name in (("raw", "attention weights"), ("value", "value-weighted attention")):
        cells = _cells(h, measure)
        if cells:
            out += [Heading(name, 4), table_of(HEADER, [_row(h, c) for c in cells], left=4)]
    if h.tests:
        rows = _tests_rows(h, alpha)
        out += [Heading(TESTS_TITLE, 4), Note(f"{TESTS_LEGEND} {_untested(h)}".strip())]
        out += [table_of(TESTS_HEADER, rows, left=4)] if rows else []
        out += [Plot(f"hop_tests_{file_stem(model)}", f"{model}: per layer, the head-pooled difference in the "
                       "attention of the tokens that first name a hop's answer (failed − correct on the hop's fact and "
                       "on the extraneous segments; Saturation − Control and Saturation − LongControl on the hop's "
                       "fact), raw attention weights, with 95% intervals clustered by question; filled markers pass "
                       "BH across the layers.", partial(draw_tests, h, model))
                for model in sorted({t.model for t in h.tests})]
    return out + [Plot(f"hop_layers_{file_stem(model)}", f"{model}: per layer, the attention of the tokens that "
                         "first name a hop's answer on the hop's own fact, the other facts, the extraneous segments "
                         "and the question (mean over heads and over the named hops of the cell; grey band: the "
                         "layers the label reads).", partial(draw_layers, h, model))
                  for model in sorted({c.model for c in h.cells})]


def tables(h: HopTracking | None) -> list[tuple[str, Rows]]:
    """``tables/hop_tracking.csv`` (one row per cell), ``tables/hop_tracking_trials.csv`` (per trial and hop) and
    ``tables/hop_mass_tests.csv`` (per test: every layer, and the heads that pass BH or max-T); none without hop
    tracking."""
    if h is None:
        return []
    cells: Rows = []
    for c in h.cells:
        row: dict = {"model": c.model, "condition": c.condition, "load": c.load, "measure": c.measure,
                     "subset": c.subset, "n": c.n, "n_trials": c.n_trials, "n_questions": c.n_questions,
                     "layer_lo": c.layers[0], "layer_hi": c.layers[1]}
        for s in c.shares:
            row.update({f"{s.label}_count": s.count, f"{s.label}_share": s.share, f"{s.label}_ci_low": s.ci_low,
                        f"{s.label}_ci_high": s.ci_high})
        for k, v in zip(h.categories, c.mass or (None,) * len(h.categories)):
            row[f"mass_{k}"] = v
        cells.append(row)
    trials: Rows = []
    for r in h.rows:
        row = {k: v for k, v in vars(r).items() if k not in ("mass", "vmass")}
        for k, v in zip(h.categories, r.mass or (None,) * len(h.categories)):
            row[f"mass_{k}"] = v
        for k, v in zip(h.categories, r.vmass or (None,) * len(h.categories)):
            row[f"vmass_{k}"] = v
        trials.append(row)
    tests: Rows = []
    for t in h.tests:
        base: dict = {"model": t.model, "measure": t.measure, "category": t.category, "contrast": t.contrast,
                      "load": t.load, "n": t.n, "n_trials": t.n_trials, "n_questions": t.n_questions,
                      "max_t_questions": t.heads.max_t.n_questions if t.heads is not None and t.heads.max_t else None,
                      "reason": t.reason}
        for lt in t.layers.layers if t.layers is not None else ():
            e = lt.estimate
            tests.append({**base, "layer": lt.layer, "head": None, "estimate": e.value, "ci_low": e.ci_low,
                          "ci_high": e.ci_high, "p": e.p, "q": e.q, "p_max_t": None})
        for hr, passed in t.heads.listed() if t.heads is not None else ():
            e = hr.estimate
            tests.append({**base, "layer": hr.layer, "head": hr.head, "estimate": e.value, "ci_low": e.ci_low,
                          "ci_high": e.ci_high, "p": e.p, "q": e.q, "p_max_t": hr.p_max_t, "passes": passed})
    out = [("hop_tracking", cells), ("hop_tracking_trials", trials)]
    return out + ([("hop_mass_tests", tests)] if tests else [])


__all__ = ["blocks", "draw_layers", "draw_tests", "tables"]
