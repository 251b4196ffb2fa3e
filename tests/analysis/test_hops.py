"""Hop tracking (probe.analysis.hops): mentions of a hop's answer, their tokens, the label of what was read.

Every expected label comes from the planted masses (where the test put the weight), never from the code under test;
shares are checked against a direct count and the intervals against ``proportion_ci`` called on the same outcomes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from probe.analysis.hops import (
    CATEGORIES,
    HOP_LABELS,
    HopRow,
    first_mention,
    hop_cells,
    label_of,
    track_trial,
)
from probe.analysis.inference import proportion_ci
from probe.attention.answer import AnswerAttention
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.config import AnalysisSection
from probe.prompts.tokenize import token_char_spans
from probe.records import TrialRecord
from probe.scoring.answers import _matches, mention_spans
from probe.types import Hop, Task


class PieceTokenizer:
    """A tokenizer over a fixed list of text pieces: id i decodes to piece i; it offers no offsets."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def __call__(self, text: str, **kwargs: object) -> dict:
        raise NotImplementedError("no offsets")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


def spans_of(pieces: list[str]) -> np.ndarray:
    """Character spans of consecutive pieces, computed directly."""
    out, pos = [], 0
    for p in pieces:
        out.append((pos, pos + len(p)))
        pos += len(p)
    return np.array(out)


# ------------------------------------------------------------------------------------------------ mentions


def test_mention_split_over_tokens_is_one_span():
    pieces = ["The", " capital", " is", " Mol", "via", "."]
    text = "".join(pieces)
    m = first_mention(text, "Molvia", spans_of(pieces))
    assert (m.char_start, m.char_end) == (text.index("Molvia"), text.index("Molvia") + 6)
    assert (m.token_start, m.token_end) == (3, 5)
    assert m.n_mentions == 1


def test_absent_entity_is_not_named():
    pieces = ["He", " was", " born", " in", " Molvian", " lands"]
    text = "".join(pieces)
    assert mention_spans(text, "Molvia") == []  # "Molvian" is another word, as exact match says
    assert first_mention(text, "Molvia", spans_of(pieces)) is None


def test_repeated_entity_gives_the_first_mention():
    pieces = ["MOLVIA", "'s", " capital", ".", " So", " Molvia", "."]
    text = "".join(pieces)
    m = first_mention(text, "Molvia", spans_of(pieces))
    assert (m.token_start, m.token_end, m.n_mentions) == (0, 1, 2)
    assert mention_spans(text, "the Molvia") == [(0, 6), (text.rindex("Molvia"), text.rindex("Molvia") + 6)]


def test_numeric_mentions_compare_values():
    text = "It has 1,850 people, or eighteen fifty? No: 1850."
    assert mention_spans(text, "1850") == [(7, 12), (text.rindex("1850"), text.rindex("1850") + 4)]
    assert mention_spans("eleven of them", "11") == [(0, 6)]
    assert mention_spans("it cost 11.1 billion", "11.1 billion") == [(8, 20)]


@pytest.mark.parametrize("text, entity", [
    ("Vorlan was born in Molvia.", "Molvia"), ("Vorlan was born in Molvian lands.", "Molvia"),
    ("Café Zürich opened", "cafe zurich"), ("The Arden Hall", "arden hall"), ("an apple", "Apple"),
    ("It was 75.35 square kilometers", "75.35 square kilometers"), ("twelve", "12"), ("1,200", "1200.0"),
    ("Quellin's tower", "Quellin"), ("nothing here", "Zerin"), ("the the", "the"),
])
def test_a_mention_exists_exactly_when_hop_recall_matches(text, entity):
    assert bool(mention_spans(text, entity)) == _matches(text, entity)


# ------------------------------------------------------------------------------------------- token offsets


def test_token_spans_by_prefix_decoding():
    pieces = ["Vor", "lan", " was", " born", " in", " Mol", "via", "."]
    tok = PieceTokenizer(pieces)
    text = "".join(pieces)
    np.testing.assert_array_equal(token_char_spans(list(range(len(pieces))), text, tok), spans_of(pieces))
    with pytest.raises(Exception, match="decode to"):
        token_char_spans([0, 1], "something else", tok)


