"""The ICE prompt builder: Task + condition + load + replication -> Prompt with segments, each load hit on the
model's own tokenizer (docs/method.md#load, docs/method.md#conditions)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from probe.config import IceSection
from probe.errors import ProbeError
from probe.prompts.distractors import FactPool, fact_pool
from probe.prompts.tokenize import PieceCounter, filler_share, measured_load, encode_prompt
from probe.runfolder import make_prompt_id
from probe.tasks import CUSTOM_CONDITION, get_family, get_source
from probe.types import Prompt, Segment, Task, TokenizedPrompt

log = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = (
    "Use the facts below to answer the question. Reason step by step, and end your reply with the final answer "
    "in the form \\boxed{answer}."
)
QUESTION_PREFIX = "Question: "
_POOL_SIZE = 64  # distractor candidates drawn per (task, load, replication); more than any load needs
# stratified draws: facts of one pool per experiment, embedded once; each draw samples 3 * _POOL_SIZE of them
_STRATIFIED_POOL = 3072
_EXACT_TRIES = 12  # LongControl: sentences tried as the last, cut piece to hit the exact token length


class BuildError(ProbeError):
    """A prompt could not be built to specification (load out of tolerance, pool exhausted)."""


# ---------------------------------------------------------------------------------------------------------------
# Assembly


@dataclass(frozen=True)
class Piece:
    kind: str
    text: str
    label: str


def assemble(instruction: str, body: Sequence[Piece], question: str) -> tuple[str, tuple[Segment, ...]]:
    """Join instruction, body and question into the prompt text, recording each segment's character span."""
    parts: list[str] = []
    segs: list[Segment] = []
    pos = 0

    def add(piece: Piece, sep: str) -> None:
        nonlocal pos
        if parts:
            parts.append(sep)
            pos += len(sep)
        parts.append(piece.text)
        segs.append(Segment(piece.kind, pos, pos + len(piece.text), piece.label))
        pos += len(piece.text)

    add(Piece("instruction", instruction, "instruction"), "")
    for i, p in enumerate(body):
        add(p, "\n\n" if i == 0 else "\n")
    add(Piece("question", question_segment(question), "question"), "\n\n")
    return "".join(parts), tuple(segs)


def question_segment(question: str) -> str:
    """The text of a prompt's question segment."""
    return QUESTION_PREFIX + question


def place_uniform(n_items: int, n_slots: int, rng: np.random.Generator) -> list[int]:
    """Slot index for each of ``n_items`` items spread as evenly as possible over ``n_slots`` slots.

    Every slot gets ⌊n/s⌋ or ⌈n/s⌉ items; which slots get the extra ones is drawn from ``rng``. Returned in
    non-decreasing slot order, so the item order is kept.
    """
    base, extra = divmod(n_items, n_slots)
    counts = np.full(n_slots, base)
    if extra:
        counts[rng.choice(n_slots, size=extra, replace=False)] += 1
    return [s for s in range(n_slots) for _ in range(int(counts[s]))]


def interleave(germane: Sequence[Piece], others: Sequence[Piece], slots: Sequence[int]) -> list[Piece]:
    """Put ``others[i]`` in gap ``slots[i]`` (0 = before the first germane piece, len(germane) = after the last)."""
    out: list[Piece] = []
    for g in range(len(germane) + 1):
        out += [o for o, s in zip(others, slots) if s == g]
        if g < len(germane):
            out.append(germane[g])
    return out


_DANGLING = frozenset("a an the of in on at to for with and or by from as its his her their that which who".split())


def _trim_words(text: str, n_words: int) -> str:
    """The first ``n_words`` words as a sentence (dangling function words dropped, full stop added)."""
    words = text.split()[:n_words]
    while len(words) > 1 and words[-1].lower().strip(",;:") in _DANGLING:
        words.pop()
    cut = " ".join(words).rstrip(",;:")
    return cut if cut.endswith(".") else cut + "."


def stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")


def draw_rng(seed: int, *keys: str | int) -> np.random.Generator:
    """A generator for one (task, load, replication, purpose) key: independent of model and condition."""
    entropy = [seed] + [stable_hash(k) if isinstance(k, str) else int(k) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(entropy))


# ---------------------------------------------------------------------------------------------------------------
# The builder


DistractorSource = Callable[..., list[str]]  # (rng, exclude_topic, n, avoid=texts) -> sentences in draw order
FillerSource = Callable[[np.random.Generator, int], list[str]]
Similarity = Callable[[str, list[str]], np.ndarray]


