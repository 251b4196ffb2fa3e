"""One prompt's attention as a self-contained HTML page (``probe show``; docs/probes.md#seeing-one-prompt)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from probe.prompt_view import PromptView
from probe.runfolder import write_atomic

# Segment kinds: border and chip colours (shading is blue, so no kind is drawn in blue).
KIND_COLOURS: dict[str, str] = {
    "instruction": "#8c8c8c",
    "germane": "#1b9e77",
    "extraneous": "#d95f02",
    "filler": "#7570b3",
    "question": "#c51b7d",
    "sink": "#bdbdbd",
    "generated": "#666666",
}
SHADE_RGB = (31, 119, 180)  # the attention shade; opacity ∝ √(mass / max non-sink mass)

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:1.2em 1.6em;color:#222;
line-height:1.45;background:#fff}
h1{font-size:1.25em;margin:0 0 .3em;word-break:break-all}h2{font-size:1.02em;margin:1.1em 0 .4em}
.meta{color:#444;font-size:.92em;margin:.15em 0}.meta b{color:#222}.note{color:#666;font-size:.85em}
.warn{color:#8a4b00}
.grid{display:grid;grid-template-columns:minmax(0,1fr) 440px;gap:1.6em;align-items:start;margin-top:1em}
aside h2:first-child{margin-top:0}
aside{position:sticky;top:.6em;max-height:calc(100vh - 1.2em);overflow-y:auto;overflow-x:hidden;font-size:.88em}
.seg{border-left:5px solid #ccc;margin:0 0 .45em;padding:.15em .5em .3em .6em;background:#fcfcfc}
.seg.sep{margin:-.2em 0 .25em;padding:0 .5em 0 .6em;background:none;border-left-width:2px;line-height:1.1}
.seghead{font-size:.78em;color:#555;margin-bottom:.15em}
.chip{display:inline-block;color:#fff;border-radius:3px;padding:0 .45em;font-weight:600;margin-right:.4em}
.segtext{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:.9em;white-space:pre-wrap;
word-break:break-word;line-height:1.75}
.t{border-radius:2px;padding:1px 0}
.t.q{outline:1.5px dashed #111;outline-offset:-1px}
.t.sink{color:#888}.t.dark{color:#fff}
.nl{color:#999}
table{border-collapse:collapse;width:100%;margin:.3em 0}th,td{border-bottom:1px solid #e3e3e3;padding:2px 5px;
text-align:right;vertical-align:middle}th{background:#f3f3f3;font-weight:600}td.l,th.l{text-align:left}
td.l:first-child{white-space:nowrap}
td a{color:inherit;text-decoration:none}td a:hover{text-decoration:underline}
.bar{display:inline-block;height:.7em;background:rgb(31,119,180);vertical-align:middle}
.legend .scale{display:flex;flex-wrap:wrap;gap:.2em .8em}.legend .scale span{white-space:nowrap}
.legend span.sw{display:inline-block;width:2.2em;height:1.1em;vertical-align:middle;border:1px solid #ddd;
margin-right:.25em}
.legend div{margin:.25em 0}
.trial{border:1px solid #e3e3e3;border-radius:4px;padding:.4em .7em;margin:.5em 0;font-size:.9em}
.trial pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:.4em;margin:.3em 0 0;
font-size:.92em}
.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
svg text{font-size:10px;fill:#444}
"""


def esc(x: object) -> str:
    """HTML-escaped text (quotes included, so it is safe inside attributes); None -> an em dash."""
    return "—" if x is None else html.escape(str(x), quote=True)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or not np.isfinite(x):
        return "—"
    return f"{x:.{digits}f}"


def _short_label(kind: str, label: str) -> str:
    """A segment's label where it says more than its kind (``hop0``, ``d3``), else nothing."""
    return "" if label in ("", kind) else label


def _label(kind: str, label: str) -> str:
    short = _short_label(kind, label)
    return f"{esc(short)} · " if short else ""


def _visible(text: str) -> str:
    """A token's text for display: escaped, newlines as ↵ plus a line break, tabs as →."""
    out = esc(text).replace("\t", '<span class="nl">→</span>\t')
    return out.replace("\n", '<span class="nl">↵</span>\n')


def selection_words(view: PromptView, layer: int | None, head: int | None) -> str:
    """``layer 12, head 3`` / ``mean over 30 layers, mean over 9 heads``."""
    lw = f"layer {layer}" if layer is not None else f"mean over {view.n_layers} layers"
    hw = f"head {head}" if head is not None else f"mean over {view.n_heads} heads"
    return f"{lw}, {hw}"