class ByteTokenizer:
    """A byte-level tokenizer: id i is the byte string ``pieces[i]``; a cut character decodes to U+FFFD."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __call__(self, text: str, **kwargs: object) -> dict:
        raise NotImplementedError("no offsets")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_token_spans_with_a_character_split_over_tokens():
    pieces = [b"Caf", b"\xc3", b"\xa9", b" Z", b"\xc3\xbc", b"rich"]  # "é" cut over two tokens
    tok = ByteTokenizer(pieces)
    text = "Café Zürich"
    spans = token_char_spans(list(range(len(pieces))), text, tok)
    np.testing.assert_array_equal(spans, [(0, 3), (3, 3), (3, 4), (4, 6), (6, 7), (7, 11)])
    m = first_mention(text, "cafe", spans)
    assert (m.token_start, m.token_end) == (0, 3)  # the zero-width first byte is inside, not an edge


def test_token_spans_of_a_real_tokenizer_both_paths():
    from probe.loading import get_card, load_tokenizer

    tok = load_tokenizer(get_card("smollm2-135m-instruct"))  # its package is one of `make setup`
    text = "Vorlan was born in Molvia, and Molvia's capital is Arden. \\boxed{Arden}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    fast = token_char_spans(ids, text, tok)
    for t, (a, b) in enumerate(fast):  # each span decodes to its own token's text (leading space aside)
        assert text[a:b].strip() == tok.decode([ids[t]]).strip()
    # ids the tokenizer would not produce (the entity spelled letter by letter): prefix decoding takes over
    word = "Molvia"
    letters = [tok.convert_tokens_to_ids(c) for c in word]
    odd = tok(text[: text.index(word)], add_special_tokens=False)["input_ids"] + letters
    odd_text = tok.decode(odd)
    slow = token_char_spans(odd, odd_text, tok)
    m = first_mention(odd_text, word, slow)
    assert (m.token_start, m.token_end) == (len(odd) - len(word), len(odd))


# ------------------------------------------------------------------------------------------ planted trial

KINDS = ("sink", "instruction", "germane", "extraneous", "germane", "extraneous", "question", "sink")
LABELS = ("template", "instruction", "hop0", "d0", "hop1", "d1", "question", "template")
TEXTS = {3: "Tesk was born in Quellin.", 5: "The capital of Brask is Zerin."}
HOPS = (Hop("Vorlan was born in Molvia.", "Molvia"), Hop("The capital of Molvia is Arden.", "Arden"))
PIECES = ["Vor", "lan", " was", " born", " in", " Mol", "via", ".", " Its", " capital", " is", " Zer", "in", "."]
N_LAYERS, N_HEADS = 6, 2


def planted(target_of: dict[tuple[int, int], int], layers: range = range(3, 6)) -> np.ndarray:
    """Masses: most weight on the sink everywhere, a slight preference for d0 among content segments; rows
    ``[a, b)`` of ``target_of`` put 0.4 of their mass on the given segment in ``layers``."""
    t = len(PIECES)
    s = len(KINDS) + 1
    mass = np.full((t, N_LAYERS, N_HEADS, s), 0.02)
    mass[..., 0] = 0.6
    mass[..., 3] = 0.05
    for (a, b), seg in target_of.items():
        for layer in layers:
            mass[a:b, layer, :, seg] += 0.4
    return (mass / mass.sum(-1, keepdims=True)).astype(np.float32)


SPANS = ((0, 3), (3, 10), (10, 16), (16, 22), (22, 28), (28, 34), (34, 38), (38, 40))
TASK = Task("q", "synthetic", "What is the capital of Vorlan's birthplace?", "Arden", HOPS)


def answer(mass: np.ndarray, vmass: np.ndarray | None = None, labels: tuple[str, ...] = LABELS) -> AnswerAttention:
    """The answer capture of the planted trial, with each token's characters as the runner records them."""
    t = len(PIECES)
    return AnswerAttention(tokens=np.arange(t), mass=mass, vmass=vmass,
                           top_key=np.zeros((t, N_LAYERS, N_HEADS), dtype=np.int32), prompt_ids=np.arange(40),
                           segment_kinds=KINDS, segment_labels=labels, segment_spans=SPANS,
                           chars=spans_of(PIECES))


