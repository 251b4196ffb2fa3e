"""Re-injection: a built ICE prompt with its germane facts, or as many neutral sentences, repeated right before the
question (docs/interventions.md#re-injection)."""

from __future__ import annotations

from dataclasses import replace

from probe.interventions import REINJECT_WHAT
from probe.errors import ConfigError
from probe.prompts.builder import QUESTION_PREFIX, Piece, assemble, draw_rng
from probe.prompts.filler import neutral_filler
from probe.types import Prompt

def reinject(prompt: Prompt, what: str, seed: int) -> Prompt:
    """``prompt`` with its germane facts (``what = "germane"``) or as many neutral sentences (``"filler"``) added as
    the last segments before the question (docs/interventions.md#re-injection).

    Raises:
        ConfigError: ``what`` is neither; the prompt is not laid out as the ICE builder lays prompts out
            (instruction, body, question), so there is no place "right before the question" to put them.
    """
    if what not in REINJECT_WHAT:
        raise ConfigError(f"reinject: {what!r}; repeat \"germane\" facts or as many \"filler\" sentences")
    segs = prompt.segments
    if len(segs) < 2 or segs[0].kind != "instruction" or segs[-1].kind != "question":
        raise ConfigError(f"reinject: prompt {prompt.prompt_id} is not laid out as instruction, body, question (a "
                          "native layout): there is no place before the question to repeat the facts")
    question = prompt.segment_text(segs[-1])
    body = [Piece(s.kind, prompt.segment_text(s), s.label) for s in segs[1:-1]]
    text, _ = assemble(prompt.segment_text(segs[0]), body, question.removeprefix(QUESTION_PREFIX))
    if text != prompt.text:
        raise ConfigError(f"reinject: prompt {prompt.prompt_id} is not joined as the ICE builder joins prompts: "
                          "there is no place before the question to repeat the facts")
    germane = [p for p in body if p.kind == "germane"]
    if not germane:
        raise ConfigError(f"reinject: prompt {prompt.prompt_id} has no germane fact to repeat")
    if what == "germane":
        added = [Piece("germane", p.text, f"re-{p.label or f'hop{i}'}") for i, p in enumerate(germane)]
    else:
        rng = draw_rng(seed, "reinject", prompt.prompt_id)
        added = [Piece("filler", t, f"re-f{i}") for i, t in enumerate(neutral_filler(rng, len(germane)))]
    text, rebuilt = assemble(prompt.segment_text(segs[0]), body + added, question.removeprefix(QUESTION_PREFIX))
    return replace(prompt, text=text, segments=rebuilt)


__all__ = ["reinject"]