def _shade(value: float, vmax: float) -> tuple[float, bool]:
    """(opacity, whether the text should be light) of a token's mass."""
    frac = min(max(value / vmax, 0.0), 1.0) if vmax > 0 else 0.0
    alpha = 0.9 * float(np.sqrt(frac))
    return alpha, alpha > 0.55


def _legend(vmax: float) -> str:
    r, g, b = SHADE_RGB
    steps = []
    for frac in (0.01, 0.1, 0.25, 0.5, 1.0):
        alpha, _ = _shade(frac * vmax, vmax)
        steps.append(f'<span><span class="sw" style="background:rgba({r},{g},{b},{alpha:.3f})" '
                     f'title="{frac * vmax:.4f}"></span>{frac * vmax:.3g}</span>')
    kinds = " ".join(f'<span class="chip" style="background:{c}">{esc(k)}</span>'
                     for k, c in KIND_COLOURS.items() if k != "generated")
    return (
        '<div class="legend">'
        "<div><b>Shade</b>: attention mass of the query set on the token "
        f"(opacity ∝ √(mass / {vmax:.3g}), the largest "
        "mass on a non-sink token; sink tokens above it are drawn at full shade). Hover a token for its value.</div>"
        f'<div class="scale">{"".join(steps)}</div>'
        '<div><span class="t q" style="padding:0 .3em">query</span> dashed outline: a token of the query set, '
        "whose attention is shown.</div>"
        f"<div>{kinds}</div></div>"
    )


def _trials(view: PromptView) -> str:
    if not view.trials:
        return '<p class="note">No trial of this prompt is recorded for this model.</p>'
    out = []
    for t in view.trials:
        if t.error is not None:
            verdict = f'<span class="bad">backend error</span>: {esc(t.error)}'
        elif t.skipped:
            verdict = f'<span class="bad">skipped</span>: {esc(t.skip_reason)}'
        elif t.em is None:
            verdict = "not scored"
        else:
            verdict = '<span class="ok">correct</span>' if t.em >= 1 else '<span class="bad">wrong</span>'
        flags = [name for name, on in (("truncated", t.truncated), ("uninterpretable", t.uninterpretable)) if on]
        extra = f" · {esc(', '.join(flags))}" if flags else ""
        hop = f" · hop recall {_fmt(t.hop_recall, 2)}" if t.hop_recall is not None else ""
        out.append(
            f'<div class="trial"><div>{verdict}{extra}{hop} · answer <b>{esc(t.answer)}</b> · gold '
            f"<b>{esc(t.gold)}</b></div><details open><summary>output ({esc(t.completion_tokens)} tokens)</summary>"
            f"<pre>{esc(t.output)}</pre></details></div>"
        )
    return "".join(out)


def _tokens(view: PromptView, mass: np.ndarray, seg_mass: np.ndarray, vmax: float) -> str:
    r, g, b = SHADE_RGB
    query = set(view.query_positions)
    blocks = []
    for i, span in enumerate(view.tokenized.spans):
        colour = KIND_COLOURS.get(span.kind, "#999")
        pieces = []
        for t in range(span.start, span.end):
            alpha, dark = _shade(float(mass[t]), vmax)
            cls = "t" + (" q" if t in query else "") + (" sink" if span.kind == "sink" and not dark else "") \
                + (" dark" if dark else "")
            title = f"token {t} · {view.token_text[t]!r} · mass {mass[t]:.5f}"
            title += " · query token" if t in query else ""
            pieces.append(f'<span class="{cls}" style="background:rgba({r},{g},{b},{alpha:.3f})" '
                          f'title="{esc(title)}">{_visible(view.token_text[t])}</span>')
        text = "".join(pieces)
        is_sep = span.kind == "sink" and span.label == "separator"
        head = "" if is_sep else (
            f'<div class="seghead"><span class="chip" style="background:{colour}">{esc(span.kind)}</span>'
            f"{_label(span.kind, span.label)}{span.n_tokens} tokens · mass {_fmt(float(seg_mass[i]), 4)}</div>")
        blocks.append(f'<div class="seg{" sep" if is_sep else ""}" id="seg-{i}" style="border-left-color:{colour}" '
                      f'title="{esc(span.kind)} {esc(span.label)}">{head}<div class="segtext">{text}</div></div>')
    return "".join(blocks)


