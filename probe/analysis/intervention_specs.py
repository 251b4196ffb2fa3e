"""The interventions a run folder declares: ``interventions.json`` (read by
:func:`probe.interventions.read_interventions`) turned into one :class:`InterventionSpec` per entry, each field
checked with the file, the entry and the field named.

The analysis of the intervened trials is :mod:`probe.analysis.interventions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.config import INTERVENTION_KEYS
from probe.interventions import InterventionsFileError, read_interventions
from probe.runfolder import INTERVENTIONS, RunFolder

INTERVENTIONS_FILE = INTERVENTIONS  # the run folder's file name (probe.runfolder)
KEYS = INTERVENTION_KEYS  # declared once, with the [[interventions]] section (probe.config)


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


__all__ = ["HeadSelection", "INTERVENTIONS_FILE", "InterventionSpec", "KEYS", "load_interventions"]
