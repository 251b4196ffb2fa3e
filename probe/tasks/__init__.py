"""Task sources: a ``[[tasks]]`` section of an experiment -> a list of :class:`~probe.types.Task`.

Sources: ``synthetic`` (fictional multi-hop chains, :mod:`probe.tasks.synthetic`), ``fanoutqa`` (the packaged
dev set, :mod:`probe.tasks.fanoutqa`), ``jsonl`` (the user's own file, :mod:`probe.tasks.jsonl`) and
``cogniload`` (logic-grid puzzles, :mod:`probe.tasks.cogniload`). Task ids are unique within a source and the
same on every run with the same section and seed: ``syn2-0007``, ``fqa-<dev-set id>``, the file's own ids.
"""

from __future__ import annotations

import logging

import numpy as np

from probe.config import TaskSection
from probe.errors import UnknownNameError
from probe.types import Task

log = logging.getLogger(__name__)


def load_tasks(section: TaskSection, seed: int) -> list[Task]:
    """The tasks of one task section.

    Args:
        section: the ``[[tasks]]`` section (source, n, hops, path, max_hops, CogniLoad grid).
        seed: the experiment seed (the runner adds the section's index, so two sections draw differently).

    Returns:
        The tasks, in a fixed order. ``synthetic`` draws ``n`` tasks from ``numpy.random.default_rng((seed,
        hops))``; ``fanoutqa`` chooses ``n`` questions with at most ``max_hops`` steps by ``seed``; ``jsonl``
        returns the first ``n`` tasks of the file; ``cogniload`` is delegated to
        :func:`probe.tasks.cogniload.generate_tasks`.

    Raises:
        TaskFormatError: a bad jsonl file. DataUnavailableError: FanOutQA is not installed.
        UnknownNameError: an unknown source.
    """
    if section.source == "synthetic":
        from probe.tasks.synthetic import generate_synthetic

        tasks = generate_synthetic(section.n, section.hops, np.random.default_rng((seed, section.hops)))
    elif section.source == "fanoutqa":
        from probe.tasks.fanoutqa import load_fanoutqa

        tasks = load_fanoutqa(section.n, section.max_hops, seed, section.path)
    elif section.source == "jsonl":
        from probe.tasks.jsonl import load_jsonl_tasks

        assert section.path is not None  # TaskSection requires a path for jsonl
        tasks = load_jsonl_tasks(section.path, section.n)
    elif section.source == "cogniload":
        from probe.tasks.cogniload import generate_tasks

        tasks = generate_tasks(section, seed)
    else:
        raise UnknownNameError("task source", section.source, ("synthetic", "fanoutqa", "jsonl", "cogniload"))
    log.info("loaded %d %s tasks", len(tasks), section.source)
    return tasks
