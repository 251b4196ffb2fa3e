"""CogniLoad generator and scoring: an independent re-execution of the puzzle text, the counts of docs/cogniload.md,
seeding.

The checker below knows nothing of the generator's internals: it reads the prompt body as a reader would (with
regular expressions on the sentence templates), replays the statements from the initial state, and compares the
outcome with the task's gold answer and with the germane / extraneous labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from probe.config import load_config
from probe.errors import ConfigError, ProbeError
from probe.scoring.cogniload import score_cogniload, split_sentences
from probe.tasks.options import CogniloadOptions
from probe.tasks.cogniload import CATEGORIES, PEOPLE, generate_puzzle, generate_tasks
from probe.types import Hop, Task

GRID_D = (1, 3, 5, 7, 10)
GRID_N = (20, 50, 100, 250)
GRID_RHO = (5, 25, 50, 75, 95)

# --------------------------------------------------------------------------------------------------------------
# Independent checker


@dataclass
class Replay:
    names: list[str]
    categories: list[str]
    values: dict[str, list[str]]
    initial: dict[str, dict[str, str]]
    final: dict[str, dict[str, str]]
    poi: str
    asked: str
    needle_flags: list[bool]  # per statement: did it change the PoI
    n_statements: int


FRAMING = re.compile(
    r"^This puzzle is about (\d+) people: (.+?)\. Each person has (.+?)\. The possible values are: (.+?)\. "
    r"The statements below are applied one after another"
)
PERSON = re.compile(r"^(\w+) has (.+)\.$")
STATEMENT = re.compile(r"^(\d+)\. Every person (.+) now has (.+)\.$")
QUESTION = re.compile(r"^After all (\d+) statements, what is the (.+) of (\w+)\?$")


def _split_list(text: str) -> list[str]:
    """'a', 'a and b', 'a, b and c' -> items."""
    head, _, last = text.rpartition(" and ")
    return (head.split(", ") if head else []) + [last]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def replay(task: Task) -> Replay:
    """Parse the prompt body and question of ``task`` and execute the statements in order."""
    lines = [text for _, text in task.segments]
    m = FRAMING.match(lines[0])
    assert m, lines[0]
    n_people = int(m.group(1))
    names = _split_list(m.group(2))
    categories = [re.sub(r"^an? ", "", c) for c in _split_list(m.group(3))]
    values: dict[str, list[str]] = {}
    for part in m.group(4).split("; "):
        cat, _, vals = part.partition(": ")
        values[cat] = vals.split(", ")
    assert len(names) == n_people and list(values) == categories
    cat_alt = "|".join(re.escape(c) for c in sorted(categories, key=len, reverse=True))
    attr = re.compile(rf"the ({cat_alt}) (\S+?)(?=, | and |$)")
    cond = re.compile(rf"whose ({cat_alt}) is (\S+?)(?=, | and |$)")

    state: dict[str, dict[str, str]] = {}
    i = 1
    while i < len(lines) and (pm := PERSON.match(lines[i])) and not STATEMENT.match(lines[i]):
        who, pairs = pm.group(1), attr.findall(pm.group(2))
        assert pm.group(2) == _join([f"the {c} {v}" for c, v in pairs]), lines[i]
        attrs = dict(pairs)
        assert who in names and who not in state and list(attrs) == categories, lines[i]
        state[who] = attrs
        i += 1
    assert list(state) == names
    initial = {p: dict(s) for p, s in state.items()}
    q = QUESTION.match(task.question)
    assert q, task.question
    poi, asked = q.group(3), q.group(2)

    flags: list[bool] = []
    for k, line in enumerate(lines[i:], 1):
        sm = STATEMENT.match(line)
        assert sm and int(sm.group(1)) == k, line
        conds = cond.findall(sm.group(2))
        upds = attr.findall(sm.group(3))
        # the template must be read back completely: the parsed parts rebuild the sentence
        assert sm.group(2) == _join([f"whose {c} is {v}" for c, v in conds]), line
        assert sm.group(3) == _join([f"the {c} {v}" for c, v in upds]), line
        assert all(v in values[c] for c, v in conds + upds), line
        matched = [p for p in names if all(state[p][c] == v for c, v in conds)]
        before = {p: dict(s) for p, s in state.items()}
        for p in matched:
            state[p].update(dict(upds))
        flags.append(state[poi] != before[poi])
        # the rules of docs/cogniload.md#a-puzzle that must hold after every statement
        assert any(state[p] != state[poi] for p in names if p != poi), f"all others equal the PoI after {line}"
        if poi in matched:
            assert state[poi] != before[poi], f"a statement matching the PoI must change it: {line}"
            assert len(matched) < len(names), f"a needle matched everyone: {line}"
        else:
            assert state != before, f"a hay statement changed nobody: {line}"
    return Replay(names, categories, values, initial, state, poi, asked, flags, int(q.group(1)))


def spec_needles(n: int, rho: float) -> int:
    return max(1, min(n, round(n * rho / 100)))


def check_task(task: Task, d: int, n: int, rho: float) -> None:
    r = replay(task)
    assert r.n_statements == n and sum(1 for k, _ in task.segments[1 + len(r.names):]) == n
    assert len(r.names) == max(d, 2) == len(set(r.names))
    assert len(r.categories) == d == len(set(r.categories))
    assert all(len(v) == max(d + 1, 3) == len(set(v)) for v in r.values.values())
    rows = [tuple(s[c] for c in r.categories) for s in r.initial.values()]
    assert len(set(rows)) == len(rows), "two people start identical"
    assert r.poi in r.names and r.asked in r.categories
    assert task.gold == r.final[r.poi][r.asked]
    # needles: exactly the statements that change the PoI, as many as docs/cogniload.md says, labelled germane
    assert sum(r.needle_flags) == spec_needles(n, rho) == task.meta["n_needles"]
    kinds = [k for k, _ in task.segments]
    assert kinds[0] == "instruction"
    assert kinds[1 : 1 + len(r.names)] == ["germane" if p == r.poi else "extraneous" for p in r.names]
    assert kinds[1 + len(r.names):] == ["germane" if f else "extraneous" for f in r.needle_flags]
    needle_texts = [t for (k, t), f in zip(task.segments[1 + len(r.names):], r.needle_flags) if f]
    assert [h.fact for h in task.hops] == needle_texts and all(h.answer is None for h in task.hops)
    assert (task.meta["d"], task.meta["N"], task.meta["rho"], task.meta["poi"]) == (d, n, rho, r.poi)
    assert task.source == "cogniload" and task.topic == "cogniload"


# --------------------------------------------------------------------------------------------------------------
# Generator


def test_whole_grid_replays_to_the_gold_answer() -> None:
    """1500 puzzles over the paper's full grid, each re-executed from its text."""
    section = CogniloadOptions(n=15, difficulty=GRID_D, length=GRID_N, needle_ratio=GRID_RHO)
    tasks = generate_tasks(section, seed=7)
    assert len(tasks) == 15 * len(GRID_D) * len(GRID_N) * len(GRID_RHO)
    assert len({t.task_id for t in tasks}) == len(tasks)
    for t in tasks:
        check_task(t, int(t.meta["d"]), int(t.meta["N"]), t.meta["rho"])


