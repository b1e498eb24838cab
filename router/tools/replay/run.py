"""One replay per policy: build the policy exactly as the router does, simulate, summarise."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from router.config.model import PolicyConfig
from router.scheduling import Policy, build_policy
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.precise import Residency
from router.tools.replay.sim import Simulation, VirtualClock
from router.tools.replay.summary import Curves, curves, summarize
from router.tools.replay.trace import Trace

DEFAULT_POLICIES: tuple[str, ...] = (
    "round_robin", "random", "least_loaded", "sglang_cache_aware", "llmd_weighted", "dynamo_cost", "ttft",
)


def policy_for(name: str, spec: ClusterSpec, seed: int, clock: VirtualClock | None = None) -> Policy:
    """The live router's policy object: ``build_policy`` with the PD config when the
    cluster has a prefill pool (as ``InstancePool.disaggregated`` decides live). ``clock``:
    the replay's virtual time (give the Simulation the same one), which isolation
    ``objective`` needs for its window."""
    config = PolicyConfig.model_validate({"name": name, "seed": seed, "ttft": spec.ttft_weights()})
    if clock is None and spec.disaggregated and spec.isolation == "objective":
        raise ValueError("isolation objective counts stalls over a window of the replay's time: pass its VirtualClock")
    pd = spec.pd_config() if spec.disaggregated else None
    return build_policy(config, pd=pd) if clock is None else build_policy(config, pd=pd, clock=clock)


@dataclass(frozen=True)
class Outcome:
    summary: dict[str, object]
    curves: Curves
    wall_s: float  # kept out of summary.json, which must not vary between identical runs


def replay(trace: Trace, spec: ClusterSpec, name: str, *, seed: int = 0, ttft_slo_s: float = 30.0,
           on_progress: Callable[[int, int], None] | None = None, residency: Residency = "approximate") -> Outcome:
    started = time.perf_counter()
    clock = VirtualClock()
    sim = Simulation(trace, spec, policy_for(name, spec, seed, clock), on_progress=on_progress, residency=residency,
                     clock=clock)
    sim.run()
    return Outcome(summarize(sim, ttft_slo_s), curves(sim), time.perf_counter() - started)
