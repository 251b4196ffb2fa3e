"""Small HTML builders for a self-contained report page (inline CSS, figures as base64 PNG)."""

from __future__ import annotations

import base64
import functools
import html
import io
from typing import Callable, ParamSpec, TypeVar

import matplotlib
from matplotlib.figure import Figure

P = ParamSpec("P")
T = TypeVar("T")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:right;vertical-align:top}th{background:#f3f3f3}td.l,th.l{text-align:left}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.note{color:#555;font-size:.88em}.sig{font-weight:600}code{background:#f5f5f5;padding:0 3px}
td.l:first-child{white-space:nowrap}.tw{overflow-x:auto;max-width:100%}
"""


def esc(x: object) -> str:
    """HTML-escaped text of a value (None -> an em dash)."""
    return "—" if x is None else html.escape(str(x))


def plain_figure_text(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` with matplotlib's mathtext off: every text a figure shows (a model name from a run folder,
    ``$\\foo$``) is drawn as written, never parsed as TeX (an unknown command would end the report)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with matplotlib.rc_context({"text.parse_math": False}):
            return function(*args, **kwargs)

    return wrapper


def fig_png(fig: Figure, dpi: int = 110) -> bytes:
    """PNG bytes of a figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_block(png: bytes, caption: str, alt: str) -> str:
    """A <figure> with the PNG embedded as a data URI."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def table(header: list[str], rows: list[list[str]], left: int = 1, text: tuple[int, ...] = ()) -> str:
    """An HTML table; the first ``left`` columns and the columns ``text`` (sentences) are left-aligned. Cells are
    inserted as given (escape first). A table wider than the page scrolls sideways in its own box, so the page
    keeps its width and the text around the table stays in view."""
    def cls(i: int) -> str:
        return ' class="l"' if i < left or i in text else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def page(title: str, body: str) -> str:
    """A complete HTML document."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>")
