"""Causal tests: EM under an intervention against the baseline trial of the same prompt, the recovered share, the
specific contrast against a matched control, layer-window sweeps and top-k heads against random heads. Specified in
docs/statistics.md#interventions-paired-differences-and-the-recovered-share."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Sequence, cast

import numpy as np
import pandas as pd

from probe.analysis import inference as inf
from probe.analysis.frame import RunRecords, probe_records
from probe.analysis.paired_ratio import PairedDifference, RecoveredShare, paired_difference, recovered_share
from probe.attention.result import SegmentAttention
from probe.codec import OMIT
from probe.interventions import MATCHED_DRAWS, Intervention, load_interventions
from probe.runfolder import INTERVENTIONS, RunFolder

log = logging.getLogger(__name__)

CONTROL_CONDITION = "Control"

METHODS = {
    "intervention paired difference": "EM under the intervention minus EM of the baseline trial of the same prompt; "
                                      "mean of per-question mean differences; question-level sign-flip test (exact "
                                      "to 16 questions), CR2 t interval (Bell-McCaffrey df)",
    "recovered share": "(EM_int - EM_base) / (EM_Control - EM_base) from per-question means; Fieller interval on "
                       "t(G-1); undefined where EM_Control <= EM_base",
    "specific contrast": "EM(intervention) - EM(its matched control: extraneous vs matched-random keys, germane vs "
                         "matched-germane keys, germane vs filler re-injection), paired by prompt, sign-flip test; "
                         "BH q-values across a model's specific contrasts; a causal effect is claimed only where "
                         "q < alpha and the contrast is positive",
}


def baseline_only(data: RunRecords) -> RunRecords:
    """The run's baseline trials (intervention None) only: what every estimate but this module's reads."""
    keep = data.frame["intervention"].isna().to_numpy()
    if keep.all():
        return data
    return replace(data, frame=data.frame[keep], trials=tuple(t for t, k in zip(data.trials, keep) if k))


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
        kind: ``specific`` (an intervention against its matched control) or ``heads`` (top-k heads against
            their random heads).
        model, family, condition, load: the cell.
        a, b: the intervention names.
        test: the paired difference EM(a) − EM(b).
        q: BH q-value within the model's family of ``specific`` contrasts (None for ``heads`` or when descriptive).
        claim: a causal effect is shown: ``specific``, q < alpha, a positive difference, a matched control, and
            ``a`` alone raises EM over the baseline (``a_alone`` positive with p < alpha).
        unmatched: why the control ``b`` is no matched control in this cell (a matched draw that found fewer
            tokens than the extraneous segments hold, so it knocked out other content too); None when matched. An
            unmatched contrast is reported but never claimed.
        a_alone: ``a``'s own paired difference against the baseline trials of the same prompts (None in files
            written before it was recorded).
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
    a_alone: PairedDifference | None = None


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
class MovedMass:
    """The manipulation check of one attention edit in one cell (docs/interventions.md#the-manipulation-check): the
    answer rows' attention mass on one kind of prompt segment under the edit against the same prompts' baseline, or
    an edit's moved mass on its own keys' kinds against its matched control's.

    Attributes:
        model, condition, load: the cell; intervention: the edit's name, or ``"<a> − <b>"`` for the contrast of an
            edit with its matched control.
        kind: the segment kind (``germane``, ``filler``, ``extraneous``), or ``"keys"`` in a contrast row (each
            edit's mass on the kinds its keys are drawn from).
        target: the edit's keys lie in segments of this kind (a matched draw's: a lower bound, see the docs).
        base, under: mean over questions of the baseline's mass and of the mass under the edit (a contrast row: the
            moved mass of ``a`` and of ``b``).
        diff: ``under − base`` per prompt, its mean over questions, sign-flip test and CR2 interval.
    """

    model: str
    condition: str
    load: int
    intervention: str
    kind: str
    target: bool
    base: float | None
    under: float | None
    diff: PairedDifference


@dataclass(frozen=True)
class InterventionResult:
    """Every intervention estimate of a run (``Analysis.interventions``).

    Attributes:
        specs: the declared interventions (``interventions.json``; () when the file is absent).
        rows: one per model × family × condition × load × intervention with trials.
        specific: interventions against their matched controls (BH q, claims).
        heads: top-k heads against their random-heads controls.
        sweeps: layer-window sweeps.
        alpha: the level of every test, interval and claim.
        notes: what could not be estimated, in sentences.
        moved: the manipulation checks of the attention edits whose trials were probed (empty otherwise).
    """

    specs: tuple[Intervention, ...]
    rows: tuple[InterventionRow, ...]
    specific: tuple[Contrast, ...]
    heads: tuple[Contrast, ...]
    sweeps: tuple[Sweep, ...]
    alpha: float
    notes: tuple[str, ...]
    moved: tuple[MovedMass, ...] = field(default=(), metadata={OMIT: True})

    def spec(self, name: str, model: str | None = None) -> Intervention | None:
        """The declaration of intervention ``name`` (for ``model`` when given; None when undeclared)."""
        return next((s for s in self.specs if s.name == name and (model is None or s.model in (None, model))), None)

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


def _twin(spec: Intervention, specs: Sequence[Intervention]) -> Intervention | None:
    """The matched control of ``spec``: the intervention with its control keys and everything else equal."""
    cands = [s for s in specs if s.keys == spec.control_keys and s.twin_key() == spec.twin_key()]
    same_group = [s for s in cands if s.group == spec.group]
    cands = same_group or cands
    return sorted(cands, key=lambda s: s.name)[0] if cands else None


@dataclass
class _CellTests:
    """The tests of one (model, family, condition, load) cell: each intervention against the cell's baseline, the
    specific and heads contrasts, and the layer-window sweeps."""

    model: str
    family: str
    condition: str
    load: int
    mine: list[Intervention]  # the model's own entries (its own heads, layers)
    under: dict[str, pd.DataFrame]  # the cell's scored trials under each intervention name
    alpha: float
    seed: int
    rows: dict[str, InterventionRow] = field(default_factory=dict)
    by_name: dict[str, Intervention] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.mine}

    def seed_of(self, *names: str) -> int:
        return _seed(self.seed, self.model, self.condition, self.load, *names)

    def add_row(self, name: str, base: pd.DataFrame, control: pd.Series) -> None:
        """The row of intervention ``name``: its paired difference from the baseline and its recovered share."""
        spec = self.by_name.get(name)
        pairs = _pairs(self.under[name], base)
        diff = paired_difference(pairs["em_a"].to_numpy(float), pairs["em_b"].to_numpy(float),
                                 pairs["task_id"].to_numpy(), self.alpha, self.seed_of(name))
        per_q = pairs.groupby("task_id")[["em_a", "em_b"]].mean().join(control.rename("em_c"), how="inner")
        if control.empty:
            rec = RecoveredShare.undefined(
                0, f"no baseline {CONTROL_CONDITION} trial of {self.model}: EM_Control is unknown")
        else:
            rec = recovered_share(per_q["em_a"].to_numpy(), per_q["em_b"].to_numpy(), per_q["em_c"].to_numpy(),
                                  self.alpha, seed=self.seed_of(name))
        self.rows[name] = InterventionRow(
            model=self.model, family=self.family, condition=self.condition, load=self.load, intervention=name,
            kind=spec.kind if spec else None, keys=spec.keys if spec else None, group=spec.group if spec else None,
            window=spec.window if spec else None, diff=diff,
            em_control=float(per_q["em_c"].mean()) if len(per_q) else None, recovered=rec)

    def contrast(self, kind: Literal["specific", "heads"], a: str, b: str) -> Contrast:
        """Intervention ``a`` against ``b`` on the same prompts (``b`` its matched control or random heads)."""
        p = _pairs(self.under[a], self.under[b])
        t = paired_difference(p["em_a"].to_numpy(float), p["em_b"].to_numpy(float), p["task_id"].to_numpy(),
                              self.alpha, self.seed_of(a, b))
        under_b = self.under[b]
        short = under_b["keys_shortfall"].to_numpy(int) if "keys_shortfall" in under_b else np.zeros(0, int)
        unmatched = None
        if kind == "specific" and (short > 0).any():
            unmatched = (f"{b} drew fewer random tokens than {a}'s keys hold in {int((short > 0).sum())} of "
                         f"{len(short)} trials (up to {int(short.max())} short), so it also edited other text: it "
                         "is no matched control here")
        return Contrast(kind=kind, model=self.model, family=self.family, condition=self.condition, load=self.load,
                        a=a, b=b, test=t, q=None, claim=False, unmatched=unmatched, a_alone=self.rows[a].diff)

    def contrasts(self, notes: list[str]) -> tuple[list[Contrast], list[Contrast]]:
        """(specific, heads) contrasts of the cell's interventions; a note for each one without a matched control."""
        specific: list[Contrast] = []
        heads: list[Contrast] = []
        for n in self.rows:
            spec = self.by_name.get(n)
            if spec is None:
                continue
            if spec.control_keys is not None:
                twin = _twin(spec, self.mine)
                if twin is None or twin.name not in self.rows:
                    notes.append(f"{self.model} {self.condition} {self.load}: {n} has no matched control with trials "
                                 f"(keys {spec.control_keys!r}; same kind, alpha, queries, layers, heads, window): "
                                 "its specificity is not tested")
                else:
                    specific.append(self.contrast("specific", n, twin.name))
            heads += [self.contrast("heads", n, c.name) for c in self.mine
                      if c.selection is not None and c.selection.control_of == n and c.name in self.rows]
        return specific, heads

    def sweeps(self) -> list[Sweep]:
        """One sweep per layer-window group with trials in the cell, its members in order of centre layer."""
        windowed = [s for s in self.by_name.values() if s.name in self.rows and s.window is not None]
        out = []
        for grp in sorted({s.group for s in windowed}):
            members = sorted((s for s in windowed if s.group == grp), key=lambda s: (s.centre, s.name))
            out.append(Sweep(model=self.model, family=self.family, condition=self.condition, load=self.load,
                             group=grp, points=tuple(
                SweepPoint(intervention=s.name, window=s.window, centre=float(s.centre), diff=self.rows[s.name].diff,
                           recovered=self.rows[s.name].recovered)
                for s in members if s.window is not None and s.centre is not None)))
        return out