def _segment_table(view: PromptView, seg_mass: np.ndarray) -> str:
    spans = view.tokenized.spans
    nonsink = float(sum(m for m, s in zip(seg_mass, spans) if s.kind != "sink"))
    top = max((float(m) for m, s in zip(seg_mass, spans) if s.kind != "sink"), default=0.0)
    rows = []
    for i, (s, m) in enumerate(zip(spans, seg_mass)):
        if s.kind == "sink" and s.label == "separator":
            continue
        share = float(m) / nonsink if s.kind != "sink" and nonsink > 0 else None
        width = 0 if s.kind == "sink" or top <= 0 else int(round(60 * float(m) / top))
        colour = KIND_COLOURS.get(s.kind, "#999")
        rows.append(
            f'<tr><td class="l"><a href="#seg-{i}"><span class="chip" style="background:{colour}">{esc(s.kind)}</span>'
            f"{esc(_short_label(s.kind, s.label))}</a></td><td>{s.n_tokens}</td><td>{_fmt(float(m), 4)}</td>"
            f"<td>{'—' if share is None else f'{100 * share:.1f} %'}</td>"
            f'<td class="l"><span class="bar" style="width:{width}px"></span></td></tr>')
    return ('<table><thead><tr><th class="l">segment</th><th>tokens</th><th>mass</th><th>% non-sink</th>'
            f'<th class="l"></th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<div class="note">mass: mean over the query set of the attention on the segment\'s tokens (a row sums '
            'to 1 over all tokens); % non-sink: its share of the mass on non-sink tokens.</div>')


def _kind_table(view: PromptView, seg_mass: np.ndarray) -> str:
    spans = view.tokenized.spans
    nonsink = float(sum(m for m, s in zip(seg_mass, spans) if s.kind != "sink"))
    n_nonsink = sum(s.n_tokens for s in spans if s.kind != "sink")
    rows = []
    for kind in KIND_COLOURS:
        members = [(s, float(m)) for s, m in zip(spans, seg_mass) if s.kind == kind]
        if not members:
            continue
        mass = sum(m for _, m in members)
        n = sum(s.n_tokens for s, _ in members)
        if kind == "sink":
            share, tok_share = "—", "—"
        else:
            share = f"{100 * mass / nonsink:.1f} %" if nonsink > 0 else "—"
            tok_share = f"{100 * n / n_nonsink:.1f} %" if n_nonsink else "—"
        rows.append(f'<tr><td class="l"><span class="chip" style="background:{KIND_COLOURS[kind]}">{esc(kind)}</span>'
                    f"</td><td>{len(members)}</td><td>{n}</td><td>{_fmt(mass, 4)}</td><td>{share}</td>"
                    f"<td>{tok_share}</td></tr>")
    return ('<table><thead><tr><th class="l">kind</th><th>segs</th><th>tokens</th><th>mass</th>'
            f'<th>% mass</th><th>% tokens</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<div class="note">% mass and % tokens: shares of the non-sink mass and of the non-sink tokens; a kind '
            'whose % mass is above its % tokens gets more attention than uniform.</div>')


def _layer_chart(view: PromptView, layer: int | None, head: int | None) -> str:
    """Inline SVG: P_ext by layer (head or head mean) against its chance level; the shown layer marked."""
    p = view.p_ext_by_layer(head)
    chance = view.per_token.chance.astype(np.float64)
    if not np.isfinite(chance).any() or np.nanmax(chance) <= 0:
        return '<p class="note">No extraneous tokens before the query set: P_ext is 0 at every layer.</p>'
    w, h, left, bottom, top, right = 420, 150, 34, 22, 8, 8
    L = len(p)
    ymax = float(np.nanmax(np.concatenate([p[np.isfinite(p)], chance[np.isfinite(chance)], [1e-9]]))) * 1.1

    def xy(i: int, v: float) -> str:
        x = left + (w - left - right) * (i / max(L - 1, 1))
        y = top + (h - top - bottom) * (1 - v / ymax)
        return f"{x:.1f},{y:.1f}"

    def line(vals: np.ndarray, style: str) -> str:
        pts = " ".join(xy(i, float(v)) for i, v in enumerate(vals) if np.isfinite(v))
        return f'<polyline fill="none" {style} points="{pts}"/>'

    mark = ""
    if layer is not None:
        x = left + (w - left - right) * (layer / max(L - 1, 1))
        mark = f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{h - bottom}" stroke="#c51b7d" stroke-width="1"/>'
    axis = (f'<line x1="{left}" x2="{w - right}" y1="{h - bottom}" y2="{h - bottom}" stroke="#999"/>'
            f'<line x1="{left}" x2="{left}" y1="{top}" y2="{h - bottom}" stroke="#999"/>'
            f'<text x="{left}" y="{h - 8}" text-anchor="middle">0</text>'
            f'<text x="{w - right}" y="{h - 8}" text-anchor="middle">{L - 1}</text>'
            f'<text x="{(w + left) / 2:.0f}" y="{h - 4}" text-anchor="middle">layer</text>'
            f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{ymax:.2f}</text>'
            f'<text x="{left - 4}" y="{h - bottom}" text-anchor="end">0</text>')
    who = f"head {head}" if head is not None else "mean over heads"
    chance_line = line(chance, 'stroke="#888" stroke-dasharray="4 3" stroke-width="1.2"')
    p_line = line(p, 'stroke="#d95f02" stroke-width="1.8"')
    return (f'<svg width="{w}" height="{h}" role="img" aria-label="P_ext by layer">{axis}{mark}{chance_line}{p_line}'
            "</svg>"
            f'<div class="note"><span style="color:#d95f02">━</span> P_ext ({esc(who)}) &nbsp; '
            '<span style="color:#888">╌</span> chance (uniform attention over the visible tokens)'
            + (f' &nbsp; <span style="color:#c51b7d">│</span> layer {layer}' if layer is not None else "")
            + "</div>")


