"""Layer: scheduling. Routing decisions as pipelines of plugins (filters, scorers, pickers),
the TTFT cost models they use, calibration, and the one ``decide`` step that asks a state
store to look up, choose and book atomically. The live router, the emulator benchmarks and
the offline replay all use these same objects.

May import: router.state, router.core, router.config. Never router.upstream (a sibling):
a decision never does I/O of its own beyond the state store.
"""

from router.core.instances import Candidate
from router.scheduling.framework import Decision, Pipeline, Policy, RouteRequest, View
from router.scheduling.presets import build_policy

__all__ = ["Candidate", "Decision", "Pipeline", "Policy", "RouteRequest", "View", "build_policy"]
