"""Neutral filler prose: sentences about weather, landscapes and daily routines, unrelated to any task
(docs/method.md#conditions)."""

from __future__ import annotations

import numpy as np


# Each family: a template and the word lists of its slots. Every combination is a plain sentence of 10-25 words.
_FAMILIES: tuple[tuple[str, dict[str, tuple[str, ...]]], ...] = (
    (
        "{when}, {sky} {sky_does}, and the air {air}.",
        {
            "when": (
                "early in the morning", "in the afternoon", "late in the evening", "just before dawn",
                "around midday", "as the light begins to fade", "on most autumn days",
            ),
            "sky": ("the sky", "a thin layer of cloud", "a pale grey haze", "the low mist", "a bank of fog"),
            "sky_does": (
                "slowly clears", "drifts toward the hills", "slowly changes colour", "settles over the fields",
                "hangs above the rooftops", "thins and breaks apart",
            ),
            "air": (
                "smells of rain", "grows cool and still", "feels heavy and damp", "carries the scent of cut grass",
                "turns crisp and clear", "stays mild and calm",
            ),
        },
    ),
    (
        "A {wind_adj} wind {wind_does} across the {land}, {wind_effect}.",
        {
            "wind_adj": ("gentle", "cold", "warm", "restless", "steady", "light"),
            "wind_does": ("moves", "sweeps", "wanders", "blows", "drifts"),
            "land": ("open meadow", "wide valley", "bare hillside", "quiet moor", "empty field", "grassy slope"),
            "wind_effect": (
                "bending the tall grass in long silver waves", "rattling the dry leaves along the hedges",
                "carrying the faint smell of woodsmoke", "setting the washing on the line in motion",
                "making the branches creak and sway", "and the birds fall silent for a while",
            ),
        },
    ),
    (
        "The {place} {place_does}, {place_detail}.",
        {
            "place": (
                "meadow", "hillside", "valley floor", "open plain", "path through the woods", "stretch of moorland",
                "orchard", "garden behind the house",
            ),
            "place_does": (
                "stretches out toward the horizon", "lies quiet under a wide sky", "slopes gently downward",
                "is covered in low shrubs and heather", "looks green and fresh after the rain",
            ),
            "place_detail": (
                "dotted with small white flowers", "where a few sheep graze without any hurry",
                "broken only by an old stone wall", "where small birds call from the bushes",
                "and a narrow track winds through it", "and the grass there is still wet with dew",
            ),
        },
    ),
    (
        "{who} {routine} {routine_when}, {routine_after}.",
        {
            "who": (
                "An old neighbour", "Someone down the lane", "A tired traveller", "A quiet visitor",
                "The woman next door", "A young man nearby",
            ),
            "routine": (
                "opens the shutters", "sweeps the front step", "puts water on to boil", "waters the plants",
                "folds the washing", "feeds the hens in the yard",
            ),
            "routine_when": (
                "before breakfast", "every morning", "after a slow walk", "while the house is still quiet",
                "as soon as the sun is up",
            ),
            "routine_after": (
                "then sits down with a warm drink", "and then listens to the sounds outside",
                "and then reads for a little while", "humming an old tune the whole time",
                "and then goes back inside to rest",
            ),
        },
    ),
    (
        "In {spring}, {spring_scene}, and {spring_scene2}.",
        {
            "spring": ("spring", "early spring", "late spring"),
            "spring_scene": (
                "the days grow longer and the evenings stay light", "the hedges fill with pale blossom",
                "the ground is soft and muddy underfoot",
            ),
            "spring_scene2": (
                "the bees are busy among the flowers", "the smell of damp earth rises from the ground",
                "people linger outside after supper",
            ),
        },
    ),
    (
        "In {autumn}, {autumn_scene}, and {autumn_scene2}.",
        {
            "autumn": ("autumn", "the autumn months", "late autumn"),
            "autumn_scene": (
                "the leaves turn yellow and brown", "mist lies in the hollows until noon",
                "the evenings draw in earlier each week",
            ),
            "autumn_scene2": (
                "people walk more slowly along the lanes", "the air smells of smoke and wet leaves",
                "the ponds are still and dark",
            ),
        },
    ),
    (
        "In {winter}, {winter_scene}, and {winter_scene2}.",
        {
            "winter": ("winter", "the depth of winter", "the coldest weeks of the year"),
            "winter_scene": (
                "frost covers the windows each morning", "the paths are hard and icy",
                "snow settles quietly on the hedges",
            ),
            "winter_scene2": (
                "most windows glow warmly after dark", "the birds gather near the houses",
                "everyone hurries home before the light is gone",
            ),
        },
    ),
    (
        "Inside the kitchen, {kitchen_thing} {kitchen_does}, while {kitchen_other}.",
        {
            "kitchen_thing": ("a pot of soup", "a loaf of bread", "a bowl of apples", "a pile of clean plates"),
            "kitchen_does": (
                "sits on the table", "cools near the open window", "waits on the shelf", "warms by the stove",
            ),
            "kitchen_other": (
                "rain taps softly against the glass", "a cat sleeps in a patch of sunlight",
                "the kettle begins to whistle", "somebody hums quietly in the next room",
                "the clock on the wall ticks on",
            ),
        },
    ),
    (
        "Along the {track}, {track_scene}, and {track_scene2}.",
        {
            "track": ("narrow lane", "footpath by the fields", "edge of the wood", "old cart track"),
            "track_scene": (
                "puddles reflect the passing clouds", "blackberries ripen in the hedges",
                "fallen leaves gather in soft heaps", "tall nettles lean over the ditch",
            ),
            "track_scene2": (
                "nobody seems to be in any hurry", "the only sound is the wind in the trees",
                "a thin line of smoke rises in the distance", "the light changes every few minutes",
            ),
        },
    ),
)  # fmt: skip


def neutral_filler(rng: np.random.Generator, n_sentences: int) -> list[str]:
    """Draw ``n_sentences`` neutral prose sentences (10-25 words each, no names, no numbers).

    Template families and slot values are drawn uniformly. A sentence is re-drawn (up to 20 times) when it
    already occurs in the result, so a long padding does not repeat itself while fresh sentences remain.

    Args:
        rng: the seeded generator; the result is a function of its state alone.
        n_sentences: number of sentences (>= 0).

    Returns:
        ``n_sentences`` sentences, each starting with a capital letter and ending with a full stop.
    """
    seen: set[str] = set()
    out: list[str] = []
    for _ in range(n_sentences):
        for _attempt in range(20):
            template, slots = _FAMILIES[int(rng.integers(len(_FAMILIES)))]
            values = {k: v[int(rng.integers(len(v)))] for k, v in slots.items()}
            sentence = template.format(**values)
            sentence = sentence[0].upper() + sentence[1:]
            if sentence not in seen:
                break
        seen.add(sentence)
        out.append(sentence)
    return out