def trial_record(extracted: str | None = "Zerin", em: float | None = 0.0, prompt_id: str = "q|Saturation|L50|r0"
                 ) -> TrialRecord:
    return TrialRecord(trial_id=f"m::{prompt_id}", model="m", prompt_id=prompt_id, task_id="q", source="synthetic",
                       condition="Saturation", load=50, achieved_load=50.0, replication=0, prompt_tokens=40,
                       output="".join(PIECES), answer=extracted, gold="Arden", em=em, hop_recall=0.5,
                       truncated=False, uninterpretable=False)


def trial(mass: np.ndarray, vmass: np.ndarray | None = None, extracted: str = "Zerin", em: float = 0.0):
    return track_trial(answer(mass, vmass), trial_record(extracted, em), TASK, TEXTS)


MOLVIA, ZERIN = (5, 7), (11, 13)  # token spans of the entities in PIECES


def test_planted_trial_is_labelled_from_where_the_mass_was_put():
    out = trial(planted({MOLVIA: 2, ZERIN: 5}))
    hop0, hop1 = out.rows
    assert (hop0.target, hop0.label, hop0.top_segment) == ("hop_answer", "read_right_fact", "hop0")
    assert (hop0.token_start, hop0.token_end) == MOLVIA
    assert (hop1.target, hop1.entity, hop1.label, hop1.top_segment) == ("wrong_answer", "Zerin", "read_distractor",
                                                                       "d1")
    assert hop1.entity_in_distractor
    assert hop0.label_value is None and hop0.vmass is None  # no value-weighted masses recorded
    # the reported category masses are the planted ones averaged directly (rows, window layers, heads)
    mass = planted({MOLVIA: 2, ZERIN: 5}).astype(np.float64)
    direct = mass[5:7, 3:6].mean(axis=(0, 1, 2))
    by_cat = dict(zip(CATEGORIES, hop0.mass))
    assert by_cat["hop"] == pytest.approx(direct[2])
    assert by_cat["other_germane"] == pytest.approx(direct[4])
    assert by_cat["extraneous"] == pytest.approx(direct[3] + direct[5])
    assert by_cat["question"] == pytest.approx(direct[6])
    assert by_cat["sink"] == pytest.approx(direct[0] + direct[7])
    assert sum(hop0.mass) == pytest.approx(1.0, abs=1e-5)
    assert out.masses[0].shape == (N_LAYERS, N_HEADS, len(CATEGORIES))


@pytest.mark.parametrize("zerin_to, label", [
    (4, "read_right_fact"),  # read the right fact (hop1) and still failed
    (2, "other"),  # another germane fact
    (3, "other"),  # a distractor that does not name Zerin
    (5, "read_distractor"),
])
def test_moving_the_wrong_answers_mass_changes_its_label(zerin_to, label):
    assert trial(planted({MOLVIA: 2, ZERIN: zerin_to})).rows[1].label == label


def test_mass_outside_the_depth_window_does_not_count():
    out = trial(planted({MOLVIA: 2, ZERIN: 5}, layers=range(0, 3)))  # lower half only
    assert [r.label for r in out.rows] == ["other", "other"]  # the window sees d0's slight preference
    assert [r.top_segment for r in out.rows] == ["d0", "d0"]


def test_a_correct_trial_tracks_the_gold_and_a_missing_hop_is_not_named():
    pieces_text = "".join(PIECES)
    assert "Arden" not in pieces_text
    out = trial(planted({MOLVIA: 2}), extracted="Arden", em=1.0)
    assert [(r.target, r.label, r.n_mentions) for r in out.rows] == [("hop_answer", "read_right_fact", 1),
                                                                      ("hop_answer", "not_named", 0)]


def test_value_weighted_masses_get_their_own_label():
    raw = planted({MOLVIA: 2, ZERIN: 5})
    value = planted({MOLVIA: 3, ZERIN: 4})
    out = trial(raw, value)
    assert [r.label for r in out.rows] == ["read_right_fact", "read_distractor"]
    assert [r.label_value for r in out.rows] == ["other", "read_right_fact"]
    assert [r.top_segment_value for r in out.rows] == ["d0", "hop1"]


