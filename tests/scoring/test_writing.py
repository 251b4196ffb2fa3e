"""What the model wrote: sentence counts and which germane fact an answer line restates (probe.scoring.writing)."""

from __future__ import annotations

import pytest

from probe.scoring.writing import count_sentences, restated_fact
from probe.types import Hop

CHAIN = (Hop("Vorlan was born in the city of Molvia.", "Molvia"),
         Hop("The city of Molvia lies in the valley of Tesh.", "Tesh"),
         Hop("The valley of Tesh is known for its copper mines.", "copper"))


@pytest.mark.parametrize("text, n", [
    (None, 0), ("", 0), ("   \n ", 0),
    ("Vorlan was born in Molvia.", 1),
    ("Vorlan was born in Molvia. Its capital is Tesh!", 2),
    ("The river is 3.5 km long. It ends in Tesh", 2),  # a decimal point does not break
    ("Step one\nStep two\n\nAnswer: Tesh", 3),  # every line break ends a sentence
    ("1. Vorlan was born in Molvia.\n2. Molvia lies in Tesh.", 2),  # a list marker alone is no sentence
    ("- \n* Tesh", 1),
])
def test_sentences_are_counted_at_stops_and_line_breaks(text, n):
    assert count_sentences(text) == n


@pytest.mark.parametrize("line, kind", [
    ("Vorlan was born in the city of Molvia.", "first"),
    ("The city of Molvia lies in the valley of Tesh", "bridge"),
    ("Tesh is known for its copper mines.", "last"),  # 4 of 5 content words of the last fact
    ("Vorlan was born in Molvia. Molvia lies in the valley of Tesh. Tesh is known for copper mines.", "all"),
    ("Molvia", "none"),  # a bare entity restates nothing
    ("copper", "none"),  # one content word is never a restatement
    ("The answer is copper, from the mines.", "none"),  # 2 of 5 content words: below the share
    (None, "none"),
])
def test_the_fact_an_answer_line_restates_is_named_by_its_place_in_the_chain(line, kind):
    assert restated_fact(line, CHAIN) == kind


def test_a_tie_names_the_later_fact_and_one_hop_is_last():
    three = (Hop("Kel owns the red boat."), Hop("Kel owns the red house."), Hop("The house stands in Orl."))
    assert restated_fact("Kel owns the red", three) == "bridge"  # kel, owns, red: 3 of 4 words of the first two
    assert restated_fact("Kel owns the red boat.", (Hop("Kel owns the red boat."),)) == "last"


def test_without_facts_the_restated_fact_is_not_known():
    assert restated_fact("anything at all", ()) is None
    assert restated_fact("anything at all", (Hop(""), Hop(" "))) is None
