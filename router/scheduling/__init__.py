"""Layer: scheduling. Routing decisions as pipelines of registered plugins (route
generators, filters, scorers, pickers; presets name whole pipelines), the TTFT cost models
they use, calibration, and the one ``decide`` step that asks a state store to look up,
choose and book atomically. The live router, the emulator benchmarks and the offline
replay all use these same objects.

May import: router.state, router.core, router.config. Never router.upstream (a sibling):
a decision never does I/O of its own beyond the state store.
"""

from router.core.instances import Candidate
from router.scheduling.build import build_policy, check_config, default_registry
from router.core.errors import NoRoute
from router.scheduling.framework import Decision, Policy, RouteRequest, View
from router.scheduling.pipeline import Pipeline
from router.scheduling.registry import ENTRY_POINT_GROUP, BuildContext, Params, PluginError, Registry, plugin

__all__ = [
    "Candidate", "Decision", "NoRoute", "Pipeline", "Policy", "RouteRequest", "View", "build_policy", "check_config",
    "ENTRY_POINT_GROUP", "BuildContext", "Params", "PluginError", "Registry", "default_registry", "plugin",
]