def analyze_interventions(data: RunRecords, specs: Sequence[Intervention], alpha: float = 0.05,
                          seed: int = 0) -> InterventionResult | None:
    """Every intervention estimate of a run's trials (docs/statistics.md#interventions-paired-differences-and-the-recovered-share); None when no trial carries one.

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
    notes: list[str] = []
    scored = _scored(df)
    base = scored[scored["intervention"].isna()]
    names = sorted(set(df["intervention"].dropna()))
    undeclared = [n for n in names if n not in {s.name for s in specs}]
    if undeclared:
        notes.append(f"interventions {', '.join(undeclared)} have trials but no entry in {INTERVENTIONS}: their "
                     "keys are unknown, so no specific contrast or sweep uses them")
    rows: list[InterventionRow] = []
    specific: list[Contrast] = []
    heads: list[Contrast] = []
    sweeps: list[Sweep] = []
    cells = df[df["intervention"].notna()][["model", "family", "condition", "load"]].drop_duplicates()
    for model, family, condition, load in sorted(cells.itertuples(index=False, name=None)):
        load = int(load)
        cell = scored[(scored["model"] == model) & (scored["family"] == family) & (scored["condition"] == condition)
                      & (scored["load"] == load)]
        ctrl = base[(base["model"] == model) & (base["family"] == family) & (base["condition"] == CONTROL_CONDITION)]
        tests = _CellTests(model, family, condition, load, [s for s in specs if s.model in (None, model)],
                           {n: cell[cell["intervention"] == n] for n in names}, alpha, seed)
        ran = df[(df["model"] == model) & (df["condition"] == condition) & (df["load"] == load)]["intervention"]
        cell_base, control = cell[cell["intervention"].isna()], ctrl.groupby("task_id")["em"].mean()
        for n in names:
            if not tests.under[n].empty or (ran == n).any():
                tests.add_row(n, cell_base, control)
        rows += tests.rows.values()
        cell_specific, cell_heads = tests.contrasts(notes)
        specific += cell_specific
        heads += cell_heads
        sweeps += tests.sweeps()
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
        p = np.array([np.nan if (pi := contrasts[i].test.estimate.p) is None else pi for i in idx], dtype=float)
        q = inf.bh_qvalues(p)
        for i, qi in zip(idx, q):
            c = contrasts[i]
            qv = float(qi) if math.isfinite(qi) else None
            delta = c.test.estimate.value
            alone = c.a_alone.estimate if c.a_alone is not None else None
            helps = bool(alone is not None and alone.p is not None and alone.p < alpha and alone.value is not None
                         and alone.value > 0)
            claim = bool(qv is not None and qv < alpha and delta is not None and delta > 0 and c.unmatched is None
                         and helps)
            out[i] = replace(c, q=qv, claim=claim)
    return out


# the segment kinds whose mass the manipulation check reports
CHECK_KINDS = ("germane", "filler", "extraneous")


def _key_kinds(spec: Intervention) -> tuple[str, ...]:
    """The segment kinds an edit's keys lie in."""
    return MATCHED_DRAWS[spec.keys][1] if spec.keys in MATCHED_DRAWS else (spec.keys,)


