"""Causal tests: EM under an intervention (attention knockout or steering) against the baseline trial of the same
prompt, the recovered share, the specific contrast against a matched-random control, layer-window sweeps and top-k
heads against random heads.

A trial run under an intervention carries its name (:attr:`probe.records.TrialRecord.intervention`; None is the
baseline trial of the same prompt). The run folder's ``interventions.json`` (written by the runner) declares each
intervention (:class:`InterventionSpec`); :func:`load_interventions` reads it, and a run folder without it has no
intervention. Every other estimate of the analysis (cells, H1–H3, taxonomy, attention, CogniLoad) reads the
baseline trials only (:func:`baseline_only`): an intervened trial never enters an ICE estimate.

Estimates, per model × family × condition × load × intervention (:class:`InterventionRow`):

- **Paired difference** EM_int − EM_base, the two trials of each prompt paired by prompt id
  (:func:`paired_difference`): per question q, d_q = mean over its paired prompts of the difference; the estimate
  is the mean of d_q (each question weighs the same). Test: the question-level sign-flip permutation test
  (:func:`probe.analysis.inference.paired_sign_flip`, exact up to 16 questions), as for H2. Interval: the CR2
  interval of the mean of d_q (:func:`probe.analysis.inference.clustered_ols` on a constant, one row per
  question, Bell–McCaffrey df, which for one row per question is the one-sample t interval on G − 1 df). Below
  :data:`probe.analysis.inference.MIN_CLUSTERS` questions: descriptive only.
- **Recovered share** R = (EM_int − EM_base) / (EM_Control − EM_base) (:func:`recovered_share`), EM_Control the
  model's baseline Control EM on the same questions, from per-question means over the questions with all three.
  Interval: Fieller's interval for a ratio of means of paired per-question values on t(G − 1) (docs/statistics.md
  gives the choice and its simulated coverage, :func:`recovered_share_coverage`). Undefined, with the reason as
  text, where EM_Control − EM_base ≤ 0 (nothing to recover); the interval is unbounded, with the reason, where the
  denominator is not distinguishable from 0 at level alpha.
- **Specific contrast** (:class:`Contrast`, ``kind="specific"``): EM(extraneous-key intervention) − EM(its
  ``matched-random`` twin: same kind, alpha, queries, layers, heads and window), paired by prompt, tested as
  above. Benjamini–Hochberg q-values across every specific contrast of a model (one family). A causal effect is
  claimed (``claim``) only where q < alpha and the contrast is positive: the extraneous knockout recovers more than
  removing as many random tokens.
- **Top-k heads against random heads** (``kind="heads"``): EM(top-k) − EM(its random-heads control, the
  intervention whose ``selection.control_of`` names it), paired by prompt, tested as above.
- **Layer-window sweep** (:class:`Sweep`): the members of one ``group`` that carry a ``window``, their paired
  difference and recovered share against the window's centre layer.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from probe.analysis import inference as inf
from probe.analysis.frame import RunData
from probe.interventions import InterventionsFileError, read_interventions
from probe.runfolder import INTERVENTIONS, RunFolder

log = logging.getLogger(__name__)

INTERVENTIONS_FILE = INTERVENTIONS  # the run folder's file name (probe.runfolder)
KEYS = ("extraneous", "filler", "germane", "matched-random")
CONTROL_CONDITION = "Control"

METHODS = {
    "intervention paired difference": "EM under the intervention minus EM of the baseline trial of the same prompt; "
                                      "mean of per-question mean differences; question-level sign-flip test (exact "
                                      "to 16 questions), CR2 t interval (Bell-McCaffrey df)",
    "recovered share": "(EM_int - EM_base) / (EM_Control - EM_base) from per-question means; Fieller interval on "
                       "t(G-1); undefined where EM_Control <= EM_base",
    "specific contrast": "EM(extraneous knockout) - EM(matched-random knockout), paired by prompt, sign-flip test; "
                         "BH q-values across a model's specific contrasts; a causal effect is claimed only where "
                         "q < alpha and the contrast is positive",
}


# ------------------------------------------------------------------------------------------------- declaration


@dataclass(frozen=True)
class HeadSelection:
    """How the heads of a top-k intervention (or of its random control) were chosen.

    Attributes:
        from_run: the separate probe run whose enrichment ranked the heads.
        k: number of heads.
        control_of: for a random-heads control, the name of the top-k intervention it controls; None for the top-k
            intervention itself.
    """

    from_run: str
    k: int
    control_of: str | None


@dataclass(frozen=True)
class InterventionSpec:
    """One declared intervention, as ``interventions.json`` gives it.

    Attributes:
        name: the name trials carry in ``intervention``.
        kind: ``knockout`` (edges removed) or ``steer`` (weights on the keys scaled by ``alpha``, row renormalised).
        alpha: the steering coefficient (None or 0 for a knockout).
        keys: the keys acted on: ``extraneous``, ``filler``, ``germane`` or ``matched-random``.
        queries: the queries acted on (as declared).
        layers: the layers acted on (0-based).
        heads: the (layer, head) pairs acted on; None: every head of ``layers``.
        window: [first, last] layer of a layer-window sweep member; None otherwise.
        group: the declared intervention a sweep member belongs to (its own name otherwise).
        selection: how top-k heads (or their random control) were chosen; None otherwise.
    """

    name: str
    kind: str
    alpha: float | None
    keys: str
    queries: str
    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None
    window: tuple[int, int] | None
    group: str
    selection: HeadSelection | None

    @property
    def centre(self) -> float | None:
        """The window's centre layer ((first + last) / 2), None outside a sweep."""
        return None if self.window is None else (self.window[0] + self.window[1]) / 2

    def twin_key(self) -> tuple[Any, ...]:
        """Everything but the keys: two interventions with equal twin keys differ only in what they act on."""
        return (self.kind, self.alpha, self.queries, self.layers, self.heads, self.window)