def test_label_ties_and_content_only():
    kinds = ("sink", "germane", "extraneous", "question")
    pooled = np.array([0.9, 0.03, 0.03, 0.04, 0.0])  # the question and the sink are not content
    assert label_of(pooled, kinds, 1, [False, False, True, False]) == ("read_right_fact", 1)
    assert label_of(np.array([0.9, 0.02, 0.03, 0.05]), kinds, 1, [False, False, True, False]) == (
        "read_distractor", 2)


# ------------------------------------------------------------------------------------------------ cells


def test_cell_shares_equal_a_direct_count_and_intervals_proportion_ci():
    rng = np.random.default_rng(3)
    rows, masses = [], []
    base = HopRow(trial_id="", model="", task_id="", condition="", load=0, hop=0, n_hops=2, target="hop_answer",
                  entity="x", label="", label_value=None, top_segment=None, top_segment_value=None,
                  entity_in_distractor=False, n_mentions=1, token_start=0, token_end=1, mass=None, vmass=None)
    for model in ("a", "b"):
        for cond, load in (("Control", 0), ("Saturation", 50)):
            for q in range(6):
                for rep in range(2):
                    for hop in range(2):
                        label = str(rng.choice(HOP_LABELS))
                        target = "wrong_answer" if hop == 1 and rng.random() < 0.5 else "hop_answer"
                        named = label != "not_named"
                        rows.append(replace(base, trial_id=f"{model}{cond}{q}{rep}", model=model, task_id=f"q{q}",
                                            condition=cond, load=load, hop=hop, target=target, label=label,
                                            token_start=0 if named else None, token_end=1 if named else None))
                        masses.append(None if label == "not_named" else rng.random((4, 2, len(CATEGORIES))))
    cells = hop_cells(rows, masses, [None] * len(rows), {"a": (2, 4), "b": (2, 4)}, alpha=0.05)
    assert {c.measure for c in cells} == {"raw"}  # no value-weighted labels
    assert len(cells) == 2 * 2 * 3  # models x cells x subsets
    wanted = {"all": lambda r: True, "wrong_answer": lambda r: r.target == "wrong_answer",
              "correct_named": lambda r: r.target == "hop_answer" and r.label != "not_named"}
    for c in cells:
        sel = [i for i, r in enumerate(rows) if (r.model, r.condition, r.load) == (c.model, c.condition, c.load)
               and wanted[c.subset](r)]
        assert c.n == len(sel)
        assert c.n_questions == len({rows[i].task_id for i in sel})
        for s in c.shares:
            y = np.array([rows[i].label == s.label for i in sel], dtype=float)
            assert s.count == int(y.sum()) and s.share == pytest.approx(y.mean())
            ref = proportion_ci(y, np.array([rows[i].task_id for i in sel]), 0.05)
            assert (s.ci_low, s.ci_high) == (pytest.approx(ref.ci_low), pytest.approx(ref.ci_high))
        named = [masses[i] for i in sel if masses[i] is not None]
        assert c.grid is not None
        np.testing.assert_allclose(c.grid.values, np.mean(named, axis=0), rtol=1e-6)  # float32 storage
        assert c.mass == pytest.approx(tuple(np.mean(named, axis=0)[2:4].mean(axis=(0, 1))))


# -------------------------------------------------------------------------------------- run level, file


def run_inputs(tmp_path):
    from probe.prompts.builder import Piece, assemble
    from probe.runfolder import RunFolder
    from probe.types import Prompt

    body = [Piece("germane", HOPS[0].fact, "hop0"), Piece("extraneous", TEXTS[3], "d0"),
            Piece("germane", HOPS[1].fact, "hop1"), Piece("extraneous", TEXTS[5], "d1")]
    text, segs = assemble("Answer.", body, "What is the capital of Vorlan's birthplace?")
    prompt = Prompt("q|Saturation|L50|r0", "q", "synthetic", "Saturation", 50, 50.0, 0, text, segs)
    return RunFolder(tmp_path), [trial_record(prompt_id=prompt.prompt_id)], {prompt.prompt_id: prompt}, {"q": TASK}