def test_checker_detects_corrupted_puzzles() -> None:
    """The checker is not vacuous: a wrong gold, a mislabelled needle or a missing statement fail it."""
    import dataclasses

    task = generate_puzzle(5, 50, 50, np.random.default_rng(8))
    check_task(task, 5, 50, 50)
    pool = next(c.values for c in CATEGORIES if c.name == task.meta["category"])
    wrong_gold = dataclasses.replace(task, gold=next(v for v in pool if v != task.gold))
    first_needle = next(i for i, (k, t) in enumerate(task.segments) if k == "germane" and t[0].isdigit())
    segs = list(task.segments)
    segs[first_needle] = ("extraneous", segs[first_needle][1])
    mislabelled = dataclasses.replace(task, segments=tuple(segs))
    dropped = dataclasses.replace(task, segments=task.segments[:-1])
    for bad in (wrong_gold, mislabelled, dropped):
        with pytest.raises(AssertionError):
            check_task(bad, 5, 50, 50)


@pytest.mark.parametrize("rho", [5, 12.5, 33, 95])
def test_off_grid_values_and_small_n(rho: float) -> None:
    rng = np.random.default_rng(3)
    for d in (1, 2, 4, 10):
        for n in (1, 2, 7):
            check_task(generate_puzzle(d, n, rho, rng), d, n, rho)


