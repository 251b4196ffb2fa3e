"""The toolkit's family analyses, registered by name (:mod:`probe.analysis.families`), in report order.

The one place that names them: the shared stages look an analysis up by the family recorded on each trial. A
benchmark of your own registers its :class:`~probe.analysis.families.FamilyAnalysis` the same way.
"""

from __future__ import annotations

from probe.analysis import cogniload, ice
from probe.analysis.families import register_family_analysis

for _family in (ice.ANALYSIS, cogniload.ANALYSIS):
    register_family_analysis(_family)