def write_run(tmp_path, aa: AnswerAttention | None = None, with_tasks: bool = True):
    """The planted trial as a run folder: trials, prompts, tasks and (with ``aa``) its probe record on disk."""
    from probe.records import write_jsonl

    run, trials, prompts, tasks = run_inputs(tmp_path)
    write_jsonl(run.trials, [t.to_dict() for t in trials])
    write_jsonl(run.prompts, [p.to_dict() for p in prompts.values()])
    if with_tasks:
        write_jsonl(run.tasks, [t.to_dict() for t in tasks.values()])
    if aa is not None:
        save_answer_record(run, "m", trials[0].prompt_id, aa)
    return run, trials, prompts, tasks


def save_answer_record(run, model: str, prompt_id: str, aa: AnswerAttention) -> None:
    """A probe record holding ``aa`` (uniform question-row measures) where the runner would write it."""
    L, H = aa.n_layers, aa.n_heads
    SegmentAttention(
        measures={"seg_mass": np.full((L, H, len(KEY_KINDS)), 1 / len(KEY_KINDS), dtype=np.float32),
                  "p_ext": np.full((L, H), 0.25, dtype=np.float32)},
        chance=np.full(L, 0.25, dtype=np.float32), kinds=KEY_KINDS, segment_labels=aa.segment_labels,
        segment_kinds=aa.segment_kinds, segment_spans=aa.segment_spans, ar_targets=(), options={},
        n_tokens=aa.n_prompt, n_prompt_tokens=aa.n_prompt, n_queries=1, answer=aa,
    ).save(run.attention_record(model, prompt_id))


def test_a_run_without_answer_capture_is_skipped(tmp_path):
    from probe.analysis.hops import analyze_hops

    run, trials, prompts, tasks = run_inputs(tmp_path)
    assert analyze_hops([], tasks, prompts, 0.05) == (None, [])  # no probe record at all
    not_scored = replace(trials[0], em=None)
    assert analyze_hops([(not_scored, answer(planted({})))], tasks, prompts, 0.05) == (None, [])


def test_a_run_with_answer_capture_is_tracked_and_round_trips_through_the_file(tmp_path):
    from probe.analysis.hops import analyze_hops
    from probe.analysis.ice import IceResult
    from probe.analysis.results import from_json
    from probe.codec import encode

    run, trials, prompts, tasks = run_inputs(tmp_path)
    aa = answer(planted({MOLVIA: 2, ZERIN: 5}))
    result, notes = analyze_hops([(trials[0], aa)], tasks, prompts, 0.05)
    assert result.reason is None and result.n_trials == 1
    assert [r.label for r in result.rows] == ["read_right_fact", "read_distractor"]
    assert result.rows[1].entity_in_distractor  # d1's text (from the prompt record) names Zerin
    wrong = next(c for c in result.cells if c.subset == "wrong_answer")
    assert wrong.n == 1 and wrong.share_of("read_distractor").count == 1
    assert all(c.grid is not None for c in result.cells)
    ice = IceResult(models=("m",), cells=(), h1=(), h2=(), h3=(), residue_attention=(), attention_cells=(),
                    attention_behaviour=(), taxonomy=(), hop_tracking=result)
    arrays: dict[str, np.ndarray] = {}
    assert from_json(IceResult, encode(ice, arrays), arrays=arrays) == ice
    assert len(arrays) == len(result.cells) + 3 * sum(t.heads is not None for t in result.tests)
    empty = replace(ice, hop_tracking=None)
    assert "hop_tracking" not in encode(empty)  # a run without it writes the file it wrote before
    assert from_json(IceResult, encode(empty)) == empty  # and a file without it still reads
    # a record written before the runner recorded token spans: the trial is skipped, and the result says why
    skipped, notes = analyze_hops([(trials[0], replace(aa, chars=None))], tasks, prompts, 0.05)
    assert skipped.cells == () and "no token spans" in skipped.reason and skipped.n_skipped == 1


def _hops_page(h, ctx=None) -> str:
    from probe.config import AnalysisSection
    from probe.report import ice_hops
    from probe.report.blocks import ReportContext, to_html

    return to_html(ice_hops.blocks(h, 0.05), ctx or ReportContext(AnalysisSection()))