def test_needle_positions_are_a_uniform_subset() -> None:
    """The sequential rule P(needle) = left/remaining places the n0 needles uniformly over the N steps."""
    section = CogniloadOptions(n=1200, difficulty=(1,), length=(20,), needle_ratio=(25,))
    counts = np.zeros(20)
    for t in generate_tasks(section, seed=11):
        counts += [k == "germane" for k, _ in t.segments[3:]]  # 2 people: framing + 2 initial sentences
    assert counts.sum() == 1200 * 5
    assert stats.chisquare(counts).pvalue > 1e-3


def test_statement_sizes_cover_one_to_d() -> None:
    rng = np.random.default_rng(5)
    ks, ms = set(), set()
    for _ in range(30):
        task = generate_puzzle(3, 50, 50, rng)
        for _, text in task.segments[4:]:
            head, _, tail = text.partition(" now has ")
            ks.add(head.count(" whose "))
            ms.add(tail.count("the "))
    assert ks == {1, 2, 3} and ms == {1, 2, 3}


def test_same_seed_same_tasks_other_seed_different() -> None:
    section = CogniloadOptions(n=3, difficulty=(3, 7), length=(20, 50), needle_ratio=(25, 75))
    a, b, c = generate_tasks(section, 1), generate_tasks(section, 1), generate_tasks(section, 2)
    assert a == b
    assert [t.task_id for t in a] == [t.task_id for t in c]
    assert sum(x.segments != y.segments for x, y in zip(a, c)) == len(a)
    assert len({t.segments for t in a}) == len(a)  # the puzzles of one cell differ from one another


def test_a_puzzle_does_not_depend_on_the_rest_of_the_grid() -> None:
    small = CogniloadOptions(n=2, difficulty=(5,), length=(50,), needle_ratio=(50,))
    big = CogniloadOptions(n=4, difficulty=(1, 5), length=(20, 50), needle_ratio=(5, 50))
    by_id = {t.task_id: t for t in generate_tasks(big, 9)}
    for t in generate_tasks(small, 9):
        assert by_id[t.task_id] == t
    assert "cl-d5-N50-r50-0001" in by_id


def test_task_round_trips_through_dict() -> None:
    t = generate_puzzle(5, 20, 50, np.random.default_rng(0), index=3)
    assert t.task_id == "cl-d5-N20-r50-0003"
    assert Task.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(difficulty=(0,)), "tasks.difficulty"),
        (dict(difficulty=(12,)), "tasks.difficulty"),
        (dict(length=(0,)), "tasks.length"),
    ],
)
def test_bad_grid_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        generate_tasks(CogniloadOptions(n=1, **kwargs), 0)


def test_a_negative_seed_is_an_error() -> None:
    with pytest.raises(ConfigError, match="seed"):
        generate_tasks(CogniloadOptions(n=1), -1)
    with pytest.raises(ConfigError, match="rho"):
        generate_puzzle(3, 20, 99, np.random.default_rng(0))


def test_vocabulary_is_unambiguous() -> None:
    """Values are unique words across categories and never a name or a category word: answers can be matched."""
    words = [v.lower() for c in CATEGORIES for v in c.values]
    assert len(words) == len(set(words)) and all(re.fullmatch(r"[a-z]+", w) for w in words)
    names = {p.lower() for p in PEOPLE}
    alias_words = {w for c in CATEGORIES for a in c.aliases for w in a.split()}
    assert not names & set(words) and not alias_words & set(words) and not names & alias_words
    assert all(len(c.values) >= 11 for c in CATEGORIES) and len(CATEGORIES) >= 10 and len(PEOPLE) >= 10


# --------------------------------------------------------------------------------------------------------------
# Scoring


def _task(gold: str = "archery", poi: str = "Lena", category: str = "hobby") -> Task:
    return Task(
        task_id="cl-test",
        source="cogniload",
        question=f"After all 3 statements, what is the {category} of {poi}?",
        gold=gold,
        hops=(Hop("1. Every person whose hobby is chess now has the hobby archery."),),
        topic="cogniload",
        meta={"d": 1, "N": 3, "rho": 50, "poi": poi, "category": category},
    )