@dataclass
class IceBuilder:
    """Builds every prompt of an experiment for one tokenizer.

    Args:
        ice: the experiment's [ice] section.
        tokenizer: the target model's tokenizer (loads are counted in it).
        tokenizer_name: a label recorded in each prompt (the model card name).
        seed: the experiment seed.
        distractors: (rng, exclude_topic, n, avoid=texts) -> candidate extraneous sentences, in draw order.
        filler: (rng, n) -> neutral filler sentences.
        similarity: (question, texts) -> cosine similarities; needed for S_sim and stratified draws.
        use_chat_template: render the user message through the tokenizer's chat template.
        id_tokenizer: the tokenizer named in every prompt id (``...|@<tokenizer>``, see
            :func:`probe.runfolder.make_prompt_id`) when an experiment builds prompts for several tokenizers; None
            (one tokenizer) leaves it out.
        shared_candidates: a dict shared by the builders of an experiment's tokenizers: each distractor sequence
            (drawn, and for stratified draws embedded, independently of the tokenizer) is drawn once for all.
    """

    ice: IceSection
    tokenizer: Any
    tokenizer_name: str
    seed: int
    distractors: DistractorSource
    filler: FillerSource
    similarity: Similarity | None = None
    s_sim: Callable[[str, list[str]], float | None] | None = None
    use_chat_template: bool = True
    id_tokenizer: str | None = None
    shared_candidates: dict[tuple[str, int, int], list[str]] | None = None

    @classmethod
    def wired(cls, ice: IceSection, tokenizer: Any, tokenizer_name: str, seed: int, *, embedder: str | None = None,
              use_chat_template: bool = True, id_tokenizer: str | None = None,
              shared_candidates: dict[tuple[str, int, int], list[str]] | None = None) -> "IceBuilder":
        """The builder with the toolkit's distractor facts and neutral filler and, given ``embedder`` (a
        sentence-transformers model, name or path), S_sim and stratified draws: what the runner and the Python API
        both build prompts with."""
        from probe.prompts.distractors import distractor_facts
        from probe.prompts.filler import neutral_filler

        similarity = s_sim = None
        if embedder:
            from probe.prompts.similarity import get_embedder

            emb = get_embedder(embedder)
            similarity, s_sim = emb.similarity_to, emb.s_sim
        return cls(ice=ice, tokenizer=tokenizer, tokenizer_name=tokenizer_name, seed=seed,
                   distractors=distractor_facts, filler=neutral_filler, similarity=similarity, s_sim=s_sim,
                   use_chat_template=use_chat_template, id_tokenizer=id_tokenizer,
                   shared_candidates=shared_candidates)

    def __post_init__(self) -> None:
        self._counter = PieceCounter(self.tokenizer)
        # the last prompt tokenized whole, by text and segments (LongControl re-reads its Saturation prompt)
        self._last: tuple[tuple[str, tuple[Segment, ...]], TokenizedPrompt] | None = None
        # Saturation and Residue of one (task, load, replication) share their extraneous pieces: chosen once
        self._extraneous_memo: dict[tuple[str, int, int], list[Piece]] = {}
        self._countable_memo: dict[str, bool] = {}
        self._fact_pool: FactPool | None = None  # stratified draws: the experiment's pool, made on first use
        self._pool_views: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # task id -> (eligible facts, similarity)

    @property
    def instruction(self) -> str:
        return self.ice.instruction or DEFAULT_INSTRUCTION

    def tokenize(self, prompt: Prompt) -> TokenizedPrompt:
        key = (prompt.text, prompt.segments)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        tp = encode_prompt(prompt, self.tokenizer, self.use_chat_template)
        self._last = (key, tp)
        return tp

    def _countable(self, pieces: Sequence[Piece]) -> bool:
        """Whether the token counts of a prompt with these body pieces are sums of per-piece counts."""
        memo = self._countable_memo
        for p in pieces:
            ok = memo.get(p.text)
            if ok is None:
                ok = memo[p.text] = self._counter.countable(p.text)
            if not ok:
                return False
        return True

    def _count(self, pieces: Sequence[Piece]) -> int:
        return sum(self._counter.count(p.text) for p in pieces)

    def build_all(self, tasks: Sequence[Task]) -> list[Prompt]:
        """Every prompt of the tasks, laid out as each task's source declares (:mod:`probe.tasks`).

        A natively laid out task gives one prompt (its own segments); an ICE task gives Control per replication
        and the other conditions per load and replication.
        """
        out: list[Prompt] = []
        for task in tasks:
            if get_source(task.source).is_native(task):
                out.append(self.build_native(task))
                continue
            for rep in range(self.ice.replications):
                if "Control" in self.ice.conditions:
                    out.append(self.build(task, "Control", 0, rep))
                for load in self.ice.loads:
                    sat: Prompt | None = None  # built only where asked for or measured against (LongControl)
                    for cond in self.ice.conditions:
                        if cond == "Residue":
                            out.append(self.build(task, "Residue", load, rep))
                        elif cond in ("Saturation", "LongControl"):
                            sat = sat or self.build(task, "Saturation", load, rep)
                            out.append(sat if cond == "Saturation" else self.build_long_control(task, load, rep, sat))
        return out

    def _prompt_id(self, task: Task, condition: str, load: int, rep: int) -> str:
        return make_prompt_id(task.task_id, condition, load, rep, self.id_tokenizer)

    def _germane(self, task: Task) -> list[Piece]:
        return [Piece("germane", h.fact, f"hop{i}") for i, h in enumerate(task.hops)]

    def _make(self, task: Task, condition: str, load: int, rep: int, body: list[Piece],
              achieved: Callable[[TokenizedPrompt], float]) -> tuple[Prompt, TokenizedPrompt]:
        family = get_family(get_source(task.source).family)
        text, segs = assemble(self.instruction, body, task.question)
        draft = Prompt(self._prompt_id(task, condition, load, rep), task.task_id, task.source, condition, load, 0.0,
                       rep, text, segs, self.tokenizer_name, family=family.name)
        tp = self.tokenize(draft)
        s_sim = None
        ext = [p.text for p in body if p.kind == "extraneous"]
        if family.has_s_sim and self.s_sim is not None and ext:
            s_sim = self.s_sim(task.question, ext)
        prompt = Prompt(draft.prompt_id, task.task_id, task.source, condition, load, round(achieved(tp), 3), rep,
                        text, segs, self.tokenizer_name, s_sim, family.name)
        return prompt, tp

    def build_native(self, task: Task) -> Prompt:
        """A task laid out from its own segments, as given: one prompt, load = its measured extraneous share.

        Its condition is the family's (CogniLoad: ``CogniLoad``), else the task's own ``condition``, else
        ``Custom``.
        """
        family = get_family(get_source(task.source).family)
        condition = family.native_condition or task.condition or CUSTOM_CONDITION
        body = [Piece(kind, text, f"{kind[:3]}{i}") for i, (kind, text) in enumerate(task.segments)]
        prompt, tp = self._make(task, condition, 0, 0, body, measured_load)
        return dataclasses.replace(prompt, load=int(round(prompt.achieved_load)))

    def candidates(self, task: Task, load: int, rep: int) -> list[str]:
        """The seeded distractor sequence for (task, load, replication): the same for every model and condition."""
        if self.shared_candidates is None:
            return self._draw_candidates(task, load, rep)
        key = (task.task_id, load, rep)
        if key not in self.shared_candidates:
            self.shared_candidates[key] = self._draw_candidates(task, load, rep)
        return list(self.shared_candidates[key])

    def _draw_candidates(self, task: Task, load: int, rep: int) -> list[str]:
        rng = draw_rng(self.seed, task.task_id, load, rep, "distractors")
        avoid = [task.question, *(h.fact for h in task.hops)]  # no distractor names an entity of the task
        if self.ice.distractor_strategy == "random":
            return self.distractors(rng, task.topic, _POOL_SIZE, avoid=avoid)
        # stratified: a sample of the experiment's fact pool (any topic, no fact naming an entity of the task), cut
        # into similarity terciles; this (task, rep) draws from one, so that across tasks the distractors span low
        # to high similarity (H3 needs that variance).
        if self.similarity is None:
            raise BuildError("distractor_strategy = 'stratified' needs a sentence embedder (S_sim)")
        pool = self.stratified_pool()
        eligible, similarity = self._pool_view(task, avoid)
        sample = rng.choice(eligible, size=min(3 * _POOL_SIZE, len(eligible)), replace=False)
        sims = similarity[sample]
        order = sample[np.argsort(sims, kind="stable")]
        stratum = (stable_hash(task.task_id) + rep) % 3
        chosen = order[stratum * len(order) // 3 : (stratum + 1) * len(order) // 3]
        return [pool.facts[i] for i in rng.permutation(chosen)]

    def stratified_pool(self) -> FactPool:
        """The facts stratified draws sample from: one pool per experiment seed, the same for every tokenizer."""
        if self._fact_pool is None:
            self._fact_pool = fact_pool(draw_rng(self.seed, "stratified-pool"), _STRATIFIED_POOL)
        return self._fact_pool

    def _pool_view(self, task: Task, avoid: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The pool as one task sees it: the indices of the facts it may draw (none names an entity of ``avoid``)
        and the similarity of its question to every fact (the first call embeds the whole pool, in one batch)."""
        if task.task_id not in self._pool_views:
            assert self.similarity is not None
            if len(self._pool_views) >= 256:  # a task's loads and replications are drawn together
                self._pool_views.clear()
            pool = self.stratified_pool()
            sims = np.asarray(self.similarity(task.question, list(pool.facts)), dtype=np.float64)
            self._pool_views[task.task_id] = (pool.eligible(avoid), sims)
        return self._pool_views[task.task_id]

    def _fill(self, sentences: list[str], kind: str, label: str, need: Callable[[list[Piece]], int],
              exact: bool = False) -> list[Piece]:
        """Take sentences in order until ``need(pieces)`` (tokens still missing, < 0 = too many) is within range.

        ``need`` returns the signed token shortfall measured on the real tokenization. A sentence that would
        overshoot is skipped for a later, shorter one; at the end the last sentence may be cut at a word boundary.
        With ``exact`` (LongControl length matching) a remaining shortfall of a few tokens is closed by trying
        other sentences, cut to size, as an extra last piece.
        """
        memo: dict[tuple[str, ...], int] = {}
        raw_need = need

        def memo_need(ps: list[Piece]) -> int:  # each distinct piece list is tokenized once
            key = tuple(p.text for p in ps)
            if key not in memo:
                memo[key] = raw_need(ps)
            return memo[key]

        need = memo_need

        pieces: list[Piece] = []
        spare: str | None = None  # the first sentence skipped for overshooting: cut to size if nothing fits
        for s in sentences:
            short = need(pieces)
            if short <= 0:
                break
            trial = pieces + [Piece(kind, s, f"{label}{len(pieces)}")]
            if need(trial) >= 0 or need(trial) > -short:  # fits, or overshoots less than we are short
                pieces = trial
            elif spare is None:
                spare = s
        short = need(pieces)
        if short > 0 and spare is not None:
            pieces = pieces + [Piece(kind, spare, f"{label}{len(pieces)}")]
            short = need(pieces)
        if short > 0:
            raise BuildError(f"ran out of {kind} sentences {short} tokens short of the target")
        while short < 0 and pieces:  # overshoot: cut the last sentence at the longest word boundary that fits
            last = pieces[-1]
            for w in range(len(last.text.split()) - 1, 0, -1):
                cand = pieces[:-1] + [Piece(kind, _trim_words(last.text, w), last.label)]
                if need(cand) >= 0:
                    pieces = cand
                    break
            else:
                pieces = pieces[:-1]
            short = need(pieces)
        if exact and short > 0 and pieces:
            # a word can be several tokens: try other unused sentences, cut to size, as the last piece
            used = {p.text for p in pieces}
            for s in [x for x in sentences if x not in used][:_EXACT_TRIES]:
                for w in range(len(s.split()), 0, -1):
                    cand = pieces + [Piece(kind, _trim_words(s, w), f"{label}{len(pieces)}")]
                    if need(cand) == 0:
                        return cand
                    if need(cand) > 0:
                        break
        return pieces

    def _extraneous(self, task: Task, load: int, rep: int) -> list[Piece]:
        """The extraneous pieces of (task, load, rep) for this tokenizer, hitting ℓ within tolerance."""
        key = (task.task_id, load, rep)
        if key not in self._extraneous_memo:
            if len(self._extraneous_memo) > 64:  # a task's loads and replications are built together
                self._extraneous_memo.clear()
            self._extraneous_memo[key] = self._choose_extraneous(task, load, rep)
        return list(self._extraneous_memo[key])

    def _choose_extraneous(self, task: Task, load: int, rep: int) -> list[Piece]:
        germane = self._germane(task)
        target = load / 100.0
        tol = self.ice.load_tolerance / 100.0

        fast = self._countable(germane)
        g_fast = self._count(germane) if fast else 0

        def shortfall(ext: list[Piece]) -> int:
            if fast and self._countable(ext):
                g, e = g_fast, self._count(ext)
            else:
                tp = self.tokenize(Prompt("draft", task.task_id, task.source, "Saturation", load, 0.0, rep,
                                          *assemble(self.instruction, ext + germane, task.question)))
                g, e = tp.count("germane"), tp.count("extraneous")
            want = int(round(target * g / (1.0 - target)))
            # inside tolerance counts as "no shortfall"; outside, the signed distance to the target
            if abs((e / (e + g) if e + g else 0.0) - target) <= tol * 0.6:
                return 0
            return want - e

        return self._fill(self.candidates(task, load, rep), "extraneous", "d", shortfall)

    def build(self, task: Task, condition: str, load: int, rep: int) -> Prompt:
        """One prompt of Control (load 0), Saturation or Residue."""
        germane = self._germane(task)
        if condition == "Control":
            prompt, _ = self._make(task, condition, 0, rep, germane, measured_load)
            return prompt
        ext = self._extraneous(task, load, rep)
        if condition == "Saturation":
            slots = place_uniform(len(ext), len(germane) + 1, draw_rng(self.seed, task.task_id, load, rep, "place"))
            body = interleave(germane, ext, slots)
        elif condition == "Residue":
            body = ext + germane
        else:
            raise BuildError(f"condition {condition!r} is built by its own method")
        prompt, tp = self._make(task, condition, load, rep, body, measured_load)
        if self._countable(body) and (tp.count("extraneous"), tp.count("germane")) != (self._count(ext),
                                                                                         self._count(germane)):
            raise BuildError(f"{prompt.prompt_id}: its token counts differ from the sums of its pieces' counts; the "
                             f"tokenizer {self.tokenizer_name!r} does not tokenize pieces independently")
        if abs(prompt.achieved_load - load) > self.ice.load_tolerance:
            raise BuildError(f"{prompt.prompt_id}: achieved load {prompt.achieved_load:.1f} % is more than "
                             f"{self.ice.load_tolerance} points from the target {load} %")
        return prompt

    def build_long_control(self, task: Task, load: int, rep: int, saturation: Prompt) -> Prompt:
        """Germane facts padded with neutral filler to the token length of ``saturation``."""
        germane = self._germane(task)
        target_len = len(self.tokenize(saturation).input_ids)
        rng = draw_rng(self.seed, task.task_id, load, rep, "filler")
        sentences = self.filler(rng, _POOL_SIZE)
        place_seed = int(draw_rng(self.seed, task.task_id, load, rep, "filler-place").integers(2**63))

        slots_of: dict[int, list[int]] = {}  # the placement depends only on the number of filler pieces

        def body_of(fill: list[Piece]) -> list[Piece]:
            if len(fill) not in slots_of:
                slots_of[len(fill)] = place_uniform(len(fill), len(germane) + 1, np.random.default_rng(place_seed))
            return interleave(germane, fill, slots_of[len(fill)])

        def draft(body: list[Piece]) -> Prompt:
            return Prompt("draft", task.task_id, task.source, "LongControl", load, 0.0, rep,
                          *assemble(self.instruction, body, task.question))

        fixed = None  # tokens outside the body pieces and their "\n" separators, when pieces count one by one
        if self._countable(germane):
            fixed = (len(self.tokenize(draft(germane)).input_ids) - self._count(germane)
                     - (len(germane) - 1) * self._counter.count("\n"))

        def length(body: list[Piece]) -> int:
            if fixed is not None and self._countable(body):
                return fixed + self._count(body) + (len(body) - 1) * self._counter.count("\n")
            return len(self.tokenize(draft(body)).input_ids)

        def shortfall(fill: list[Piece]) -> int:
            return target_len - length(body_of(fill))

        fill = self._fill(sentences, "filler", "f", shortfall, exact=True)
        body = body_of(fill)
        prompt, tp = self._make(task, "LongControl", load, rep, body, filler_share)
        if fixed is not None and self._countable(body) and len(tp.input_ids) != length(body):
            raise BuildError(f"{prompt.prompt_id}: its length differs from the sum of its pieces' counts; the "
                             f"tokenizer {self.tokenizer_name!r} does not tokenize pieces independently")
        return prompt