def test_report_part_with_and_without_hop_tracking(tmp_path):
    from probe.analysis.hops import analyze_hops
    from probe.analysis.ice import IceResult
    from probe.report.sections import report_section
    from probe.report.tables import csv_text

    run, trials, prompts, tasks = run_inputs(tmp_path)
    aa = answer(planted({MOLVIA: 2, ZERIN: 5}), planted({MOLVIA: 3, ZERIN: 4}))
    hops, _ = analyze_hops([(trials[0], aa)], tasks, prompts, 0.05)
    ice = IceResult(models=("m",), cells=(), h1=(), h2=(), h3=(), residue_attention=(), attention_cells=(),
                    attention_behaviour=(), taxonomy=(), hop_tracking=hops)
    section = report_section("ice")
    named = dict(section.tables(ice))
    cells, per_trial = named["hop_tracking"], named["hop_tracking_trials"]
    assert len(cells) == 6  # raw and value-weighted: all hops, the right entity named, wrong answers
    wrong_raw = next(r for r in cells if r["measure"] == "raw" and r["subset"] == "wrong_answer")
    assert wrong_raw["read_distractor_count"] == 1 and wrong_raw["n"] == 1
    right_raw = next(r for r in cells if r["measure"] == "raw" and r["subset"] == "correct_named")
    assert right_raw["n"] == 1 and right_raw["read_right_fact_count"] == 1  # the first hop, its own entity written
    assert [r["label"] for r in per_trial] == ["read_right_fact", "read_distractor"]
    assert [r["label_value"] for r in per_trial] == ["other", "read_right_fact"]
    assert "mass_hop" in csv_text(per_trial).splitlines()[0]
    page = _hops_page(hops)
    assert "value-weighted attention" in page and page.count("<tr>") == 1 + 3 + 1 + 3
    assert "right entity named" in page
    md = "\n".join(section.markdown(ice, AnalysisSection()))
    assert "## Hop tracking" in md and "read distractor" in md
    # without answer capture: the part says why, and no CSV is written
    none = replace(ice, hop_tracking=None)
    assert "hop_tracking" not in dict(section.tables(none))
    assert "Hop tracking not run: no probe record" in _hops_page(None)
    assert any("Hop tracking not run" in line for line in section.markdown(none, AnalysisSection()))


def test_a_run_folder_without_its_tasks_says_why(tmp_path):
    from probe.analysis import analyze_run

    run, *_ = write_run(tmp_path, answer(planted({})), with_tasks=False)
    result = analyze_run(run, AnalysisSection(embedder=""), seed=0).families["ice"].hop_tracking
    assert result.cells == () and "no tasks.jsonl" in result.reason and result.n_skipped == 1
    assert "probe run" in result.reason  # what to do


def test_report_draws_the_per_layer_figure_from_the_cells_arrays(tmp_path):
    from probe.analysis.hops import analyze_hops
    from probe.report.sections import ReportContext

    run, trials, prompts, tasks = run_inputs(tmp_path)
    aa = answer(planted({MOLVIA: 2, ZERIN: 5}))
    hops, _ = analyze_hops([(trials[0], aa)], tasks, prompts, 0.05)
    ctx = ReportContext(AnalysisSection(), tmp_path / "figures")
    page = _hops_page(hops, ctx)
    assert [p.name for p in ctx.written] == ["hop_layers_m.png"] and "<figure" in page
    bare = replace(hops, cells=tuple(replace(c, grid=None) for c in hops.cells))  # the figure is drawn from the grids
    none = ReportContext(AnalysisSection(), tmp_path / "none")
    _hops_page(bare, none)
    assert none.written == []


