"""One trial's answer, token by token, with the prompt shaded by where each token's attention went
(docs/probes.md#hop-tracking)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from probe.analysis.frame import probe_records
from probe.analysis.hops import HopRow, layer_window, segment_texts, track_trial
from probe.attention.answer import AnswerAttention
from probe.errors import ProbeError
from probe.records import load_prompts, load_task_records, load_trials, make_trial_id
from probe.report.show import CSS, KIND_COLOURS, esc
from probe.runfolder import RunFolder, write_atomic

LABEL_COLOURS = {"read_right_fact": "#1b9e77", "read_distractor": "#d95f02", "other": "#7570b3",
                 "not_named": "#999999"}
STEP_CSS = """
.step{display:none;border:1px solid #e3e3e3;border-radius:4px;padding:.4em .7em;margin:.6em 0}
.step:target{display:block}
.out a{color:inherit;text-decoration:none;border-radius:2px}.out a:hover{background:#eef}
.out a.m{border-bottom:3px solid var(--c)}
.row{display:grid;grid-template-columns:12em 5em minmax(0,1fr);gap:.5em;font-size:.85em;padding:1px 3px;
margin:1px 0;border-radius:2px}
.row .x{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
"""


def _rows_html(pooled: np.ndarray, kinds: Sequence[str], labels: Sequence[str], texts: Mapping[int, str]) -> str:
    """One line per segment (and the answer so far), its background ∝ √(mass / the largest non-sink mass)."""
    content = [float(pooled[s]) for s, k in enumerate(kinds) if k != "sink"] + [float(pooled[len(kinds)])]
    top = max(content) if content and max(content) > 0 else 1.0
    out = []
    for s in range(len(kinds) + 1):
        kind = kinds[s] if s < len(kinds) else "generated"
        label = labels[s] if s < len(kinds) else "so far"
        label = "" if label == kind else label  # a segment named by its kind alone ("instruction") says it once
        value = float(pooled[s])
        alpha = 0.0 if kind == "sink" else min(1.0, np.sqrt(max(value, 0.0) / top))
        text = texts.get(s, "") if s < len(kinds) else ""
        out.append(f'<div class="row" style="background:rgba(31,119,180,{alpha * 0.55:.3f})">'
                   f'<span><span class="chip" style="background:{KIND_COLOURS.get(kind, "#666")}">{esc(kind)}</span>'
                   f'{esc(label)}</span><span>{value:.3f}</span><span class="x">{esc(text)}</span></div>')
    return "".join(out)


def _label_cell(label: str | None) -> str:
    """A hop label as a table cell, in its colour and words ("read right fact"); a dash without one."""
    if label is None:
        return f'<td class="l">{esc(None)}</td>'
    return f'<td class="l" style="color:{LABEL_COLOURS[label]}">{esc(label.replace("_", " "))}</td>'


def render_answer_steps(answer: AnswerAttention, output: str, char_spans: np.ndarray, rows: Sequence[HopRow],
                        texts: Mapping[int, str], title: str, layer: int | None = None, head: int | None = None
                        ) -> str:
    """The page (docs/probes.md#hop-tracking).

    Args:
        answer: the trial's answer attention; ``output`` its recorded output; ``char_spans`` the tokens' character
            spans in it (:func:`probe.analysis.hops.token_char_spans`).
        rows: the trial's hop-tracking rows (:func:`probe.analysis.hops.track_trial`).
        texts: segment index -> text (the prompt's segments; sink segments have none).
        title: the page's heading (the trial).
        layer, head: show one layer and/or head instead of the window's layers and every head.

    Raises:
        ValueError: a layer or head out of range.
    """
    n_layers, n_heads = answer.n_layers, answer.n_heads
    if layer is not None and not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is out of range: the record has layers 0..{n_layers - 1}")
    if head is not None and not 0 <= head < n_heads:
        raise ValueError(f"head {head} is out of range: the record has heads 0..{n_heads - 1}")
    lo, hi = (layer, layer + 1) if layer is not None else layer_window(n_layers)
    heads = slice(head, head + 1) if head is not None else slice(None)
    per_token = answer.mass[:, lo:hi, heads].astype(np.float64).mean(axis=(1, 2))  # (T, S + 1)
    where = (f"layer {layer}" if layer is not None else f"layers {lo}–{hi - 1}") + (
        f", head {head}" if head is not None else ", heads pooled")
    kinds, labels = answer.segment_kinds, answer.segment_labels
    mention_of: dict[int, str] = {}
    for r in rows:
        if r.token_start is not None and r.token_end is not None:
            for t in range(r.token_start, r.token_end):
                mention_of.setdefault(t, r.label)
    toks = []
    for t, (a, b) in enumerate(char_spans):
        piece = output[int(a):int(b)]
        if not piece:
            continue
        cls = f' class="m" style="--c:{LABEL_COLOURS[mention_of[t]]}"' if t in mention_of else ""
        toks.append(f'<a href="#t{t}"{cls} title="token {t}">{esc(piece)}</a>')
    def link(r: HopRow) -> str:
        return "—" if r.token_start is None or r.token_end is None else (  # both ends inclusive, as in the titles
            f'<a href="#t{r.token_start}">{r.token_start}–{r.token_end - 1}</a>')

    hop_rows = "".join(
        f'<tr><td>{r.hop}</td><td class="l">{esc(r.target.replace("_", " "))}</td><td class="l">{esc(r.entity)}'
        f'</td>{_label_cell(r.label)}'
        f'<td class="l">{esc(r.top_segment)}</td>{_label_cell(r.label_value)}<td>{link(r)}</td></tr>'
        for r in rows)
    panels = []
    for r in rows:
        if r.token_start is None or r.token_end is None:
            continue
        pooled = per_token[r.token_start:r.token_end].mean(axis=0)
        panels.append(f"<h2>Hop {r.hop}: first mention of {esc(r.entity)} (tokens {r.token_start}–{r.token_end - 1}"
                      f"), {esc(r.label.replace('_', ' '))}</h2>{_rows_html(pooled, kinds, labels, texts)}")
    steps = "".join(
        f'<section class="step" id="t{t}"><h2>Token {t}: {esc(output[int(a):int(b)])!s}</h2>'
        f"{_rows_html(per_token[t], kinds, labels, texts)}</section>"
        for t, (a, b) in enumerate(char_spans))
    body = (f"<h1>{esc(title)}</h1><p class=\"meta\">Attention of each generated token ({esc(where)}): follow a "
            "token of the output to see where it looked; underlined tokens first name a hop's answer (colour: its "
            "label). Mass per segment, shading ∝ √(mass / largest non-sink mass).</p>"
            "<h2>Hops</h2><table><thead><tr><th>hop</th><th class=\"l\">tracked</th><th class=\"l\">entity</th>"
            "<th class=\"l\">label</th><th class=\"l\">segment read</th><th class=\"l\">value-weighted label</th>"
            f"<th>tokens</th></tr></thead><tbody>{hop_rows}</tbody></table>"
            f'<h2>Output</h2><div class="trial out segtext">{"".join(toks)}</div>{steps}{"".join(panels)}')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}{STEP_CSS}</style></head><body>{body}</body></html>")


def write_answer_steps(run_dir: str | Path | RunFolder, model: str, prompt_id: str, path: str | Path | None = None, *,
                       layer: int | None = None, head: int | None = None) -> Path:
    """Write the page of one trial of a run folder (default ``show/<model>/<stem>.answer.html``).

    Everything comes from the run folder: the trial, its prompt, its task (``tasks.jsonl``) and the answer
    attention with each token's characters in the output.

    Raises:
        ProbeError: the trial, its prompt, its task or its answer attention is not in the run folder.
    """
    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    trial_id = make_trial_id(model, prompt_id)
    trial = next((t for t in load_trials(run.trials) if t.trial_id == trial_id), None)
    if trial is None or trial.output is None:
        raise ProbeError(f"{run.trials}: no trial {trial_id!r} with an output")
    prompt = next((p for p in load_prompts(run.prompts) if p.prompt_id == prompt_id), None)
    if prompt is None:
        raise ProbeError(f"{run.prompts}: no prompt {prompt_id!r}")
    answer = next((sa.answer for _, sa in probe_records(run, [(model, prompt_id)])), None)
    record = run.attention_record(model, prompt_id)
    if answer is None:
        raise ProbeError(f"{record}: no attention while the answer was written "
                         "(the run did not capture it: probe with answer = true in [probe])")
    if answer.chars is None:
        raise ProbeError(f"{record}: the answer record holds no token spans (written before the runner recorded "
                         "them); probe the run again to show its answer")
    n_layers, n_heads = answer.mass.shape[1:3]
    if layer is not None and not 0 <= layer < n_layers:
        raise ProbeError(f"layer {layer}: {model} has layers 0..{n_layers - 1}")
    if head is not None and not 0 <= head < n_heads:
        raise ProbeError(f"head {head}: {model} has heads 0..{n_heads - 1}")
    task = next((t for t in load_task_records(run.tasks) if t.task_id == trial.task_id), None)
    if task is None:
        raise ProbeError(f"{run.tasks}: no task {trial.task_id!r} (a run recorded before runs recorded their tasks "
                         "has no tasks.jsonl: run `probe run` on its experiment again, which writes it)")
    texts = segment_texts(prompt, answer)
    rows = track_trial(answer, trial, task, texts).rows
    out = Path(path) if path is not None else run.show_page(model, prompt_id).with_suffix(".answer.html")
    if path is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    page = render_answer_steps(answer, trial.output, answer.chars, rows, texts, f"{model} · {prompt_id}", layer, head)
    return write_atomic(out, page, root=None if path is not None else run.root)


__all__ = ["render_answer_steps", "write_answer_steps"]
