"""ICE-Probe: how extraneous information degrades LLM reasoning, measured behaviourally and in attention.

Data flows one way: task source -> ICE prompt builder -> model runner (generation, probes) -> records on disk
-> analysis -> report.
"""

from __future__ import annotations

__version__ = "0.1.0"