def test_answer_steps_page_shades_each_tokens_segments(tmp_path):
    import re

    from probe.report.hop_view import render_answer_steps

    t = len(PIECES)
    mass = planted({MOLVIA: 2, ZERIN: 5})
    aa = answer(mass)
    rows = trial(mass).rows
    page = render_answer_steps(aa, "".join(PIECES), spans_of(PIECES), rows, TEXTS, "m · q")
    assert page.count('<section class="step"') == t and page.count('<a href="#t') >= t
    assert page.count('class="m"') == (MOLVIA[1] - MOLVIA[0]) + (ZERIN[1] - ZERIN[0])  # the mentions' tokens
    first, last = MOLVIA[0], MOLVIA[1] - 1  # a hop's tokens, both ends inclusive, alike in its title and the table
    assert f"(tokens {first}–{last})" in page and f'<a href="#t{first}">{first}–{last}</a>' in page
    step = re.search(r'<section class="step" id="t5">(.*?)</section>', page).group(1)
    shown = [float(x) for x in re.findall(r"</span><span>([0-9.]+)</span>", step)]
    direct = mass[5, 3:6].astype(np.float64).mean(axis=(0, 1))  # token 5's row, window layers, heads pooled
    np.testing.assert_allclose(shown, direct, atol=5e-4)
    weighted = [replace(r, label_value="not_named") for r in rows]  # as a run with value-weighted mass has
    page_v = render_answer_steps(aa, "".join(PIECES), spans_of(PIECES), weighted, TEXTS, "m · q")
    table = page_v.split("<h2>Output</h2>")[0]  # the hops table: both labels in words and colour, never raw ids
    assert not re.search(r">[a-z]+_[a-z_]+<", table) and table.count(">not named</td>") == len(rows)
    assert table.count('style="color:') == 2 * len(rows)
    for kind in ("instruction", "question"):  # a segment named by its kind alone is named once, by its chip
        assert f'">{kind}</span>{kind}</span>' not in step
    one = render_answer_steps(aa, "".join(PIECES), spans_of(PIECES), rows, TEXTS, "m · q", layer=0, head=1)
    assert "layer 0, head 1" in one
    with pytest.raises(ValueError, match="layer 9 is out of range"):
        render_answer_steps(aa, "".join(PIECES), spans_of(PIECES), rows, TEXTS, "m · q", layer=9)


def test_answer_steps_page_of_a_run_folder(tmp_path):
    from probe.report import hop_view

    run, trials, prompts, tasks = write_run(tmp_path)
    pid = next(iter(prompts))
    with pytest.raises(Exception, match="no attention while the answer was written"):
        hop_view.write_answer_steps(run, "m", pid)
    run, *_ = write_run(tmp_path, answer(planted({MOLVIA: 2, ZERIN: 5})))
    path = hop_view.write_answer_steps(run, "m", pid)
    assert path.name.endswith(".answer.html") and path.parent.parent.name == "show"
    page = path.read_text()
    assert "read distractor" in page and "Zerin" in page
    run.tasks.unlink()
    with pytest.raises(Exception, match="tasks.jsonl"):
        hop_view.write_answer_steps(run, "m", pid)


def test_analyze_and_report_a_run_end_to_end(tmp_path):
    """analysis.json, attention_summary.npz, analysis.md, tables/*.csv and report.html of a run with answer capture
    (its records written as a probed run writes them)."""
    from probe.analysis import analyze_run, read_analysis
    from probe.report import render_report, write_tables

    run, *_ = write_run(tmp_path, answer(planted({MOLVIA: 2, ZERIN: 5})))
    analysis = analyze_run(run, AnalysisSection(embedder=""), seed=0)
    hops = analysis.families["ice"].hop_tracking
    assert [r.label for r in hops.rows] == ["read_right_fact", "read_distractor"]
    assert read_analysis(run) == analysis
    with np.load(run.attention_summary) as z:  # each cell's grid under its place in the analysis
        for i, c in enumerate(hops.cells):
            assert c.grid is not None
            np.testing.assert_array_equal(z[f"families.ice.hop_tracking.cells[{i}].grid"], c.grid.values)
    write_tables(analysis, run)
    assert (run.tables / "hop_tracking.csv").is_file() and (run.tables / "hop_tracking_trials.csv").is_file()
    assert "## Hop tracking" in run.analysis_md.read_text()
    page = render_report(run).read_text()
    assert "Hop tracking: what the model read" in page and (run.figures / "hop_layers_m.png").is_file()


def test_a_prompt_without_hop_labels_is_skipped_with_its_reason(tmp_path):
    from probe.analysis.hops import analyze_hops

    run, trials, prompts, tasks = run_inputs(tmp_path)
    unlabelled = tuple("ger" + lab[3:] if lab.startswith("hop") else lab for lab in LABELS)
    result, notes = analyze_hops([(trials[0], answer(planted({}), labels=unlabelled))], tasks, prompts, 0.05)
    assert result.cells == () and "carry no hop labels" in result.reason
    assert any("1 trial(s) skipped: its prompt's germane segments carry no hop labels" in n for n in notes)
