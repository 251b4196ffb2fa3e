"""CogniLoad logic-grid puzzles: a seeded generator with three independent knobs (docs/cogniload.md#a-puzzle)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from operator import itemgetter
from typing import Any, Mapping

import numpy as np

from probe.tasks.options import CogniloadOptions
from probe.errors import ConfigError, ProbeError
from probe.types import Hop, Task

log = logging.getLogger(__name__)

SOURCE = "cogniload"
TOPIC = "cogniload"
DIFFICULTIES: tuple[int, ...] = (1, 3, 5, 7, 10)  # the paper's grid; any 1 <= d <= MAX_DIFFICULTY works
LENGTHS: tuple[int, ...] = (20, 50, 100, 250)
MAX_ATTEMPTS = 10_000  # candidate draws per statement before giving up (a valid one exists; see module doc)
_SEED_TAG = 0x636C  # "cl": keeps CogniLoad streams apart from other sources seeded with the same experiment seed


@dataclass(frozen=True)
class Category:
    """One attribute category: its display name, words that name it in an answer, and its value pool."""

    name: str  # "sock colour": used as "whose sock colour is green" / "the sock colour green"
    aliases: tuple[str, ...]  # lower-case phrases that name the category in free text (scoring)
    values: tuple[str, ...]  # at least MAX_DIFFICULTY + 1 single words, unique across all categories


CATEGORIES: tuple[Category, ...] = (
    Category(
        "sock colour",
        ("sock colour", "sock color", "sock", "socks"),
        ("green", "purple", "yellow", "orange", "crimson", "teal", "beige", "maroon", "navy", "olive", "ivory",
         "magenta"),
    ),
    Category(
        "pet",
        ("pet", "pets", "animal"),
        ("cat", "dog", "parrot", "hamster", "rabbit", "turtle", "goldfish", "ferret", "lizard", "canary", "iguana",
         "hedgehog"),
    ),
    Category(
        "favourite music",
        ("favourite music", "favorite music", "music", "genre"),
        ("jazz", "blues", "reggae", "techno", "disco", "opera", "salsa", "funk", "grunge", "polka", "bluegrass",
         "flamenco"),
    ),
    Category(
        "favourite drink",
        ("favourite drink", "favorite drink", "drink", "drinks", "beverage"),
        ("tea", "coffee", "lemonade", "cocoa", "cider", "kombucha", "espresso", "smoothie", "milkshake", "lassi",
         "horchata", "matcha"),
    ),
    Category(
        "hobby",
        ("hobby", "hobbies"),
        ("chess", "knitting", "archery", "fencing", "pottery", "origami", "rowing", "juggling", "surfing",
         "gardening", "climbing", "painting"),
    ),
    Category(
        "hat",
        ("hat", "hats"),
        ("beret", "fedora", "beanie", "bowler", "stetson", "sombrero", "turban", "bonnet", "trilby", "fez",
         "panama", "boater"),
    ),
    Category(
        "favourite fruit",
        ("favourite fruit", "favorite fruit", "fruit", "fruits"),
        ("apple", "banana", "cherry", "mango", "kiwi", "papaya", "plum", "lychee", "apricot", "fig", "guava",
         "pear"),
    ),
    Category(
        "vehicle",
        ("vehicle", "vehicles"),
        ("bicycle", "scooter", "tractor", "canoe", "motorbike", "tram", "van", "sedan", "jeep", "kayak",
         "skateboard", "unicycle"),
    ),
    Category(
        "home city",
        ("home city", "city", "lives in", "hometown"),
        ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Dublin", "Vienna", "Nairobi", "Havana", "Quito", "Seoul",
         "Lisbon"),
    ),
    Category(
        "sport",
        ("sport", "sports"),
        ("tennis", "hockey", "cricket", "rugby", "volleyball", "badminton", "golf", "baseball", "handball",
         "squash", "lacrosse", "polo"),
    ),
    Category(
        "favourite flower",
        ("favourite flower", "favorite flower", "flower", "flowers"),
        ("tulip", "rose", "daisy", "lily", "orchid", "poppy", "iris", "lotus", "dahlia", "peony", "jasmine",
         "marigold"),
    ),
    Category(
        "instrument",
        ("instrument", "instruments", "plays"),
        ("piano", "violin", "cello", "flute", "trumpet", "harp", "banjo", "ukulele", "oboe", "drums", "accordion",
         "clarinet"),
    ),
)
CATEGORY_BY_NAME: dict[str, Category] = {c.name: c for c in CATEGORIES}

PEOPLE: tuple[str, ...] = (
    "Brent", "Anthony", "Clara", "Diego", "Esme", "Farid", "Greta", "Hiro", "Ines", "Jonas",
    "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Talia",
)  # fmt: skip

MAX_DIFFICULTY = min(len(CATEGORIES), min(len(c.values) for c in CATEGORIES) - 1, len(PEOPLE))


def n_people(d: int) -> int:
    """``|P| = max(d, 2)`` (docs/cogniload.md#a-puzzle)."""
    return max(d, 2)


def n_values(d: int) -> int:
    """``|V_c| = max(d + 1, 3)`` values per category (docs/cogniload.md#a-puzzle)."""
    return max(d + 1, 3)


def n_needles(n_statements: int, rho: float) -> int:
    """``n0 = max(1, min(N, round(N * rho / 100)))``; ``round`` is Python's (half to even)."""
    return max(1, min(n_statements, round(n_statements * rho / 100)))


def _join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _rho_label(rho: float) -> str:
    return str(int(rho)) if float(rho).is_integer() else f"{rho:g}"


def task_id_for(d: int, n_statements: int, rho: float, index: int) -> str:
    """Stable task id, e.g. ``cl-d5-N50-r25-0003``."""
    return f"cl-d{d}-N{n_statements}-r{_rho_label(rho)}-{index:04d}"


class PuzzleParamsError(ProbeError):
    """A task's or trial's ``meta`` does not hold the CogniLoad parameters a reader needs."""


# PuzzleParams field -> its key in ``meta`` (tasks, trial records): the on-disk names, unchanged since the first runs
_META_KEYS: dict[str, str] = {"n_statements": "N"}


@dataclass(frozen=True)
class PuzzleParams:
    """The knobs of one CogniLoad puzzle and what generating it recorded (docs/cogniload.md#a-puzzle).

    A task carries them in ``Task.meta`` and every trial record of it in ``TrialRecord.meta``, under the keys
    ``d, N, rho, n_needles, n_hay, n_people, n_values, poi, category, n_poi_changes, gold_is_initial``
    (:meth:`to_meta`); :meth:`from_meta` is the one reader. Only the grid knobs ``d``, ``N`` and ``rho`` are
    required: records written by other tools or older fixtures may hold only some of the rest (None here).

    Attributes:
        d: intrinsic difficulty.
        n_statements: N, the number of statements (``N`` on disk).
        rho: needle-to-hay ratio in percent.
        n_needles: needle statements (``n0``); n_hay: hay statements.
        n_people: people in the puzzle (initial-state sentences before the statements); n_values: values per
            category.
        poi: the Person of Interest's name; category: the asked category's name.
        n_poi_changes: how many needles changed the asked category.
        gold_is_initial: whether the answer equals the PoI's initial value.
    """

    d: int
    n_statements: int
    rho: float
    n_needles: int | None = None
    n_hay: int | None = None
    n_people: int | None = None
    n_values: int | None = None
    poi: str | None = None
    category: str | None = None
    n_poi_changes: int | None = None
    gold_is_initial: bool | None = None

    def to_meta(self) -> dict[str, str | int | float]:
        """The ``meta`` mapping of a task or trial: on-disk keys, the fields that are set (``gold_is_initial`` 0/1)."""
        out: dict[str, str | int | float] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[_META_KEYS.get(f.name, f.name)] = int(v) if isinstance(v, bool) else v
        return out

    @staticmethod
    def from_meta(meta: Mapping[str, Any] | None, where: str, needs: tuple[str, ...] = (),
                  error: type[ProbeError] = PuzzleParamsError) -> "PuzzleParams":
        """Read the parameters from a task's or trial's ``meta``.

        Args:
            meta: the mapping (None reads as empty).
            where: what it belongs to (``task cl-d5-N50-r25-0003``, ``trial <id>``), for the error message.
            needs: optional fields (their ``PuzzleParams`` names) the caller needs present.
            error: the error type raised (a reader's own :class:`~probe.errors.ProbeError` subclass).

        Raises:
            PuzzleParamsError (or ``error``): ``d``, ``N``, ``rho`` or a needed field is missing or not a number
                of its kind (an integer count, a positive ``N``); the message names the field and the keys present.
        """
        m = dict(meta or {})
        values: dict[str, Any] = {}
        for f in fields(PuzzleParams):
            key = _META_KEYS.get(f.name, f.name)
            required = f.name in ("d", "n_statements", "rho") or f.name in needs
            if key not in m or m[key] is None:
                if required:
                    raise error(f"{where}: meta needs {key!r} (a CogniLoad task's parameter); it holds "
                                f"{sorted(m)}. CogniLoad trials must carry their task's meta")
                continue
            values[f.name] = _meta_value(f.name, key, m[key], where, error)
        if values["n_statements"] <= 0:
            raise error(f"{where}: meta N={m['N']!r} must be positive")
        return PuzzleParams(**values)


def _meta_value(name: str, key: str, v: Any, where: str, error: type[ProbeError]) -> Any:
    """One ``meta`` value as its ``PuzzleParams`` field's type, or ``error`` naming the key."""
    if name in ("poi", "category"):
        if isinstance(v, str) and v:
            return v
        raise error(f"{where}: meta {key}={v!r} must be a non-empty string")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise error(f"{where}: meta {key}={v!r} must be a number")
    if name == "rho":
        return v
    if float(v) != int(v):
        raise error(f"{where}: meta {key}={v!r} must be a whole number")
    return bool(v) if name == "gold_is_initial" else int(v)


class PuzzleGenerationError(ProbeError):
    """No valid statement was found within MAX_ATTEMPTS draws (a bug: a valid one always exists)."""


def generate_puzzle(d: int, n_statements: int, rho: float, rng: np.random.Generator, index: int = 0) -> Task:
    """Generate one CogniLoad puzzle.

    Args:
        d: intrinsic difficulty, 1 <= d <= MAX_DIFFICULTY (the paper's grid is 1, 3, 5, 7, 10).
        n_statements: N, the number of statements (>= 1).
        rho: needle-to-hay ratio in percent, in [5, 95].
        rng: the only source of randomness; the same generator state gives the same puzzle.
        index: puzzle number within its grid cell; only used in the task id.

    Returns:
        A ``Task`` with ``source="cogniload"``, the PoI's final value of the asked category as ``gold``, the needle
        statements as ``hops`` and the prompt body as ``segments`` (see docs/cogniload.md#a-puzzle for the kinds).
        ``meta`` holds the puzzle's :class:`PuzzleParams` (:meth:`PuzzleParams.to_meta`; read it back with
        :meth:`PuzzleParams.from_meta`).

    Raises:
        ConfigError: a knob is outside its range.
    """
    _check_knobs(d, n_statements, rho)
    n_p, n_v = n_people(d), n_values(d)
    cat_idx = rng.permutation(len(CATEGORIES))[:d]
    cats = [CATEGORIES[i] for i in cat_idx]
    # values[c][j]: the j-th value of the puzzle's c-th category, drawn from that category's pool
    values = [[cat.values[j] for j in rng.permutation(len(cat.values))[:n_v]] for cat in cats]
    names = [PEOPLE[i] for i in rng.permutation(len(PEOPLE))[:n_p]]
    poi = int(rng.integers(n_p))

    # state[p][c]: value index of person p in category c
    state = [tuple(row) for row in _initial_state(n_p, d, n_v, rng).tolist()]
    initial_state = state
    n0 = n_needles(n_statements, rho)
    others = [p for p in range(n_p) if p != poi]

    statements: list[tuple[bool, str]] = []  # (is_needle, text)
    n_left = n0
    asked_changes = 0
    asked = int(rng.integers(d))
    for t in range(n_statements):
        is_needle = rng.random() < n_left / (n_statements - t)
        cond_c, cond_v, upd_c, upd_v, new_state = _draw_statement(state, poi, others, is_needle, n_v, rng)
        if is_needle:
            n_left -= 1
            if new_state[poi][asked] != state[poi][asked]:
                asked_changes += 1
        state = new_state
        conds = _join([f"whose {cats[c].name} is {values[c][v]}" for c, v in zip(cond_c, cond_v)])
        upds = _join([f"the {cats[c].name} {values[c][v]}" for c, v in zip(upd_c, upd_v)])
        statements.append((is_needle, f"{t + 1}. Every person {conds} now has {upds}."))
    assert n_left == 0, "the needle schedule must place exactly n0 needles"

    gold = values[asked][state[poi][asked]]
    segments: list[tuple[str, str]] = [("instruction", _framing(names, cats, values))]
    for p in range(n_p):
        attrs = _join([f"the {cats[c].name} {values[c][initial_state[p][c]]}" for c in range(d)])
        segments.append(("germane" if p == poi else "extraneous", f"{names[p]} has {attrs}."))
    segments += [("germane" if is_needle else "extraneous", text) for is_needle, text in statements]

    question = f"After all {n_statements} statements, what is the {cats[asked].name} of {names[poi]}?"
    return Task(
        task_id=task_id_for(d, n_statements, rho, index),
        source=SOURCE,
        question=question,
        gold=gold,
        hops=tuple(Hop(fact=text, answer=None) for is_needle, text in statements if is_needle),
        topic=TOPIC,
        meta=PuzzleParams(
            d=d, n_statements=n_statements, rho=rho, n_needles=n0, n_hay=n_statements - n0, n_people=n_p,
            n_values=n_v, poi=names[poi], category=cats[asked].name, n_poi_changes=asked_changes,
            gold_is_initial=state[poi][asked] == initial_state[poi][asked],
        ).to_meta(),
        segments=tuple(segments),
    )


def _check_knobs(d: int, n_statements: int, rho: float) -> None:
    """Refuse a difficulty, length or needle ratio outside its range (:class:`ConfigError` naming the knob)."""
    if not 1 <= d <= MAX_DIFFICULTY:
        raise ConfigError(f"cogniload difficulty d={d}: must be an integer in 1..{MAX_DIFFICULTY}")
    if n_statements < 1:
        raise ConfigError(f"cogniload length N={n_statements}: must be >= 1")
    if not 5 <= rho <= 95:
        raise ConfigError(f"cogniload needle ratio rho={rho}: must lie in [5, 95] percent")


def _framing(names: list[str], cats: list[Category], values: list[list[str]]) -> str:
    """The instruction segment: who the puzzle is about, their categories and values, and how statements apply."""
    return (
        f"This puzzle is about {len(names)} people: {_join(names)}. "
        f"Each person has {_join([('an ' if c.name[0] in 'aeiou' else 'a ') + c.name for c in cats])}. "
        "The possible values are: "
        + "; ".join(f"{cat.name}: {', '.join(vals)}" for cat, vals in zip(cats, values))
        + ". The statements below are applied one after another, in the order given. A statement changes only "
        "the people who match all of its conditions at that moment, and every attribute it does not mention "
        "stays as it was. At the start:"
    )


def _initial_state(n_p: int, d: int, n_v: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``(n_p, d)`` state whose rows are pairwise distinct (re-drawn until they are)."""
    for _ in range(MAX_ATTEMPTS):
        state = rng.integers(n_v, size=(n_p, d))
        if len({tuple(row) for row in state.tolist()}) == n_p:
            return state
    raise PuzzleGenerationError(f"no pairwise-distinct initial state for {n_p} people, d={d}, {n_v} values")


def _draw_statement(
    state: list[tuple[int, ...]],
    poi: int,
    others: list[int],
    is_needle: bool,
    n_v: int,
    rng: np.random.Generator,
) -> tuple[list[int], list[int], list[int], list[int], list[tuple[int, ...]]]:
    """Draw candidates until one satisfies the needle or hay rules (docs/cogniload.md#a-puzzle).

    The state is tiny (at most 10 x 10), so plain Python on tuples is faster here than numpy on arrays.

    Args:
        state: per person, the value index of each category, before the statement.
        poi: index of the PoI.
        others: indices of everyone else.
        is_needle: which rules apply.
        n_v: values per category.
        rng: random source.

    Returns:
        condition categories, condition values, update categories, update values (all sorted by category, so the
        text lists categories in a fixed order), and the state after the statement.
    """
    d = len(state[0])
    cats = range(d)
    for _ in range(MAX_ATTEMPTS):
        u = rng.random(3 + 3 * d).tolist()  # one draw per candidate keeps the generator fast
        k = 1 + int(u[0] * d)
        m = 1 + int(u[1] * d)
        cond_c = sorted(sorted(cats, key=u[3 : 3 + d].__getitem__)[:k])
        upd_c = sorted(sorted(cats, key=u[3 + d : 3 + 2 * d].__getitem__)[:m])
        upd_v = [int(u[3 + 2 * d + c] * n_v) for c in upd_c]
        src = state[poi] if is_needle else state[others[int(u[2] * len(others))]]
        get_cond = itemgetter(*cond_c)
        target = get_cond(src)
        match = [get_cond(row) == target for row in state]
        if is_needle:
            if all(match):
                continue
        elif match[poi]:
            continue
        new_state = list(state)
        for p, hit in enumerate(match):
            if hit:
                row = list(state[p])
                for c, v in zip(upd_c, upd_v):
                    row[c] = v
                new_state[p] = tuple(row)
        if is_needle:
            if new_state[poi] == state[poi]:
                continue
        elif new_state == state:
            continue
        if all(new_state[p] == new_state[poi] for p in others):
            continue  # every other person would be identical to the PoI
        return cond_c, [src[c] for c in cond_c], upd_c, upd_v, new_state
    raise PuzzleGenerationError(
        f"no valid {'needle' if is_needle else 'hay'} statement in {MAX_ATTEMPTS} draws (state {state})"
    )


def generate_tasks(options: CogniloadOptions, seed: int) -> list[Task]:
    """``options.n`` puzzles for every cell of ``difficulty x length x needle_ratio``.

    Each puzzle has its own generator, seeded from ``(seed, d, N, rho, index)``: a puzzle does not change when
    the grid around it grows or shrinks, and the same seed always gives the same tasks.

    Args:
        options: the options of a ``[[tasks]]`` section with ``source = "cogniload"``.
        seed: the experiment seed (>= 0).

    Returns:
        Tasks ordered by d, then N, then rho, then index.

    Raises:
        ConfigError: a negative seed, or a grid value out of range (names the field).
    """
    if seed < 0:
        raise ConfigError(f"experiment.seed: {seed}; CogniLoad needs a seed >= 0")
    for d in options.difficulty:
        if not 1 <= d <= MAX_DIFFICULTY:
            raise ConfigError(f"tasks.difficulty: {d} is outside 1..{MAX_DIFFICULTY}")
    for n in options.length:
        if n < 1:
            raise ConfigError(f"tasks.length: {n} must be >= 1")
    tasks: list[Task] = []
    for d in options.difficulty:
        for n in options.length:
            for rho in options.needle_ratio:
                for i in range(options.n):
                    ss = np.random.SeedSequence([_SEED_TAG, seed, d, n, int(round(rho * 1000)), i])
                    tasks.append(generate_puzzle(d, n, rho, np.random.default_rng(ss), index=i))
    log.info("generated %d CogniLoad puzzles (seed %d)", len(tasks), seed)
    return tasks