def _field(path: Path, i: int, d: dict[str, Any], name: str, types: tuple[type, ...], required: bool = True) -> Any:
    if name not in d:
        if required:
            raise InterventionsFileError(f"{path}: entry {i} has no field {name!r}; the runner writes it: re-run "
                                         "`probe run` or fix the file")
        return None
    v = d[name]
    if v is None and not required:
        return None
    if not isinstance(v, types) or isinstance(v, bool) and bool not in types:
        raise InterventionsFileError(f"{path}: entry {i} field {name!r} = {v!r} is not of type "
                                     f"{' or '.join(t.__name__ for t in types)}")
    return v


def _spec(path: Path, i: int, d: Any) -> InterventionSpec:
    if not isinstance(d, dict):
        raise InterventionsFileError(f"{path}: entry {i} is {type(d).__name__}, not an object")
    name = _field(path, i, d, "name", (str,))
    kind = _field(path, i, d, "kind", (str,))
    if kind not in ("knockout", "steer"):
        raise InterventionsFileError(f"{path}: entry {i} ({name}) kind {kind!r} is not 'knockout' or 'steer'")
    keys = _field(path, i, d, "keys", (str,))
    if keys not in KEYS:
        raise InterventionsFileError(f"{path}: entry {i} ({name}) keys {keys!r} is not one of {KEYS}")
    alpha = _field(path, i, d, "alpha", (int, float), required=False)
    layers = _field(path, i, d, "layers", (list,))
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        raise InterventionsFileError(f"{path}: entry {i} ({name}) layers {layers!r} must be a list of integers")
    heads_raw = _field(path, i, d, "heads", (str, list))
    heads: tuple[tuple[int, int], ...] | None
    if isinstance(heads_raw, str):
        if heads_raw != "all":
            raise InterventionsFileError(f"{path}: entry {i} ({name}) heads {heads_raw!r}: 'all' or [[layer, head]]")
        heads = None
    else:
        if not all(isinstance(h, list) and len(h) == 2 and all(isinstance(x, int) for x in h) for h in heads_raw):
            raise InterventionsFileError(f"{path}: entry {i} ({name}) heads {heads_raw!r}: a list of [layer, head]")
        heads = tuple((int(h[0]), int(h[1])) for h in heads_raw)
    window_raw = _field(path, i, d, "window", (list,), required=False)
    window: tuple[int, int] | None = None
    if window_raw is not None:
        if len(window_raw) != 2 or not all(isinstance(x, int) for x in window_raw):
            raise InterventionsFileError(f"{path}: entry {i} ({name}) window {window_raw!r}: [first, last] layer")
        window = (int(window_raw[0]), int(window_raw[1]))
    sel_raw = _field(path, i, d, "selection", (dict,), required=False)
    selection = None
    if sel_raw is not None:
        k = sel_raw.get("k")
        control_of = sel_raw.get("control_of")
        if not isinstance(k, int) or not (control_of is None or isinstance(control_of, str)):
            raise InterventionsFileError(f"{path}: entry {i} ({name}) selection {sel_raw!r}: needs an integer 'k' "
                                         "and 'control_of' a name or null")
        selection = HeadSelection(from_run=str(sel_raw.get("from", "")), k=k, control_of=control_of)
    group = _field(path, i, d, "group", (str,), required=False)
    return InterventionSpec(name=name, kind=kind, alpha=None if alpha is None else float(alpha), keys=keys,
                            queries=str(_field(path, i, d, "queries", (str,))), layers=tuple(int(x) for x in layers),
                            heads=heads, window=window, group=name if group is None else group, selection=selection)


