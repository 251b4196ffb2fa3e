"""Fictional multi-hop questions: invented entities chained by plain one-sentence facts (docs/method.md#sources)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from probe.errors import ConfigError
from probe.types import Hop, Task

log = logging.getLogger(__name__)

# Syllable inventory. Onsets after a closed syllable are single consonants, so names stay pronounceable.
_ONSETS_SINGLE = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "h")
_ONSETS_CLUSTER = ("br", "dr", "kr", "tr", "th", "sh", "qu", "vr", "gr", "st", "fl", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "a", "e", "o", "ae", "io", "ei")
_CODAS_INNER = ("", "", "", "n", "r", "l", "s")
_CODAS_FINAL = ("", "", "n", "r", "l", "s", "th", "rn", "sk", "nd", "m", "x", "lt", "rd")
_PLACE_SUFFIXES = ("", "", "", "", "ia", "en", "ar", "oth", "ane", "ix")
_PERSON_ENDINGS = ("", "", "", "a", "o", "en", "el", "is")

# Every word of a name holds one of these letter groups, which English words and real names rarely contain, and
# does not end like a Latinate word. What the syllable grammar can still produce of a 30k-word English vocabulary
# (a BERT WordPiece list, filtered by the grammar) is listed in _REAL_NAMES and rejected.
_MARKERS = ("ae", "io", "ei", "vr")
_LATINATE_END = re.compile(r"(ion|ions|ious|ior|io|ios)$")
_REAL_NAMES = frozenset(
    """
    aegean aerial aero algae almeida anaheim andrei antennae beige brunei daemon deities eileen eine einstein
    either ethiopia faerie fein ferreira fiona gael giovanni graeme havre heidi heir holstein hussein iona israel
    israeli israelis keith larvae leiden leinster leisure leith linnaeus lionel louvre madeira maestro marseille
    mein national neil neither oliveira orioles pereira pioneer rafael rational regional rein reindeer reissue
    saetan seine seize seizure seizures sergei sheila sioux stein steiner taipei their veil vein vertebrae viola
    violate violin
    """.split()
)


@dataclass(frozen=True)
class _Topic:
    """One kind of fictional chain: four entity kinds linked by three relations.

    ``facts[i]`` are templates of the sentence linking ``e_i`` to ``e_{i+1}``; every template names ``e_i``
    before ``e_{i+1}``, so the facts read in the order the reasoning runs. A 2-hop question starts at
    ``e_{start2}`` and asks for ``e_{start2 + 2}``; a 3-hop question starts at ``e0`` and asks for ``e3``.
    """

    name: str
    kinds: tuple[str, str, str, str]
    facts: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
    question2: str
    question3: str
    start2: int = 0
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()


_PROFESSIONS = (
    "lighthouse keeper", "beekeeper", "clockmaker", "ferryman", "gardener", "bookbinder", "shepherd",
    "glassblower", "carpenter", "tailor", "miller", "blacksmith", "fisherman", "stonemason", "candle maker",
    "rope maker", "printer", "schoolteacher", "postman", "cook",
)  # fmt: skip

TOPIC_TEMPLATES: tuple[_Topic, ...] = (
    _Topic(
        name="birthplace",
        kinds=("person", "place", "place", "place"),
        facts=(
            (
                "The {role} {e0} was born in the {town_adj} town of {e1} and spent a quiet childhood there.",
                "Long before becoming well known, the {role} {e0} was born in {e1}, a small {town_adj} town.",
                "Old records show that the {role} {e0} was born in the {town_adj} town of {e1} one cold spring.",
            ),
            (
                "The town of {e1} lies in the province of {e2}, surrounded by wide fields of barley and rye.",
                "{e1} is a town in the province of {e2}, about a day's walk from the nearest coast.",
                "Visitors to {e1} often forget that the town belongs to the province of {e2}.",
            ),
            (
                "The province of {e2} is part of the country of {e3}, which it joined a very long time ago.",
                "{e2} is one of the provinces of the country of {e3} and sends its own delegates to the assembly.",
            ),
        ),
        question2="In which province was the {role} {e0} born?",
        question3="In which country was the {role} {e0} born?",
        extras=(
            ("role", ("painter", "poet", "composer", "sculptor", "weaver", "mapmaker", "potter", "singer")),
            ("town_adj", ("harbour", "mountain", "market", "mining", "fishing", "border", "hill")),
        ),
    ),
    _Topic(
        name="company",
        kinds=("thing", "thing", "person", "year"),
        facts=(
            (
                "The {product} called {e0} is made by the company {e1}, which designs it in its own workshops.",
                "Every {product} called {e0} is built by the company {e1}, according to the label on its base.",
            ),
            (
                "The company {e1} was founded by the engineer {e2}, who ran it for many years afterwards.",
                "The company {e1} was set up by the engineer {e2}, who had left a job at a much larger firm.",
            ),
            (
                "The engineer {e2} was born in the year {e3}, in a narrow house near a busy market.",
                "According to old family papers, the engineer {e2} was born in the year {e3}.",
            ),
        ),
        question2="In which year was the founder of the company {e1} born?",
        question3="In which year was the founder of the company that makes the {product} called {e0} born?",
        start2=1,
        extras=(
            ("product", ("bicycle", "lamp", "music box", "sewing machine", "camera", "typewriter", "wall clock")),
        ),
    ),
    _Topic(
        name="music",
        kinds=("thing", "thing", "thing", "place"),
        facts=(
            (
                "The band {e0} released its first album, {e1}, after several years of playing in small halls.",
                "The first album by the band {e0} was {e1}, recorded in a cold garage during one winter.",
            ),
            (
                "The album {e1} was released by the record label {e2}, which also paid for the studio time.",
                "The album {e1} came out on the record label {e2}, which sent copies to radio stations everywhere.",
            ),
            (
                "The record label {e2} has its main office in the city of {e3}, close to the old station.",
                "The record label {e2} is based in the city of {e3}, where it rents a few rooms above a bakery.",
            ),
        ),
        question2="Which record label released the first album of the band {e0}?",
        question3="In which city is the record label that released the first album of the band {e0} based?",
    ),
    _Topic(
        name="river",
        kinds=("thing", "place", "place", "place"),
        facts=(
            (
                "The river {e0} flows slowly past the city of {e1}, the largest city along its banks.",
                "The largest city on the banks of the river {e0} is {e1}, which grew up around an old bridge.",
            ),
            (
                "The city of {e1} is part of the region of {e2}, a land of farms and low green hills.",
                "The city of {e1} belongs to the region of {e2}, whose people are known for wool and cheese.",
            ),
            (
                "The capital of the region of {e2} is the city of {e3}, where the regional council meets.",
                "The regional council of {e2} meets every month in its capital, the city of {e3}.",
            ),
        ),
        question2="In which region is the largest city on the river {e0}?",
        question3="What is the capital of the region that contains the largest city on the river {e0}?",
    ),
    _Topic(
        name="invention",
        kinds=("thing", "person", "place", "place"),
        facts=(
            (
                "The {device} known as the {e0} was invented by {e1}, who built the first model in a workshop.",
                "The {device} known as the {e0} was designed by the inventor {e1} after many failed attempts.",
            ),
            (
                "The inventor {e1} studied at the University of {e2}, where the lectures were long and dull.",
                "As a young student, the inventor {e1} attended the University of {e2} and learned mathematics.",
            ),
            (
                "The University of {e2} stands in the city of {e3}, on a hill above the old market square.",
                "The University of {e2} is located in the city of {e3} and is famous for its large library.",
            ),
        ),
        question2="At which university did the inventor of the {device} known as the {e0} study?",
        question3="In which city is the university where the inventor of the {device} known as the {e0} studied?",
        extras=(("device", ("pump", "loom", "telescope", "compass", "engine", "printing press", "water clock")),),
    ),
    _Topic(
        name="sports",
        kinds=("person", "thing", "person", "place"),
        facts=(
            (
                "The {role} {e0} trains with the club {e1}, joining the team for practice every morning.",
                "The young {role} {e0} has been a member of the club {e1} since leaving school.",
            ),
            (
                "The club {e1} is coached by {e2}, who has led the team through many long seasons.",
                "The head coach of the club {e1} is {e2}, who is known for very strict training plans.",
            ),
            (
                "The coach {e2} grew up in the village of {e3}, near a lake surrounded by pine trees.",
                "As a child, the coach {e2} lived in the village of {e3}, far away from any large town.",
            ),
        ),
        question2="Who is the coach of the club of the {role} {e0}?",
        question3="In which village did the coach of the club of the {role} {e0} grow up?",
        extras=(("role", ("runner", "rower", "wrestler", "swimmer", "cyclist", "archer", "fencer")),),
    ),
    _Topic(
        name="literature",
        kinds=("thing", "person", "person", "profession"),
        facts=(
            (
                "The novel {e0} was written by the author {e1}, who finished it after many years of work.",
                "The novel {e0}, a long story about a family and its secrets, is the work of the author {e1}.",
            ),
            (
                "The author {e1} learned to write from an older writer named {e2}, a patient and kind teacher.",
                "The author {e1} was taught by the writer {e2}, who read every early draft with great care.",
            ),
            (
                "Before writing books, the writer {e2} worked as a {e3} in a small town for many years.",
                "The writer {e2} earned a living as a {e3} before turning to writing stories.",
            ),
        ),
        question2="Who taught the author of the novel {e0} to write?",
        question3="What did the teacher of the author of the novel {e0} work as before writing books?",
    ),
)

TOPICS: tuple[str, ...] = tuple(t.name for t in TOPIC_TEMPLATES)

_WORD = re.compile(r"[A-Za-z]+")
NAME_KINDS = frozenset({"person", "place", "thing"})  # entity kinds that get invented names (not years, professions)


def name_words(texts: Iterable[str]) -> set[str]:
    """The lowercased words of ``texts``, as :class:`NameDraw` compares names with words to avoid."""
    return {w.lower() for s in texts for w in _WORD.findall(s)}


def _template_words() -> frozenset[str]:
    """Every word the templates and word lists use: a name must never equal one of them."""
    texts: list[str] = []
    for t in TOPIC_TEMPLATES:
        texts += [s for rel in t.facts for s in rel] + [t.question2, t.question3]
        texts += [w for _, values in t.extras for w in values]
    texts += list(_PROFESSIONS)
    return frozenset(w.lower() for s in texts for w in _WORD.findall(s))


_TEMPLATE_WORDS = _template_words()


class NameDraw:
    """Draws invented names; no word of a name repeats within one draw, nor equals a template word."""

    def __init__(self, rng: np.random.Generator, avoid: Iterable[str] = ()) -> None:
        self._rng = rng
        self._used: set[str] = name_words(avoid)

    def _pick(self, options: tuple[str, ...]) -> str:
        return options[int(self._rng.integers(len(options)))]

    def _word(self, n_syllables: int, ending: tuple[str, ...]) -> str:
        parts: list[str] = []
        closed = False
        for i in range(n_syllables):
            use_cluster = not closed and self._rng.random() < 0.3
            onset = self._pick(_ONSETS_CLUSTER if use_cluster else _ONSETS_SINGLE)
            if i == 0 and self._rng.random() < 0.15:
                onset = ""  # a vowel-initial name now and then
            coda = self._pick(_CODAS_FINAL if i == n_syllables - 1 else _CODAS_INNER)
            parts.append(onset + self._pick(_VOWELS) + coda)
            closed = coda != ""
        word = "".join(parts)
        suffix = self._pick(ending)
        if suffix and word[-1] in "aeiou" and suffix[0] in "aeiou":
            word = word[:-1]
        return word + suffix

    def _is_new(self, word: str) -> bool:
        return (
            4 <= len(word) <= 10
            and any(m in word for m in _MARKERS)
            and not _LATINATE_END.search(word)
            and word not in self._used
            and word not in _TEMPLATE_WORDS
            and word not in _REAL_NAMES
        )

    def _fresh(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            words = [w.lower() for w in name.split()]
            if any(not self._is_new(w) for w in words):
                continue
            if len(set(words)) < len(words):
                continue
            self._used.update(words)
            return name
        raise RuntimeError("could not draw a fresh name in 1000 tries")  # the name space is far larger

    def draw(self, kind: str) -> str:
        """One fresh name of ``kind`` (person, place or thing); capitalised, one or two words."""
        if kind == "person":
            return self._fresh(
                lambda: self._word(2, _PERSON_ENDINGS).capitalize()
                + " "
                + self._word(int(self._rng.integers(1, 3)), ("",)).capitalize()
            )
        if kind == "place":
            return self._fresh(lambda: self._word(2, _PLACE_SUFFIXES).capitalize())
        if kind == "thing":
            return self._fresh(lambda: self._word(2, ("",)).capitalize())
        raise ValueError(f"unknown name kind {kind!r}")


def draw_chain(topic: _Topic, names: NameDraw, rng: np.random.Generator) -> tuple[list[str], dict[str, str]]:
    """The four entities of one chain and the values of the topic's extra template fields."""
    entities: list[str] = []
    for kind in topic.kinds:
        if kind == "year":
            entities.append(str(int(rng.integers(1760, 1990))))
        elif kind == "profession":
            entities.append(_PROFESSIONS[int(rng.integers(len(_PROFESSIONS)))])
        else:
            entities.append(names.draw(kind))
    extras = {key: values[int(rng.integers(len(values)))] for key, values in topic.extras}
    return entities, extras