@pytest.mark.parametrize(
    ("output", "em", "case"),
    [
        ("Lena's hobby is archery.", 1.0, "poi_category"),
        ("LENA'S HOBBY IS ARCHERY!", 1.0, "poi_category"),
        # a right value early, a wrong one later about the PoI and the category: the last one decides
        ("Lena's hobby is archery after step 2. In the end Lena's hobby is chess.", 0.0, "poi_category"),
        ("After step 2 Lena does archery. Step 3 moves Lena to chess. So the answer is chess.", 0.0, "poi"),
        # a wrong value early, the right one later
        ("Lena's hobby is chess at step 1. Finally, Lena's hobby is archery.", 1.0, "poi_category"),
        # the last sentence about the PoI names no category; the last sentence is about someone else
        ("Brent's hobby is fencing. In the end Lena does archery. Brent's hobby is chess.", 1.0, "poi"),
        # the PoI is not named at all: the box decides
        ("Working through the statements.\nThe answer is \\boxed{archery}", 1.0, "boxed"),
        # ... and without a box, the last sentence, which gives no value here
        ("Working through the statements. The answer is archery. Done", 0.0, None),
        ("Working through the statements. The answer is archery.", 1.0, "last"),
        # an Answer: line decides over the sentences
        ("Lena's hobby is chess.\nFinal answer: archery", 1.0, "answer_line"),
        ("Lena's hobby is archery.\n**Answer:** chess", 0.0, "answer_line"),
        # a sentence that names several values of the category gives none; nothing else gives one
        ("Lena's hobby could be archery, chess or fencing.", 0.0, None),
        # a transition gives the new value
        ("Lena's hobby changes from chess to archery.", 1.0, "poi_category"),
        ("Lena's hobby changes from archery to chess.", 0.0, "poi_category"),
        ("Lena's hobby is archery. Then Lena's hobby changes from archery to chess.", 0.0, "poi_category"),
        ("Lena's hobby: chess -> archery.", 1.0, "poi_category"),
        ("Lena's hobby: chess → archery.", 1.0, "poi_category"),
        ("Lena's hobby goes chess to archery.", 1.0, "poi_category"),
        # negations
        ("Lena's hobby is not archery.", 0.0, None),
        ("Lena's hobby isn't archery.", 0.0, None),
        ("Lena's hobby is not chess but archery.", 1.0, "poi_category"),
        ("The hobby of Lena is archery, not chess.", 1.0, "poi_category"),
        ("Lena no longer does archery; her hobby is chess.", 0.0, "poi_category"),
        ("Lena's hobby is archery rather than chess.", 1.0, "poi_category"),
        ("Lena's hobby is archery instead of chess.", 1.0, "poi_category"),
        # a question is not a statement: the restated question at the end is skipped
        ("Lena's hobby is archery.\nWhat is the hobby of Lena?", 1.0, "poi_category"),
        ("Is Lena's hobby chess? No, Lena's hobby is archery.", 1.0, "poi_category"),
        ("I cannot tell.", 0.0, None),
        ("", 0.0, None),
    ],
)
def test_progressive_exact_match(output: str, em: float, case: str | None) -> None:
    s = score_cogniload(output, _task())
    assert (s.em, s.case) == (em, case)


@pytest.mark.parametrize(
    ("output", "em", "case", "answer"),
    [
        # the issue's cases (gold teal)
        ("Quentin's sock colour is teal.\n\\boxed{beige}", 0.0, "boxed", "beige"),
        ("Quentin's sock colour is teal.\n\\boxed{teal or beige}", 0.0, "boxed", "teal or beige"),
        ("Quentin's sock colour is teal or beige.", 0.0, None, None),
        ("Quentin's sock colour is teal.\nWhat is the sock colour of Quentin?", 1.0, "poi_category",
         "Quentin's sock colour is teal."),
        ("So Quentin's sock colour changes from beige to teal.", 1.0, "poi_category",
         "So Quentin's sock colour changes from beige to teal."),
        ("After statement 4, Quentin's sock colour is beige.\\boxed{teal}", 1.0, "boxed", "teal"),
        ("Quentin's sock colour is not teal.", 0.0, None, None),
        # more: boxes with markup or a sentence inside, an unclosed box, an empty box
        ("Thus \\boxed{\\text{Teal}}.", 1.0, "boxed", "Teal"),
        ("\\boxed{Quentin's sock colour is teal}", 1.0, "boxed", "Quentin's sock colour is teal"),
        ("\\boxed{\\textbf{teal}} and later \\boxed{beige", 1.0, "boxed", "teal"),
        ("Quentin's sock colour is teal. \\boxed{beige", 1.0, "poi_category", "Quentin's sock colour is teal."),
        ("Quentin's sock colour is teal.\n\\boxed{}", 0.0, "boxed", None),
        # the last sentence about Quentin and socks decides, even with someone else's colour after it
        ("Quentin's socks are teal. Brent's sock colour is beige.", 1.0, "poi_category", "Quentin's socks are teal."),
        ("Quentin's sock color ends up teal.", 1.0, "poi_category", "Quentin's sock color ends up teal."),
        ("Final answer: TEAL", 1.0, "answer_line", "TEAL"),
    ],
)
def test_issue_cases_and_explicit_answers(output: str, em: float, case: str | None, answer: str | None) -> None:
    s = score_cogniload(output, _task("teal", poi="Quentin", category="sock colour"))
    assert (s.em, s.case, s.answer) == (em, case, answer)