def render_prompt_view(view: PromptView, layer: int | None = None, head: int | None = None) -> str:
    """The HTML page of one prompt view (see docs/probes.md#seeing-one-prompt).

    Args:
        view: the prompt's tokens and per-token attention.
        layer: 0-based layer, or None for the mean over layers.
        head: 0-based head, or None for the mean over heads.

    Returns:
        A complete, self-contained HTML document.

    Raises:
        ProbeError: ``layer`` or ``head`` out of range.
    """
    view.check_selection(layer, head)
    p = view.prompt
    mass = view.token_mass(layer, head)
    seg_mass = view.segment_mass(layer, head)
    is_sink = np.zeros(len(mass), dtype=bool)
    for s in view.tokenized.spans:
        if s.kind == "sink":
            is_sink[s.start : s.end] = True
    vmax = float(mass[~is_sink].max()) if (~is_sink).any() else float(mass.max())
    nq = len(view.query_positions)
    opts = view.options
    load = "" if p.condition == "Control" else f" · load {p.load} % (achieved {p.achieved_load:.1f} %)"
    warn = " warn" if "differs" in view.record_note else ""
    header = (
        f"<h1>{esc(p.prompt_id)}</h1>"
        f'<div class="meta"><b>{esc(view.model)}</b> · task {esc(p.task_id)} ({esc(p.source)}) · '
        f"<b>{esc(p.condition)}</b>{esc(load)} · replication {p.replication} · {len(view.tokenized.input_ids)} tokens"
        + (f" · S_sim {p.s_sim:.3f}" if p.s_sim is not None else "") + "</div>"
        f'<div class="meta">Attention of the query set <b>{esc(opts.query)}</b> ({nq} token{"s" if nq != 1 else ""}, '
        f"outlined) at <b>{esc(selection_words(view, layer, head))}</b>.</div>"
        f'<div class="meta note{warn}">{esc(view.record_note)}. Run: {esc(view.run_path)}</div>'
    )
    aside = (
        f"<h2>Legend</h2>{_legend(vmax)}"
        f"<h2>Segments</h2>{_segment_table(view, seg_mass)}"
        f"<h2>By kind</h2>{_kind_table(view, seg_mass)}"
        f"<h2>P_ext by layer</h2>{_layer_chart(view, layer, head)}"
    )
    body = (f"{header}<h2>Trial</h2>{_trials(view)}"
            f'<div class="grid"><main>{_tokens(view, mass, seg_mass, vmax)}</main><aside>{aside}</aside></div>')
    title = f"{p.prompt_id} · {view.model}"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>")


def write_prompt_view(view: PromptView, path: str | Path, layer: int | None = None, head: int | None = None,
                      root: str | Path | None = None) -> Path:
    """Write :func:`render_prompt_view`'s page to ``path`` (folders created); returns the path. With ``root`` (the
    run folder, for the default page inside it) no link may lie on the way (:func:`probe.runfolder.inside`)."""
    path = Path(path)
    text = render_prompt_view(view, layer, head)
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text, root=root)


__all__ = ["KIND_COLOURS", "render_prompt_view", "selection_words", "write_prompt_view"]