def render_facts(topic: _Topic, entities: list[str], extras: dict[str, str], rng: np.random.Generator) -> list[str]:
    """The three fact sentences of a chain, each from a randomly chosen template of its relation."""
    fields = {f"e{i}": e for i, e in enumerate(entities)} | extras
    facts = []
    for rel in topic.facts:
        sentence = rel[int(rng.integers(len(rel)))].format(**fields)
        facts.append(sentence[0].upper() + sentence[1:])
    return facts


def generate_synthetic(n: int, hops: int, rng: np.random.Generator) -> list[Task]:
    """Draw ``n`` fictional ``hops``-hop questions, topics in rotation.

    The topic order is one permutation drawn first, then tasks are drawn one after another, so the first ``k``
    tasks of a draw of ``n > k`` equal a draw of ``k`` with the same seed. Task ids are ``syn<hops>-<index>``.

    Args:
        n: number of tasks (>= 1).
        hops: 2 or 3.
        rng: the seeded generator; the result is a function of its state alone.

    Returns:
        ``n`` tasks with ``source="synthetic"``, ``len(hops) == hops``, ``gold`` the last hop's answer.

    Raises:
        ConfigError: ``hops`` is not 2 or 3, or ``n < 1``.
    """
    if hops not in (2, 3):
        raise ConfigError(f"tasks.hops: {hops}; the synthetic source makes 2- or 3-hop questions")
    if n < 1:
        raise ConfigError(f"tasks.n: {n} must be >= 1")
    order = rng.permutation(len(TOPIC_TEMPLATES))
    names = NameDraw(rng)
    tasks: list[Task] = []
    for i in range(n):
        topic = TOPIC_TEMPLATES[int(order[i % len(TOPIC_TEMPLATES)])]
        entities, extras = draw_chain(topic, names, rng)
        facts = render_facts(topic, entities, extras, rng)
        start = topic.start2 if hops == 2 else 0
        template = topic.question2 if hops == 2 else topic.question3
        question = template.format(**({f"e{j}": e for j, e in enumerate(entities)} | extras))
        chain_hops = tuple(Hop(fact=facts[j], answer=entities[j + 1]) for j in range(start, start + hops))
        tasks.append(
            Task(
                task_id=f"syn{hops}-{i:04d}",
                source="synthetic",
                question=question,
                gold=entities[start + hops],
                hops=chain_hops,
                topic=topic.name,
                meta={"n_hops": hops},
            )
        )
    log.debug("drew %d synthetic %d-hop tasks", n, hops)
    return tasks