def test_whole_words_only() -> None:
    assert score_cogniload("Lena's favourite drink is steak.", _task("tea", category="favourite drink")).em == 0.0
    assert score_cogniload("Lena's favourite drink is tea.", _task("tea", category="favourite drink")).em == 1.0
    # the name must be a whole word as well
    assert score_cogniload("Lenas hobby is chess. It is archery", _task()).case == "last"


def test_answer_is_the_judged_string() -> None:
    s = score_cogniload("Lena's hobby is chess.", _task())
    assert (s.answer, s.value, s.uninterpretable, s.em) == ("Lena's hobby is chess.", "chess", False, 0.0)
    # the last sentence about the PoI and category hedges; the rules fall back to the last sentence about the PoI
    # (the same one) and to the output's last sentence, which gives a value
    s = score_cogniload("Lena's hobby could be archery or chess.\nI pick archery.", _task())
    assert (s.case, s.answer, s.value, s.em) == ("last", "I pick archery.", "archery", 1.0)
    s = score_cogniload("Lena's hobby could be archery or chess.", _task())
    assert (s.answer, s.value, s.uninterpretable) == (None, None, False)
    s = score_cogniload("No idea.", _task())
    assert (s.answer, s.uninterpretable) == (None, True)
    s = score_cogniload("Reasoning...\n\\boxed{}", _task())
    assert (s.case, s.answer, s.uninterpretable) == ("boxed", None, True)
    s = score_cogniload("\\boxed{I do not know}", _task())
    assert (s.answer, s.value, s.uninterpretable, s.em) == ("I do not know", None, False, 0.0)


def test_capitalised_values() -> None:
    t = _task("Paris", category="home city")
    assert score_cogniload("Lena's home city is Paris.", t).em == 1.0
    assert score_cogniload("Lena's home city is paris, not Oslo.", t).value == "Paris"
    assert score_cogniload("Lena lives in Oslo.", t).em == 0.0


def test_split_sentences() -> None:
    assert split_sentences("A b. C d!\n\nE f? g\nh") == ["A b.", "C d!", "E f?", "g", "h"]
    assert split_sentences("  \n ") == []


def test_generated_tasks_score_their_own_answer_and_no_other() -> None:
    section = CogniloadOptions(n=4, difficulty=GRID_D, length=(20,), needle_ratio=(50,))
    for t in generate_tasks(section, 3):
        poi, cat = t.meta["poi"], t.meta["category"]
        assert score_cogniload(f"So {poi}'s {cat} is {t.gold}.", t).case == "poi_category"
        pool = next(c.values for c in CATEGORIES if c.name == cat)
        wrong = next(v for v in pool if v != t.gold)
        assert score_cogniload(f"So {poi}'s {cat} is {wrong}.", t).em == 0.0
        assert score_cogniload(f"{poi} ends with {t.gold}. Thus {poi}'s {cat} is {wrong}.", t).em == 0.0


def test_scoring_rejects_other_sources() -> None:
    bad = Task("x", "synthetic", "q?", "a", ())
    with pytest.raises(ProbeError, match="cogniload"):
        score_cogniload("a", bad)


def test_paper_experiment_is_the_papers_grid() -> None:
    """5 d x 4 N x 7 rho = 140 cells at 100 puzzles each: the paper's 14,000 puzzles per model."""
    cfg = load_config(Path(__file__).parent.parent.parent / "experiments" / "cogniload-paper.toml")
    (section,) = cfg.tasks
    grid = section.options
    assert grid.difficulty == GRID_D and grid.length == GRID_N
    assert len(grid.needle_ratio) == 7 and set(GRID_RHO) <= set(grid.needle_ratio)
    cells = len(grid.difficulty) * len(grid.length) * len(grid.needle_ratio)
    assert (cells, cells * section.n) == (140, 14_000)
