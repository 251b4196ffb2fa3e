"""The interventions a run folder declares, as the analysis reads them: ``interventions.json`` read by
:func:`probe.interventions.load_interventions`, one :class:`probe.interventions.Intervention` per entry
(:meth:`~probe.interventions.Intervention.from_json`, which names the file, the entry and the field of a bad value).

``InterventionSpec`` is the name the analysis gave that type. The analysis of the intervened trials is
:mod:`probe.analysis.interventions`.
"""

from __future__ import annotations

from probe.config import INTERVENTION_KEYS
from probe.interventions import HeadSelection, Intervention, InterventionsFileError, load_interventions
from probe.runfolder import INTERVENTIONS

INTERVENTIONS_FILE = INTERVENTIONS  # the run folder's file name (probe.runfolder)
KEYS = INTERVENTION_KEYS  # declared once, with the [[interventions]] section (probe.config)
InterventionSpec = Intervention  # one type: the resolved intervention, as written to and read from the file

__all__ = ["HeadSelection", "INTERVENTIONS_FILE", "InterventionSpec", "InterventionsFileError", "KEYS",
           "load_interventions"]
