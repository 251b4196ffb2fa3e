"""Behavioural scoring: extraction, normalisation, numeric tolerance, set and mapping golds, hop recall, truncation."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from probe.scoring.answers import REL_TOL, exact_match, extract_answer, hop_recall, normalize_answer, score_output
from probe.types import Hop, Task

# --- extraction ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (r"so \boxed{Molvia}", "Molvia"),
        (r"\boxed{a {b {c}} d}", "a {b {c}} d"),  # nested braces
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{Quellin} then \boxed{Molvia}.", "Molvia"),  # the last box wins
        (r"\boxed{Quellin} and later \boxed{Molv", "Quellin"),  # an unclosed box is not an answer
        (r"$\boxed{\text{Molvia}}$", "Molvia"),
        (r"\boxed{\textbf{\text{Zarn Ol}}}", "Zarn Ol"),
        (r"\boxed {11.1}", "11.1"),
        ("Step 1.\nAnswer: Molvia", "Molvia"),
        ("**Final Answer:** Molvia.", "Molvia."),
        ("Answer: Quellin\nthinking again\nANSWER: Molvia\nDone, I hope.", "Molvia"),  # last Answer line
        ("Reasoning.\n**Answer:**\n\nThe city is **Molvia**.\n", "The city is Molvia."),  # label on its own line
        ("line one\n\nThe answer is Molvia  \n\n", "The answer is Molvia"),  # last non-empty line
        ("- Molvia", "Molvia"),
        ("Molvia", "Molvia"),
        ("", None),
        ("  \n\t\n", None),
        (r"It is \boxed{}", None),  # an empty answer slot
        ("Answer:   ", None),
    ],
)
def test_extract_answer(output: str, expected: str | None) -> None:
    assert extract_answer(output) == expected


def test_boxed_beats_a_later_answer_line() -> None:
    assert extract_answer("\\boxed{Quellin}\nAnswer: Molvia") == "Quellin"


# --- normalisation -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The  Molvia.", "molvia"),
        ("An apple, a pear and the plum!", "apple pear and plum"),
        ("Régine Chassagne", "regine chassagne"),
        ("Quellin's  harbour", "quellin s harbour"),
        ("  \"Zarn-Ol\" ", "zarn ol"),
        ("Theatre", "theatre"),  # an article only as a whole word
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


# --- exact match ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("Molvia", "Molvia", True),
        ("the molvia.", "Molvia", True),
        ("Vorlan was born in Molvia", "Molvia", True),  # the gold as a whole phrase inside the answer
        ("Molvian", "Molvia", False),
        ("Molvia", "Vorlan Molvia", False),
        ("Zarn Ol", "zarn-ol", True),
        ("11,100,000,000", "11.1 billion", True),
        ("$11.1 billion", "11.1 billion", True),
        ("11.1", "11.1 billion", True),  # asked "in billions"
        ("11.1 million", "11.1 billion", False),
        ("1,850", "1850", True),
        ("1850", "1,850", True),
        ("born in 1875", "1874", False),  # neighbouring years stay apart
        ("49.67 minutes", "49.667 minutes", True),  # 6e-5 relative
        ("49.7 minutes", "49.667 minutes", False),  # 7e-4 relative
        ("75.35 km2", "75.35 square kilometers", True),
        ("100%", "100", True),
        ("four", "4", True),
        ("31st", "31", False),  # an ordinal is not the number
        ("yes", "no", False),
        ("", "Molvia", False),
        (None, "Molvia", False),
    ],
)
def test_exact_match_strings_and_numbers(answer: str | None, gold: str, expected: bool) -> None:
    assert exact_match(answer, gold) is expected


def test_numeric_tolerance_agrees_with_isclose() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        gold = float(rng.uniform(1, 1e7))
        factor = 1 + float(rng.choice([-1, 1])) * float(rng.uniform(0, 3 * REL_TOL))
        answer = gold * factor
        text = f"{answer:.6f}"
        expected = math.isclose(float(text), float(f"{gold:.6f}"), rel_tol=REL_TOL)
        assert exact_match(text, f"{gold:.6f}") is expected, (text, gold)


def test_list_gold_needs_every_element() -> None:
    gold = ["Pat Burrell", "Mark Mulder", "JD Drew"]
    assert exact_match("JD Drew, Pat Burrell and Mark Mulder", gold)
    assert not exact_match("Pat Burrell and Mark Mulder", gold)
    assert exact_match("2006, 2012 and 1995", ["2006", "2012", "2006", "1995"])
    assert not exact_match("2006 and 2012", ["2006", "2012", "1995"])
    assert not exact_match("anything", [])


def test_mapping_gold_needs_every_value_not_the_keys() -> None:
    gold = {"Pat Burrell": "Right", "Mark Mulder": "Left"}
    assert exact_match("Pat Burrell: Right; Mark Mulder: Left", gold)
    assert exact_match("Right and Left", gold)  # values are what is scored
    assert not exact_match("Pat Burrell: Right; Mark Mulder: unknown", gold)
    assert not exact_match("Pat Burrell, Mark Mulder", gold)
    assert exact_match("Steve Chen is 45, Chad Hurley 46", {"Steve Chen": "45", "Chad Hurley": "46"})


# --- hop recall ----------------------------------------------------------------------------------------------------


def test_hop_recall() -> None:
    hops = (Hop("f1", "Quellin"), Hop("f2", "Zogroum"), Hop("f3", "1920"), Hop("f4", None))
    assert hop_recall("Born in Quellin, founded 1920.", hops) == pytest.approx(2 / 3)
    assert hop_recall("Quellin, in Zogroum, 1,920", hops) == pytest.approx(1.0)
    assert hop_recall("Quellins", hops) == 0.0
    assert hop_recall("anything", (Hop("f", None), Hop("g", "  "))) is None
    assert hop_recall("", hops) == 0.0


# --- score_output: EM on the extracted answer, truncation and interpretability ------------------------------------

TASK = Task("t", "synthetic", "In which country was Vorlan born?", "Molvia",
            (Hop("Vorlan was born in Quellin.", "Quellin"), Hop("Quellin lies in Molvia.", "Molvia")))


def test_em_compares_the_extracted_answer_not_the_whole_output() -> None:
    out = "Quellin lies in Molvia, but I think the text means Tarsk.\n\\boxed{Tarsk}"
    s = score_output(out, TASK, truncated=False)
    assert s.answer == "Tarsk" and not s.em and s.hop_recall == 1.0 and not s.uninterpretable
    s = score_output("Vorlan was born in Quellin.\n\\boxed{Vorlan was born in Molvia}", TASK, truncated=False)
    assert s.em and s.extraction == "boxed"


def test_truncated_and_uninterpretable() -> None:
    cut = score_output("Vorlan was born in Quellin, which lies in the", TASK, truncated=True)
    assert cut.uninterpretable and cut.answer is None and not cut.em and cut.truncated
    assert cut.hop_recall == 0.5  # the reasoning still counts for hop recall
    boxed_then_cut = score_output("\\boxed{Molvia} because Quellin lies in", TASK, truncated=True)
    assert not boxed_then_cut.uninterpretable and boxed_then_cut.em and boxed_then_cut.truncated
    line_then_cut = score_output("Answer: Molvia\nBecause Quellin", TASK, truncated=True)
    assert not line_then_cut.uninterpretable and line_then_cut.em
    finished = score_output("I am not sure where.", TASK, truncated=False)
    assert not finished.uninterpretable and finished.answer == "I am not sure where." and not finished.em
    for empty in (None, "", "  \n"):
        s = score_output(empty, TASK, truncated=False)
        assert s.uninterpretable and s.answer is None and not s.em and s.hop_recall == 0.0
    slot = score_output("Quellin lies in Molvia.\n\\boxed{}", TASK, truncated=False)
    assert slot.uninterpretable and not slot.em and slot.hop_recall == 1.0


def test_the_rule_that_decided_is_the_scores_extraction() -> None:
    decided = {
        "Quellin lies in Molvia.\n\\boxed{Molvia}": "boxed",
        "Quellin lies in Molvia.\nAnswer: Molvia": "answer_line",
        "Vorlan was born in Quellin, in Molvia.": "last_line",
        "": "none",
    }
    for out, rule in decided.items():
        assert score_output(out, TASK, truncated=False).extraction == rule, out
    cut = score_output("Vorlan was born in Quellin, which lies in", TASK, truncated=True)
    assert cut.extraction == "none" and cut.uninterpretable  # a cut-off last line decides nothing


# --- the echo rule: a fallback line that names the gold only as its own repeated subject is not an answer -----------

LABEL = Task("label", "synthetic", "Which record label released the first album of the band Zorvik?", "Mirhei",
             (Hop("The band Zorvik released its first album, Veisrex.", "Veisrex"),
              Hop("The album Veisrex was released by the record label Mirhei.", "Mirhei")))


ECHOES = [
    "The record label Mirhei was released by the record label Mirhei",  # seen from Qwen2.5-Coder-0.5B
    "The record label Mirhei was released by the record label Mirhei.",
    # seen from Qwen2.5-Coder-0.5B under Saturation-80: the fact's own clause copied after the echo
    "The record label Mirhei was released by the record label Mirhei, which also paid for the studio time.",
    "Step by step, the band Zorvik.\nThe record label Mirhei is the record label Mirhei.",
    "Mirhei, Mirhei.",
    "The first album of the record label Mirhei was released by Mirhei.",
]
ANSWERS = [
    "The record label Mirhei released the first album of the band Zorvik.",  # once: the question answered
    "The album Veisrex was released by the record label Mirhei.",
    "Mirhei released Veisrex, so the answer is Mirhei.",  # says more than the question: Veisrex, answer
    "The record label Mirhei released the first album of the band Zorvik, Mirhei.",  # related to the asked name
    "Based on the information provided, the record label released the first album of the band Zorvik by Mirhei.",
    "Zorvik's first album came out on Mirhei; it is Mirhei that released it, not Kessel.",
    "The answer is Mirhei.",
    "Mirhei",
]


@pytest.mark.parametrize("out, echo", [(o, True) for o in ECHOES] + [(o, False) for o in ANSWERS])
def test_an_echo_of_the_gold_is_not_credited_and_a_legitimate_last_sentence_is(out: str, echo: bool) -> None:
    s = score_output(out, LABEL, truncated=False)
    assert s.em is not echo and s.extraction == ("echo" if echo else "last_line") and s.answer, out
    assert not s.uninterpretable


@pytest.mark.parametrize("out", [
    "\\boxed{The record label Mirhei was released by the record label Mirhei}",
    "Answer: The record label Mirhei was released by the record label Mirhei",
])
def test_a_marked_answer_is_never_refused_as_an_echo(out: str) -> None:
    s = score_output(out, LABEL, truncated=False)
    assert s.em and s.extraction in ("boxed", "answer_line")


def test_the_echo_rule_leaves_numbers_and_wrong_lines_alone() -> None:
    year = Task("y", "synthetic", "In which year was the founder of the company Tarsk born?", "1850", ())
    assert score_output("The founder was born in 1850, in 1850.", year, truncated=False).em
    wrong = score_output("The record label Kessel was released by the record label Kessel", LABEL, truncated=False)
    assert not wrong.em and wrong.extraction == "last_line"  # wrong anyway: the rule only withholds credit


def test_score_with_list_and_mapping_gold() -> None:
    listed = Task("l", "x", "q", ["Ann Lee", "Bo Ray"], ())
    assert score_output("\\boxed{Bo Ray and Ann Lee}", listed, truncated=False).em
    assert not score_output("Ann Lee and Bo Ray founded it.\n\\boxed{Ann Lee}", listed, truncated=False).em
    mapped = Task("m", "x", "q", {"Ann Lee": "45", "Bo Ray": "46"}, ())
    s = score_output("Answer: Ann Lee is 45 and Bo Ray is 46.", mapped, truncated=False)
    assert s.em and s.hop_recall is None


# --- real outputs: the ICE paper's published Gemini answers ------------------------------------------------------

# the raw outputs published with the ICE paper's public code (720 rows, all answering one question whose gold is
# "11.1 billion"; the file begins with an empty line), kept as a fixture
_PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "ice-paper-published-outputs.csv"


def test_paper_style_outputs() -> None:
    """Answer formats seen in published outputs for the gold "11.1 billion"."""
    gold = Task("sec", "x", "q", "11.1 billion", ())
    for out in (
        "Year-over-year growth = $11.1 billion\n\nANSWER: 11.1\n",
        "**Answer:** The growth was $\\boxed{11.1}$ billion dollars.",
        "**Answer:**\n\nThe fiscal year is FY2023.\n\n* FY2023: $82.5 billion\n\nGrowth: $11.1 billion\n",
    ):
        assert score_output(out, gold, truncated=False).em, out


def test_agrees_with_the_published_accuracy_of_complete_answers() -> None:
    """Gemini-2.0-Flash answered in full (no truncation); the paper's own accuracy column is the reference."""
    rows = list(csv.DictReader(_PUBLISHED.read_text().lstrip("\n").splitlines(True)))
    checked = 0
    for r in rows:
        if r["model"] != "gemini-2.0-flash" or "rate-limits" in r["output"] or r["output"].startswith("API_ERROR"):
            continue
        s = score_output(r["output"], Task("sec", "x", "q", r["ground_truth"], ()), truncated=False)
        assert float(s.em) == float(r["accuracy"]), r["output"][-300:]
        checked += 1
    assert checked >= 50


def test_trial_records_carry_the_rule_that_decided() -> None:
    """The runner writes the score's extraction into the trial record; a backend error records none."""
    from probe.backends.base import Generation
    from probe.records import TrialRecord
    from probe.runner.trials import make_record
    from probe.types import Prompt

    prompt = Prompt("label|Control|L0|r0", "label", "synthetic", "Control", 0, 0.0, 0, LABEL.question, ())
    echo = make_record("m", prompt, LABEL, Generation("The record label Mirhei was released by the record label "
                                                      "Mirhei", truncated=False))
    assert echo.extraction == "echo" and echo.em == 0.0
    assert TrialRecord.from_dict(echo.to_dict()).extraction == "echo"
    boxed = make_record("m", prompt, LABEL, Generation("\\boxed{Mirhei}", truncated=False))
    assert boxed.extraction == "boxed" and boxed.em == 1.0
    assert make_record("m", prompt, LABEL, Generation(None, truncated=False, error="timeout")).extraction is None