def load_interventions(run: RunFolder | str | Path) -> tuple[InterventionSpec, ...]:
    """The interventions a run folder declares (``interventions.json``); () when the file is absent.

    Raises:
        InterventionsFileError: the file is not JSON, not a list of objects, misses a field or has a wrong type
            (names the file, the entry and the field), or two entries share a name.
    """
    path = RunFolder(run).interventions
    data = read_interventions(run)
    specs = tuple(_spec(path, i, d) for i, d in enumerate(data))
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InterventionsFileError(f"{path}: intervention {dup[0]!r} is declared more than once")
    return specs


def baseline_only(data: RunData) -> RunData:
    """The run's baseline trials (intervention None) only: what every estimate but this module's reads."""
    keep = data.frame["intervention"].isna().to_numpy()
    if keep.all():
        return data
    return RunData(frame=data.frame[keep], trials=tuple(t for t, k in zip(data.trials, keep) if k),
                   prompts=data.prompts)


# ------------------------------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class PairedDifference:
    """EM of ``a`` minus EM of ``b`` over prompts scored under both, question by question.

    Attributes:
        n_prompts: prompts scored under both.
        n_questions: questions (clusters) among them.
        em_a, em_b: mean EM of ``a`` and of ``b`` over the paired prompts.
        delta: mean over questions of the per-question mean difference (None without pairs).
        ci_low, ci_high: CR2 interval of ``delta``, cut to [-1, 1] (None when descriptive or the differences do
            not vary).
        se: its standard error; df: its t reference's degrees of freedom.
        p: two-sided question-level sign-flip p-value (None when descriptive).
        is_exact: the p-value enumerates every sign assignment.
        is_test: False when descriptive (see ``reason``).
        method: the methods, in words.
        reason: why there is no test or interval (None otherwise).
    """

    n_prompts: int
    n_questions: int
    em_a: float | None
    em_b: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    se: float | None
    df: float | None
    p: float | None
    is_exact: bool
    is_test: bool
    method: str
    reason: str | None


def paired_difference(em_a: np.ndarray, em_b: np.ndarray, questions: np.ndarray, alpha: float = 0.05,
                      seed: int = 0) -> PairedDifference:
    """EM_a − EM_b paired by prompt: question-level sign-flip test and CR2 interval (module docstring).

    Args:
        em_a: (n,) EM under ``a`` of each paired prompt.
        em_b: (n,) EM under ``b`` of the same prompts.
        questions: (n,) question (task) ids.
        alpha: test level and 1 − confidence level.
        seed: seed of the Monte Carlo sign flips (above 16 questions).

    Returns:
        The :class:`PairedDifference`.
    """
    a = np.asarray(em_a, dtype=float)
    b = np.asarray(em_b, dtype=float)
    g = np.asarray(questions)
    t = inf.paired_sign_flip(a, b, g, alpha=alpha, seed=seed)
    method = (f"{t.method}; interval: CR2 t interval of the mean per-question difference (Bell-McCaffrey df), "
              "cut to [-1, 1]")
    out = PairedDifference(n_prompts=t.n_pairs, n_questions=t.n_questions, em_a=t.em_a, em_b=t.em_b, delta=t.delta,
                           ci_low=None, ci_high=None, se=None, df=None, p=t.p, is_exact=t.is_exact,
                           is_test=t.is_test, method=method, reason=t.reason)
    if t.n_pairs == 0 or not t.is_test:
        return out
    qs, codes = np.unique(g.astype(str), return_inverse=True)
    d = np.bincount(codes, weights=a - b) / np.bincount(codes)  # (G,) per-question mean differences
    fit = inf.clustered_ols(d, np.ones((d.size, 1)), qs, term=0, alpha=alpha)
    if not fit.is_test or fit.ci_low is None or fit.ci_high is None:
        return replace(out, reason=t.reason or f"no interval: {fit.reason}")
    # a difference of two proportions lies in [-1, 1]: the t interval is cut there (its coverage can only grow)
    return replace(out, ci_low=max(-1.0, fit.ci_low), ci_high=min(1.0, fit.ci_high), se=fit.se, df=fit.df)


