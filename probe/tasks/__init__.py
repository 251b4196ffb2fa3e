"""Task sources and the registry that says, for each, how its tasks are loaded, laid out, scored and analysed
(docs/method.md#sources)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from probe.tasks.family import CUSTOM_CONDITION, FAMILIES, Family, get_family, register_family
from probe.tasks.options import CogniloadOptions, FanoutqaOptions, JsonlOptions, SyntheticOptions
from probe.tasks.section import SOURCES, Layout, TaskSection, TaskSource, get_source, register_source
from probe.types import family_of_old_record

if TYPE_CHECKING:
    from probe.types import Task

log = logging.getLogger(__name__)


def _load_synthetic(options: SyntheticOptions, seed: int) -> list["Task"]:
    import numpy as np  # here, not at the top: `import probe.config` (and so `probe.Intervention`) stays numpy-free

    from probe.tasks.synthetic import generate_synthetic

    return generate_synthetic(options.n, options.hops, np.random.default_rng((seed, options.hops)))


def _load_fanoutqa(options: FanoutqaOptions, seed: int) -> list["Task"]:
    from probe.tasks.fanoutqa import load_fanoutqa

    return load_fanoutqa(options.n, options.max_hops, seed, options.path)


def _load_jsonl(options: JsonlOptions, seed: int) -> list["Task"]:
    from probe.tasks.jsonl import load_jsonl_tasks

    assert options.path is not None  # JsonlOptions refuses a missing path
    return load_jsonl_tasks(options.path, options.n)


def _load_cogniload(options: CogniloadOptions, seed: int) -> list["Task"]:
    from probe.tasks.cogniload import generate_tasks

    return generate_tasks(options, seed)


for _family in (  # each family's scorer is registered for it by probe.scoring
    Family(name="ice", native_condition=None, has_s_sim=True,
           description="multi-hop questions under the ICE conditions: EM, hop recall, H1-H3 (docs/method.md)"),
    Family(name="cogniload", native_condition="CogniLoad", has_s_sim=False,
           description="logic-grid puzzles: progressive exact match, GLM and thresholds (docs/cogniload.md)"),
):
    register_family(_family)

for _source in (
    TaskSource(name="synthetic", load=_load_synthetic, layout="ice", family="ice", options_type=SyntheticOptions,
               description="fictional 2- and 3-hop chains (no training-data contamination)"),
    TaskSource(name="fanoutqa", load=_load_fanoutqa, layout="ice", family="ice", options_type=FanoutqaOptions,
               description="the FanOutQA dev set with its human decompositions"),
    TaskSource(name="jsonl", load=_load_jsonl, layout="task", family="ice", options_type=JsonlOptions,
               description="your own file: ICE conditions from its hops, or its own segments as written"),
    TaskSource(name="cogniload", load=_load_cogniload, layout="native", family="cogniload",
               options_type=CogniloadOptions,
               description="logic-grid puzzles with difficulty, length and needle-ratio knobs"),
):
    register_source(_source)


def family_of(source: str) -> str:
    """The family of a source's trials; for a source this registry does not know (another tool's file, a record
    written before records named their family), the family such a record had
    (:func:`probe.types.family_of_old_record`).
    """
    return SOURCES.get(source).family if source in SOURCES else family_of_old_record(source)


def load_section(section: TaskSection, seed: int) -> list["Task"]:
    """The tasks of one ``[[tasks]]`` section.

    Args:
        section: the section (its ``source`` names a registered :class:`TaskSource`).
        seed: the experiment seed (the runner adds the section's index, so two sections draw differently).

    Returns:
        The tasks, in a fixed order: ``synthetic`` draws ``n`` tasks from ``numpy.random.default_rng((seed,
        hops))``; ``fanoutqa`` chooses ``n`` questions with at most ``max_hops`` steps by ``seed``; ``jsonl``
        returns the first ``n`` tasks of the file; ``cogniload`` makes ``n`` puzzles per grid cell.

    Raises:
        TaskFormatError: a bad jsonl file. DataUnavailableError: FanOutQA is not installed.
        UnknownNameError: an unknown source.
    """
    source = get_source(section.source)
    tasks = source.load(section.options, seed)
    log.info("loaded %d %s tasks", len(tasks), section.source)
    return tasks


__all__ = ["CUSTOM_CONDITION", "FAMILIES", "Family", "Layout", "SOURCES", "TaskSection", "TaskSource", "family_of",
           "get_family", "get_source", "load_section", "register_family", "register_source"]
