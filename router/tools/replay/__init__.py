"""Offline trace replay: a request trace, an emulated cluster in virtual time, and the
router's own policies and state store deciding every request.

Why offline: routing claims ("ttft beats cache-aware on Mooncake at this load") need
thousands of requests over an hour of traffic, repeatably, without GPUs or wall-clock
noise. The pieces: ``trace`` and ``synthetic`` (workloads, one of which ``source``
picks), ``prompts`` (token ids and router keys), ``cluster`` (engines and candidates),
``sim`` (the event loop), ``record`` and ``summary`` (figures), ``report`` (files), ``run``
and ``cli`` (entry points).
"""

from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import DEFAULT_POLICIES, Outcome, policy_for, replay
from router.tools.replay.sim import Simulation
from router.tools.replay.source import load_trace
from router.tools.replay.trace import Trace, TraceError, TraceRequest

__all__ = [
    "DEFAULT_POLICIES", "ClusterSpec", "Outcome", "Simulation", "Trace", "TraceError", "TraceRequest",
    "load_trace", "policy_for", "replay",
]