@dataclass(frozen=True)
class RecoveredShare:
    """(EM_int − EM_base) / (EM_Control − EM_base) with its Fieller interval, or the reason it is undefined.

    Attributes:
        estimate: the share (1: the intervention recovers the whole loss; 0: nothing); None when undefined.
        ci_low, ci_high: Fieller interval on t(G − 1); None when undefined, descriptive or unbounded.
        numerator: mean over questions of EM_int − EM_base.
        denominator: mean over questions of EM_Control − EM_base.
        n_questions: questions with an intervened, a baseline and a Control trial.
        method: the method, in words.
        reason: why the share or its interval is not given (None otherwise).
    """

    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    numerator: float | None
    denominator: float | None
    n_questions: int
    method: str
    reason: str | None


RECOVERED_METHOD = "ratio of per-question mean differences; Fieller interval on t(G-1)"


def fieller_quadratic(num: np.ndarray, den: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """Coefficients (a, b, c) of Fieller's set {R : a·R² + b·R + c ≤ 0} for mean(num) / mean(den), on t(G − 1).

    The set is the R with (N̄ − R·D̄)² ≤ t² (s_NN − 2R·s_ND + R²·s_DD) / G, the sample (co)variances s over the G
    questions: the R a t test of mean(num − R·den) = 0 does not reject.

    Args:
        num: (G,) per-question numerators.
        den: (G,) per-question denominators (G ≥ 2).
        alpha: 1 − confidence level.
    """
    n = np.asarray(num, dtype=float)
    d = np.asarray(den, dtype=float)
    G = n.size
    t2 = float(scipy.stats.t.ppf(1 - alpha / 2, G - 1)) ** 2
    cov = np.cov(np.vstack([n, d]), ddof=1)
    nm, dm = float(n.mean()), float(d.mean())
    return (dm * dm - t2 * cov[1, 1] / G, -2 * (nm * dm - t2 * cov[0, 1] / G), nm * nm - t2 * cov[0, 0] / G)


def fieller_interval(num: np.ndarray, den: np.ndarray, alpha: float = 0.05) -> tuple[float, float] | None:
    """Fieller's interval for mean(num) / mean(den) from paired per-question values (:func:`fieller_quadratic`).

    Returns:
        (low, high), or None when the set is unbounded (the whole line, or the line less an interval): the
        denominator's own t test does not reject at ``alpha`` (D̄² ≤ t² s_DD / G).
    """
    qa, qb, qc = fieller_quadratic(num, den, alpha)
    if qa <= 0:
        return None
    r = math.sqrt(max(qb * qb - 4 * qa * qc, 0.0))
    return ((-qb - r) / (2 * qa), (-qb + r) / (2 * qa))


def recovered_share(em_int: np.ndarray, em_base: np.ndarray, em_control: np.ndarray, alpha: float = 0.05,
                    min_clusters: int = inf.MIN_CLUSTERS) -> RecoveredShare:
    """The recovered share from per-question means, with Fieller's interval (module docstring).

    Args:
        em_int: (G,) per-question mean EM under the intervention.
        em_base: (G,) per-question mean EM of the same prompts' baseline trials.
        em_control: (G,) per-question mean baseline Control EM.
        alpha: 1 − confidence level.
        min_clusters: fewer questions: the share is given without an interval.

    Returns:
        The :class:`RecoveredShare`.
    """
    i, b, c = (np.asarray(x, dtype=float) for x in (em_int, em_base, em_control))
    G = int(i.size)
    out = RecoveredShare(None, None, None, None, None, G, RECOVERED_METHOD, None)
    if G == 0:
        return replace(out, reason="no question has an intervened, a baseline and a Control trial")
    num, den = i - b, c - b
    nm, dm = float(num.mean()), float(den.mean())
    out = replace(out, numerator=nm, denominator=dm)
    if dm <= 0:
        return replace(out, reason=f"EM_Control - EM_base = {dm:+.3f} <= 0: the baseline lost nothing to Control, so "
                                   "there is nothing to recover and the share is undefined")
    out = replace(out, estimate=nm / dm)
    if G < min_clusters:
        return replace(out, reason=inf.few_clusters_reason(G, min_clusters))
    resid = num - (nm / dm) * den
    if float(np.max(np.abs(resid))) <= 1e-12 * max(1.0, float(np.max(np.abs(num))), float(np.max(np.abs(den)))):
        return replace(out, reason="every question recovers the same share of its loss (EM_int - EM_base is "
                                   "proportional to EM_Control - EM_base): the questions give no spread to build an "
                                   "interval from, so the share is descriptive only")
    ci = fieller_interval(num, den, alpha)
    if ci is None:
        return replace(out, reason="the loss EM_Control - EM_base is not distinguishable from 0 at this level: "
                                   "the interval of the share is unbounded")
    return replace(out, ci_low=ci[0], ci_high=ci[1])


@dataclass(frozen=True)
class InterventionRow:
    """One model × family × condition × load × intervention against its baseline.

    Attributes:
        model, family, condition, load: the cell.
        intervention: the intervention's name; kind, keys, group, window: from its declaration (None when
            ``interventions.json`` does not declare it).
        diff: EM_int − EM_base, paired by prompt (``em_a`` = EM_int, ``em_b`` = EM_base).
        em_control: the model's baseline Control EM on the same questions (None without Control trials).
        recovered: the recovered share.
    """

    model: str
    family: str
    condition: str
    load: int
    intervention: str
    kind: str | None
    keys: str | None
    group: str | None
    window: tuple[int, int] | None
    diff: PairedDifference
    em_control: float | None
    recovered: RecoveredShare


@dataclass(frozen=True)
class Contrast:
    """Two interventions on the same prompts: EM(a) − EM(b), paired by prompt.

    Attributes:
        kind: ``specific`` (extraneous keys against their matched-random twin) or ``heads`` (top-k heads against
            their random heads).
        model, family, condition, load: the cell.
        a, b: the intervention names.
        test: the paired difference EM(a) − EM(b).
        q: BH q-value within the model's family of ``specific`` contrasts (None for ``heads`` or when descriptive).
        claim: a causal effect is shown: ``specific``, q < alpha, a positive difference and a matched control.
        unmatched: why the control ``b`` is no matched control in this cell (a matched-random draw that found fewer
            tokens than the extraneous segments hold, so it knocked out other content too); None when matched. An
            unmatched contrast is reported but never claimed.
    """

    kind: Literal["specific", "heads"]
    model: str
    family: str
    condition: str
    load: int
    a: str
    b: str
    test: PairedDifference
    q: float | None
    claim: bool
    unmatched: str | None = None


@dataclass(frozen=True)
class SweepPoint:
    """One window of a layer-window sweep.

    Attributes:
        intervention: the member's name.
        window: [first, last] layer; centre: (first + last) / 2.
        diff: its paired difference from the baseline; recovered: its recovered share.
    """

    intervention: str
    window: tuple[int, int]
    centre: float
    diff: PairedDifference
    recovered: RecoveredShare


@dataclass(frozen=True)
class Sweep:
    """A layer-window sweep of one group in one cell: recovery against depth (points by centre)."""

    model: str
    family: str
    condition: str
    load: int
    group: str
    points: tuple[SweepPoint, ...]


@dataclass(frozen=True)
class InterventionResult:
    """Every intervention estimate of a run (``Analysis.interventions``).

    Attributes:
        specs: the declared interventions (``interventions.json``; () when the file is absent).
        rows: one per model × family × condition × load × intervention with trials.
        specific: extraneous-key interventions against their matched-random twins (BH q, claims).
        heads: top-k heads against their random-heads controls.
        sweeps: layer-window sweeps.
        alpha: the level of every test, interval and claim.
        notes: what could not be estimated, in sentences.
    """

    specs: tuple[InterventionSpec, ...]
    rows: tuple[InterventionRow, ...]
    specific: tuple[Contrast, ...]
    heads: tuple[Contrast, ...]
    sweeps: tuple[Sweep, ...]
    alpha: float
    notes: tuple[str, ...]

    def spec(self, name: str) -> InterventionSpec | None:
        """The declaration of intervention ``name`` (None when undeclared)."""
        return next((s for s in self.specs if s.name == name), None)

    def claims(self) -> tuple[Contrast, ...]:
        """The specific contrasts that show a causal effect."""
        return tuple(c for c in self.specific if c.claim)


# ------------------------------------------------------------------------------------------------- assembly


def _scored(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["is_scored"]]


def _pairs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Prompts scored under both: columns prompt_id, task_id, em_a, em_b."""
    return a[["prompt_id", "task_id", "em"]].merge(b[["prompt_id", "em"]], on="prompt_id", suffixes=("_a", "_b"))


def _seed(seed: int, *parts: object) -> int:
    return (seed * 1_000_003 + sum(ord(ch) * (k + 1) for k, ch in enumerate("|".join(map(str, parts))))) % 2**32


def _row(model: str, family: str, condition: str, load: int, name: str, spec: InterventionSpec | None,
         pairs: pd.DataFrame, control: pd.Series, alpha: float, seed: int) -> InterventionRow:
    diff = paired_difference(pairs["em_a"].to_numpy(float), pairs["em_b"].to_numpy(float),
                             pairs["task_id"].to_numpy(), alpha, seed)
    per_q = pairs.groupby("task_id")[["em_a", "em_b"]].mean()
    per_q = per_q.join(control.rename("em_c"), how="inner")
    em_control = float(per_q["em_c"].mean()) if len(per_q) else None
    if control.empty:
        rec = RecoveredShare(None, None, None, None, None, 0, RECOVERED_METHOD,
                             f"no baseline {CONTROL_CONDITION} trial of {model}: EM_Control is unknown")
    else:
        rec = recovered_share(per_q["em_a"].to_numpy(), per_q["em_b"].to_numpy(), per_q["em_c"].to_numpy(), alpha)
    return InterventionRow(model=model, family=family, condition=condition, load=load, intervention=name,
                           kind=spec.kind if spec else None, keys=spec.keys if spec else None,
                           group=spec.group if spec else None, window=spec.window if spec else None, diff=diff,
                           em_control=em_control, recovered=rec)


def _twin(spec: InterventionSpec, specs: Sequence[InterventionSpec]) -> InterventionSpec | None:
    cands = [s for s in specs if s.keys == "matched-random" and s.twin_key() == spec.twin_key()]
    same_group = [s for s in cands if s.group == spec.group]
    cands = same_group or cands
    return sorted(cands, key=lambda s: s.name)[0] if cands else None


def analyze_interventions(data: RunData, specs: Sequence[InterventionSpec], alpha: float = 0.05,
                          seed: int = 0) -> InterventionResult | None:
    """Every intervention estimate of a run's trials (module docstring); None when no trial carries one.

    Args:
        data: the run's trials, baseline and intervened.
        specs: the declared interventions (:func:`load_interventions`).
        alpha: test level, 1 − confidence level and the BH level of a claim.
        seed: seed of the Monte Carlo sign flips (each test offsets it by its own cell and names).

    Returns:
        The :class:`InterventionResult`, or None.
    """
    df = data.frame
    if "intervention" not in df or df["intervention"].isna().all():
        return None
    by_name = {s.name: s for s in specs}
    notes: list[str] = []
    scored = _scored(df)
    base = scored[scored["intervention"].isna()]
    names = sorted(set(df["intervention"].dropna()))
    undeclared = [n for n in names if n not in by_name]
    if undeclared:
        notes.append(f"interventions {', '.join(undeclared)} have trials but no entry in {INTERVENTIONS_FILE}: their "
                     "keys are unknown, so no specific contrast or sweep uses them")
    rows: list[InterventionRow] = []
    specific: list[Contrast] = []
    heads: list[Contrast] = []
    sweeps: list[Sweep] = []
    cells = df[df["intervention"].notna()][["model", "family", "condition", "load"]].drop_duplicates()
    for model, family, condition, load in sorted(cells.itertuples(index=False, name=None)):
        load = int(load)
        in_cell = (scored["model"] == model) & (scored["family"] == family) & (scored["condition"] == condition) \
            & (scored["load"] == load)
        cell = scored[in_cell]
        cell_base = cell[cell["intervention"].isna()]
        ctrl = base[(base["model"] == model) & (base["family"] == family) & (base["condition"] == CONTROL_CONDITION)]
        control = ctrl.groupby("task_id")["em"].mean()
        under = {n: cell[cell["intervention"] == n] for n in names}
        cell_rows: dict[str, InterventionRow] = {}
        for n in names:
            if under[n].empty and not ((df["intervention"] == n) & (df["model"] == model)
                                       & (df["condition"] == condition) & (df["load"] == load)).any():
                continue
            cell_rows[n] = _row(model, family, condition, load, n, by_name.get(n), _pairs(under[n], cell_base),
                                control, alpha, _seed(seed, model, condition, load, n))
        rows += cell_rows.values()

        def contrast(kind: Literal["specific", "heads"], a: str, b: str) -> Contrast:
            p = _pairs(under[a], under[b])
            t = paired_difference(p["em_a"].to_numpy(float), p["em_b"].to_numpy(float), p["task_id"].to_numpy(),
                                  alpha, _seed(seed, model, condition, load, a, b))
            short = under[b]["keys_shortfall"].to_numpy(int) if "keys_shortfall" in under[b] else np.zeros(0, int)
            unmatched = None
            if kind == "specific" and (short > 0).any():
                unmatched = (f"{b} drew fewer random tokens than the extraneous segments hold in {int((short > 0).sum())}"
                             f" of {len(short)} trials (up to {int(short.max())} short), so it also removed germane "
                             "or instruction text: it is no matched control here")
            return Contrast(kind=kind, model=model, family=family, condition=condition, load=load, a=a, b=b, test=t,
                            q=None, claim=False, unmatched=unmatched)

        for n in cell_rows:
            spec = by_name.get(n)
            if spec is None:
                continue
            if spec.keys == "extraneous":
                twin = _twin(spec, specs)
                if twin is None or twin.name not in cell_rows:
                    notes.append(f"{model} {condition} {load}: {n} has no matched-random twin with trials (same kind, "
                                 "alpha, queries, layers, heads, window): its specificity is not tested")
                else:
                    specific.append(contrast("specific", n, twin.name))
            ctl = [s for s in specs if s.selection is not None and s.selection.control_of == n]
            for c in ctl:
                if c.name in cell_rows:
                    heads.append(contrast("heads", n, c.name))
        groups = sorted({by_name[n].group for n in cell_rows if n in by_name and by_name[n].window is not None})
        for grp in groups:
            members = sorted((by_name[n] for n in cell_rows if n in by_name and by_name[n].group == grp
                              and by_name[n].window is not None), key=lambda s: (s.centre, s.name))
            sweeps.append(Sweep(model=model, family=family, condition=condition, load=load, group=grp, points=tuple(
                SweepPoint(intervention=s.name, window=s.window, centre=float(s.centre), diff=cell_rows[s.name].diff,
                           recovered=cell_rows[s.name].recovered)
                for s in members if s.window is not None and s.centre is not None)))
    specific = _with_claims(specific, alpha)
    log.info("interventions: %d rows, %d specific contrasts (%d claims), %d heads contrasts, %d sweeps", len(rows),
             len(specific), sum(c.claim for c in specific), len(heads), len(sweeps))
    return InterventionResult(specs=tuple(specs), rows=tuple(rows), specific=tuple(specific), heads=tuple(heads),
                              sweeps=tuple(sweeps), alpha=alpha, notes=tuple(notes))


def _with_claims(contrasts: list[Contrast], alpha: float) -> list[Contrast]:
    """BH q-values within each model's specific contrasts, and the claims they support."""
    out = list(contrasts)
    for model in sorted({c.model for c in contrasts}):
        idx = [i for i, c in enumerate(contrasts) if c.model == model]
        p = np.array([np.nan if contrasts[i].test.p is None else contrasts[i].test.p for i in idx], dtype=float)
        q = inf.bh_qvalues(p)
        for i, qi in zip(idx, q):
            c = contrasts[i]
            qv = float(qi) if math.isfinite(qi) else None
            claim = bool(qv is not None and qv < alpha and c.test.delta is not None and c.test.delta > 0
                         and c.unmatched is None)
            out[i] = replace(c, q=qv, claim=claim)
    return out


def analyze_run_interventions(run: RunFolder, data: RunData, alpha: float, seed: int) -> InterventionResult | None:
    """:func:`analyze_interventions` of a run folder's trials with its ``interventions.json``."""
    return analyze_interventions(data, load_interventions(run), alpha, seed)


# ------------------------------------------------------------------------------------------------- coverage


@dataclass(frozen=True)
class ShareCoverageRow:
    """Simulated coverage of the recovered share's interval at one number of questions.

    Attributes:
        n_questions: G.
        n_runs: simulated studies.
        true_share: the share the simulation plants.
        method: ``fieller`` (the analysis' interval) or ``delta`` (the delta-method interval R ± t·SE on t(G − 1),
            SE = sd(num − R·den) / (√G·|mean den|), for comparison).
        coverage: among the studies where the share is defined, the share whose interval (for Fieller: the
            confidence set, bounded or not) holds the true share.
        bounded: among those, the share with a bounded Fieller interval (the loss distinguishable from 0).
        coverage_bounded: coverage among the bounded intervals.
        undefined: share of all studies where the share was undefined (EM_Control ≤ EM_base).
    """

    n_questions: int
    n_runs: int
    true_share: float
    method: str
    coverage: float
    bounded: float
    coverage_bounded: float | None
    undefined: float


def recovered_share_coverage(seed: int, n_questions: int, n_runs: int, replications: int = 2,
                             em_control: float = 0.8, em_base: float = 0.4, share: float = 0.5,
                             kappa: float = 2.0, alpha: float = 0.05,
                             method: Literal["fieller", "delta"] = "fieller") -> ShareCoverageRow:
    """Coverage of the recovered share's Fieller interval by seeded simulation.

    Data: question q has Control success probability c_q ~ Beta(μ_C κ, (1 − μ_C) κ), a loss under the distractors
    ℓ_q = c_q·(1 − em_base / em_control) (so E base = em_base), and under the intervention it gets back ``share``
    of its loss: p_int,q = c_q − (1 − share)·ℓ_q; each of its ``replications`` prompts is Bernoulli(p) at Control,
    baseline and (the same prompt) intervention, the baseline and intervened trials of a prompt sharing one uniform
    draw (a paired design, as one model answering the same prompt). The planted share is ``share`` for every
    question; the estimate is a ratio of means, which equals it in expectation of numerator and denominator.

    Args:
        seed: seed (the generator is ``default_rng([seed, n_questions])``).
        n_questions: G.
        n_runs: simulated studies.
        replications: prompts per question and condition.
        em_control, em_base, share: the planted means.
        kappa: Beta concentration (intra-question correlation 1 / (κ + 1)).
        alpha: 1 − confidence level.
        method: ``fieller`` or ``delta`` (see :class:`ShareCoverageRow`).

    Returns:
        The :class:`ShareCoverageRow`.
    """
    rng = np.random.default_rng([seed, n_questions])
    covered = bounded = cov_b = undefined = 0
    for _ in range(n_runs):
        c = rng.beta(em_control * kappa, (1 - em_control) * kappa, n_questions)
        loss = c * (1 - em_base / em_control)
        p_base, p_int = c - loss, c - (1 - share) * loss
        u = rng.random((n_questions, replications))
        yb, yi = (u < p_base[:, None]).mean(1), (u < p_int[:, None]).mean(1)
        yc = (rng.random((n_questions, replications)) < c[:, None]).mean(1)
        r = recovered_share(yi, yb, yc, alpha)
        if r.estimate is None:
            undefined += 1
            continue
        qa, qb, qc = fieller_quadratic(yi - yb, yc - yb, alpha)
        if method == "delta":
            z = (yi - yb) - r.estimate * (yc - yb)
            half = float(scipy.stats.t.ppf(1 - alpha / 2, n_questions - 1)) * float(np.std(z, ddof=1)) / (
                math.sqrt(n_questions) * abs(r.denominator or 0.0))
            hit = abs(r.estimate - share) <= half
        else:
            hit = qa * share**2 + qb * share + qc <= 0  # the truth is in Fieller's set, bounded or not
        covered += hit
        if r.ci_low is not None:
            bounded += 1
            cov_b += hit
    defined = n_runs - undefined
    return ShareCoverageRow(n_questions=n_questions, n_runs=n_runs, true_share=share, method=method,
                            coverage=covered / defined if defined else float("nan"),
                            bounded=bounded / defined if defined else float("nan"),
                            coverage_bounded=cov_b / bounded if bounded else None,
                            undefined=undefined / n_runs)


__all__ = ["Contrast", "HeadSelection", "INTERVENTIONS_FILE", "InterventionResult", "InterventionRow",
           "InterventionSpec", "InterventionsFileError", "METHODS", "PairedDifference", "RecoveredShare",
           "ShareCoverageRow", "Sweep", "SweepPoint", "analyze_interventions", "analyze_run_interventions",
           "baseline_only", "fieller_interval", "fieller_quadratic", "load_interventions", "paired_difference",
           "recovered_share", "recovered_share_coverage"]