def _answer_masses(record: SegmentAttention) -> dict[str, float] | None:
    """The answer rows' attention mass on each kind of :data:`CHECK_KINDS` the prompt has: the sum over its segments,
    averaged over answer tokens, layers and heads (layers without attention, NaN, left out); None without an answer
    capture or answer tokens."""
    a = record.answer
    if a is None or a.mass.shape[0] == 0:
        return None
    kinds = np.array(a.segment_kinds)
    return {k: float(np.nanmean(a.mass[..., :-1][..., kinds == k].sum(-1))) for k in CHECK_KINDS if (kinds == k).any()}


def moved_mass(run: RunFolder, data: RunRecords, specs: Sequence[Intervention], alpha: float = 0.05,
               seed: int = 0) -> list[MovedMass]:
    """The manipulation check of every attention edit whose trials were probed with the answer capture: per cell,
    edit and segment kind, the mass under the edit minus the baseline's on the same prompt; and each edit with a
    matched control, its moved mass on its keys' kinds minus the control's on the control's
    (docs/interventions.md#the-manipulation-check). Records are read through :func:`probe_records`, which holds each
    to its prompt."""
    by_name = {s.name: s for s in specs}
    edits = [t for t in data.trials if t.intervention is not None and t.intervention in by_name
             and by_name[t.intervention].kind in ("knockout", "steer")]
    if not edits:
        return []

    def masses(keys: Iterable[tuple[str, str]], name: str | None) -> dict[tuple[str, str], dict[str, float]]:
        return {key: m for key, sa in probe_records(run, keys, data.prompts, name)
                if (m := _answer_masses(sa)) is not None}

    base = masses([(t.model, t.prompt_id) for t in edits], None)
    under_all = {name: masses([(t.model, t.prompt_id) for t in edits if t.intervention == name], name)
                 for name in dict.fromkeys(str(t.intervention) for t in edits)}
    rows: list[dict] = []
    for t in edits:
        key = (t.model, t.prompt_id)
        under = under_all[str(t.intervention)].get(key)
        if under is None or key not in base:
            continue
        for k in under.keys() & base[key].keys():
            rows.append({"model": t.model, "condition": t.condition, "load": int(t.load or 0), "task_id": t.task_id,
                         "prompt_id": t.prompt_id, "intervention": t.intervention, "kind": k, "base": base[key][k],
                         "under": under[k]})
    if not rows:
        return []
    df = pd.DataFrame(rows)
    out: list[MovedMass] = []
    for cell, g in df.groupby(["model", "condition", "load", "intervention"], sort=True):
        model, condition, load_, name = cast(tuple[str, str, int, str], cell)
        load = int(load_)
        spec = by_name[name]
        for kind in [k for k in CHECK_KINDS if (g["kind"] == k).any()]:
            x = g[g["kind"] == kind]
            d = paired_difference(x["under"].to_numpy(), x["base"].to_numpy(), x["task_id"].to_numpy(), alpha,
                                  _seed(seed, model, condition, load, name, kind))
            out.append(MovedMass(model, condition, load, name, kind, kind in _key_kinds(spec), base=d.em_b,
                                 under=d.em_a, diff=d))
        twin = _twin(spec, specs)
        if twin is None or twin.name not in set(df["intervention"]):
            continue
        moved = {}
        for s in (spec, twin):  # per prompt: the edit's moved mass summed over its keys' kinds
            x = df[(df["model"] == model) & (df["condition"] == condition) & (df["load"] == load)
                   & (df["intervention"] == s.name) & df["kind"].isin(_key_kinds(s))]
            moved[s.name] = (x.assign(moved=x["under"] - x["base"]).groupby(["prompt_id", "task_id"])["moved"].sum())
        both = pd.concat(moved, axis=1, join="inner").reset_index()
        if both.empty:
            continue
        d = paired_difference(both[spec.name].to_numpy(), both[twin.name].to_numpy(), both["task_id"].to_numpy(),
                              alpha, _seed(seed, model, condition, load, spec.name, twin.name))
        out.append(MovedMass(model, condition, load, f"{spec.name} − {twin.name}", "keys", True, d.em_a,
                             d.em_b, d))
    return out


def analyze_run_interventions(run: RunFolder, data: RunRecords, alpha: float, seed: int) -> InterventionResult | None:
    """:func:`analyze_interventions` of a run folder's trials with its ``interventions.json``, with the manipulation
    checks of its probed attention edits."""
    specs = load_interventions(run)
    result = analyze_interventions(data, specs, alpha, seed)
    if result is None:
        return None
    return replace(result, moved=tuple(moved_mass(run, data, specs, alpha, seed)))


__all__ = ["Contrast", "InterventionResult", "InterventionRow", "METHODS", "MovedMass", "Sweep", "SweepPoint",
           "analyze_interventions", "analyze_run_interventions", "baseline_only", "moved_mass"]
