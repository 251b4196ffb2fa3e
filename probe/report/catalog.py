"""The toolkit's report sections, registered by family name (:mod:`probe.report.sections`): ICE, CogniLoad and
the interventions' causal tests.

The one place that names them: the shared renderers look a section up by the family of each result. A benchmark of
your own registers its :class:`~probe.report.sections.ReportSection` the same way.
"""

from __future__ import annotations

from probe.report import cogniload, ice, interventions
from probe.report.sections import register_section

for _section in (ice.SECTION, cogniload.SECTION, interventions.SECTION):
    register_section(_section)
