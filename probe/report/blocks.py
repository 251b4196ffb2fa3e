"""What a report section says, as typed blocks (a heading, a note, a list, a table, a plot) that one renderer writes
as HTML (``report.html``, a ``probe compare`` page) and as Markdown (``analysis.md``, a results page), and the one
merge of several runs' results (docs/architecture.md#extending-the-toolkit)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from matplotlib.figure import Figure as MplFigure

from probe.config import AnalysisSection
from probe.report.html import esc, fig_png, figure_block, table
from probe.runfolder import write_atomic

T = TypeVar("T")


class ReportContext:
    """What rendering a section's blocks as HTML uses: the ``[analysis]`` settings, and where figures go.

    Args:
        settings: the ``[analysis]`` gates of the analysis.
        figures_dir: where :meth:`figure` writes PNGs; None draws nothing to disk (HTML only).
    """

    def __init__(self, settings: AnalysisSection, figures_dir: Path | None = None) -> None:
        self.settings = settings
        self.figures_dir = figures_dir
        self.drawn: list[tuple[Path, str]] = []  # (file, caption) of each figure written, in order

    @property
    def written(self) -> list[Path]:
        """The figure files written so far, in order."""
        return [path for path, _ in self.drawn]

    def figure(self, stem: str, caption: str, fig: MplFigure | None) -> str:
        """Write ``figures/<stem>.png`` and return its ``<figure>`` block (embedded PNG); "" when ``fig`` is None."""
        if fig is None:
            return ""
        png = fig_png(fig)
        if self.figures_dir is not None:
            path = write_atomic(self.figures_dir / f"{stem}.png", png, root=self.figures_dir.parent)
            self.drawn.append((path, caption))
        return figure_block(png, caption, stem)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; ``|``, ``<`` and ``>`` in a cell are escaped (a model or condition name from a run folder
    cannot break the table or put HTML on the page)."""
    out = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def md_text(text: str) -> str:
    """Markdown prose (a heading, a note, a list item) with every ``<`` that would open a tag written ``&lt;`` (a
    name from a run folder cannot put HTML on the page)."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def md_cell(text: str) -> str:
    """One Markdown table cell's text: ``|`` escaped, a ``<`` that would open a tag (``<b``, ``</``, ``<!``) as
    ``&lt;`` (``<=`` and ``p < 0.05`` stay as written), line breaks as spaces."""
    return md_text(str(text).replace("\\|", "|").replace("|", "\\|").replace("\r", " ").replace("\n", " "))


@dataclass(frozen=True)
class Text:
    """A cell (or header) whose value has a note under it, or is marked ``strong`` (a p- or q-value below alpha)."""

    text: str
    note: str = ""
    strong: bool = False


Cell = str | Text


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Note:
    """A paragraph that explains what is around it (a legend, a method, why something is absent)."""

    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    title: str = ""  # a third-level heading above the list (a model's name)


@dataclass(frozen=True)
class Table:
    """Rows of cells; the first ``left`` columns and the ``text`` columns (sentences) are left-aligned in HTML."""

    header: tuple[Cell, ...]
    rows: tuple[tuple[Cell, ...], ...]
    left: int = 1
    text: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plot:
    """A figure drawn only where it is shown (``report.html``): ``draw`` returns None where there is nothing to
    draw, and the figure is then left out."""

    stem: str
    caption: str
    draw: Callable[[], MplFigure | None]


Block = Heading | Note | Bullets | Table | Plot


def table_of(header: Sequence[Cell], rows: Sequence[Sequence[Cell]], left: int = 1,
             text: tuple[int, ...] = ()) -> Table:
    """A :class:`Table` from lists."""
    return Table(tuple(header), tuple(tuple(r) for r in rows), left, text)


def _cell_html(c: Cell) -> str:
    if isinstance(c, str):
        return esc(c)
    body = esc(c.text) + (f'<br><span class="note">{esc(c.note)}</span>' if c.note else "")
    return f'<span class="sig">{body}</span>' if c.strong else body


def _cell_md(c: Cell) -> str:
    if isinstance(c, str):
        return c
    body = f"**{c.text}**" if c.strong and c.text else c.text
    return f"{body} ({c.note})" if c.note else body


def to_html(blocks: Sequence[Block], ctx: ReportContext) -> str:
    """The blocks as HTML; each figure drawn and written through ``ctx.figure``."""
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{esc(b.text)}</h{b.level}>")
        elif isinstance(b, Note):
            out.append(f'<p class="note">{esc(b.text)}</p>')
        elif isinstance(b, Bullets):
            out.append((f"<h3>{esc(b.title)}</h3>" if b.title else "")
                       + "<ul>" + "".join(f"<li>{esc(s)}</li>" for s in b.items) + "</ul>")
        elif isinstance(b, Table):
            out.append(table([_cell_html(h) for h in b.header], [[_cell_html(c) for c in r] for r in b.rows],
                             left=b.left, text=b.text))
        else:
            out.append(ctx.figure(b.stem, b.caption, b.draw()))
    return "".join(out)


def to_markdown(blocks: Sequence[Block]) -> list[str]:
    """The blocks as Markdown lines (plots are left out: ``analysis.md`` is written before any is drawn; so is a
    heading over plots alone)."""
    out: list[str] = []
    shown = [b for b in blocks if not isinstance(b, Plot)]
    for i, b in enumerate(shown):
        if isinstance(b, Heading):
            after = shown[i + 1] if i + 1 < len(shown) else None
            if after is None or isinstance(after, Heading) and after.level <= b.level:
                continue
            out += ["#" * b.level + " " + md_text(b.text), ""]
        elif isinstance(b, Note):
            out += [md_text(b.text), ""]
        elif isinstance(b, Bullets):
            out += ([f"### {md_text(b.title)}", ""] if b.title else []) + [f"- {md_text(s)}" for s in b.items] + [""]
        elif isinstance(b, Table):
            out += [md_table([_cell_md(h) for h in b.header], [[_cell_md(c) for c in r] for r in b.rows]), ""]
    return out


# --------------------------------------------------------------------------------------------------- merge


def _models_in(value: Any, found: set[str]) -> None:
    """Every model name a result holds: its ``model`` fields, its ``models`` entries (a tuple or a dict's keys)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "model" and isinstance(v, str):
                found.add(v)
            elif f.name == "models" and isinstance(v, (tuple, dict)):
                found.update(str(m) for m in v)
            else:
                _models_in(v, found)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _models_in(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _models_in(v, found)


def _renamed(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every model name in it replaced by ``names[model]`` (fields, tuples, dict keys)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            new = names.get(v, v) if f.name == "model" and isinstance(v, str) else _renamed(v, names)
            if new is not v:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple):
        items = tuple(names.get(v, v) if isinstance(v, str) else _renamed(v, names) for v in value)
        return items if any(a is not b for a, b in zip(items, value)) else value
    if isinstance(value, dict):
        return {names.get(k, k) if isinstance(k, str) else k: _renamed(v, names) for k, v in value.items()}
    return value


def _empty(value: Any) -> bool:
    """A part that reports nothing: every field of rows (a tuple of results, a dict) empty; a tuple of names (a hop
    tracking's categories) is not a row (a hop tracking that could not run keeps them)."""
    rows = [p for f in dataclasses.fields(value) if isinstance(p := getattr(value, f.name), (tuple, dict))
            and not (isinstance(p, tuple) and p and all(isinstance(x, str) for x in p))]
    return bool(rows) and all(len(p) == 0 for p in rows)


def _joined(values: list[Any]) -> Any:
    """Several runs' values of one field, joined: tuples concatenated (an entry without a model, such as an
    intervention's declaration, once), dicts united, parts joined field by field (leaving out the runs whose part
    reports nothing), and any other value the first run's (a count marked ``merge = "sum"`` summed)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, tuple):
        out: list[Any] = []
        for v in present:
            out += [x for x in v if getattr(x, "model", None) is not None or x not in out]
        return tuple(out)
    if isinstance(first, dict):
        return {k: x for v in present for k, x in v.items()}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        parts = [v for v in present if not _empty(v)] or present[:1]
        changes = {}
        for f in dataclasses.fields(first):
            got = [getattr(v, f.name) for v in parts]
            changes[f.name] = sum(got) if f.metadata.get("merge") == "sum" else _joined(got)
        return dataclasses.replace(first, **changes)
    return first


def merge_results(named: Sequence[tuple[str, T]]) -> T:
    """Several runs' results of one family as one, every model renamed ``<run>: <model>``, every row kept (the
    report of a ``probe compare`` page and a results page of several runs)."""
    renamed = []
    for label, result in named:
        found: set[str] = set()
        _models_in(result, found)
        renamed.append(_renamed(result, {m: f"{label}: {m}" for m in found}))
    joined: T = _joined(renamed)
    return joined


__all__ = ["Block", "Bullets", "Cell", "Heading", "Note", "Plot", "ReportContext", "Table", "Text", "md_cell",
           "md_table", "md_text", "merge_results", "table_of", "to_html", "to_markdown"]
