"""Prefill/decode disaggregation in the plugin framework: the pair-pricing scorer, and the
two-profile policy that chooses P and D independently (the peers' way).

Joint pair scoring is an ordinary pipeline over the routes of ``pd_pairs`` (routes.py):
``pd_ttft`` scores each (P, D) pair and decode-alone route by its full TTFT terms
(pd_cost.py), the picker takes the cheapest, near-ties at random. ``TwoProfilePolicy``
runs a prefill profile over the prefill pool, then a decode profile over the decode
instances compatible with that choice, each blind to the other and to the transfer
between them, as sglang-router, vllm-router and llm-d's disaggregation profiles do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.config.model import PDConfig, TTFTWeights
from router.core.errors import NoRoute
from router.core.instances import Candidate
from router.scheduling.cost import prefill_work
from router.scheduling.framework import Decision, RouteCost, RouteRequest, View, route_key
from router.scheduling.pd_cost import decode_step_seconds, route_cost
from router.scheduling.pipeline import Pipeline
from router.scheduling.registry import BuildContext, NoParams, plugin
from router.state.base import Snapshot

__all__ = ["NoRoute", "PDTBTScorer", "PDTTFTScorer", "TwoProfilePolicy"]


class PDTTFTScorer:
    """best route TTFT / this route's: queue and prefill on the prefilling instance, the KV
    transfer to D, admission and the decode step on D. Uses the price ``pd_pairs`` put on
    the route when there is one."""

    name = "pd_ttft"

    def __init__(self, weights: TTFTWeights, pd: PDConfig) -> None:
        self._w = weights
        self._pd = pd

    def cost(self, req: RouteRequest, route: View) -> RouteCost:
        return route.cost if route.cost is not None else route_cost(req, route, route.prefill, self._w, self._pd)

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        costs = [(r.cost if r.cost is not None else self.cost(req, r)).total_s for r in routes]
        best = min(costs)
        return [best / c if c > 0 else 1.0 for c in costs]

    def estimate(self, req: RouteRequest, route: View) -> float:
        return self.cost(req, route).total_s

    def prefill_work(self, req: RouteRequest, route: View) -> int:
        return prefill_work(req, route.prefilling, self._w)

    def terms(self, req: RouteRequest, route: View) -> dict[str, float]:
        return self.cost(req, route).as_dict()


@plugin("scorer", "pd_ttft")
def pd_ttft(params: NoParams, ctx: BuildContext) -> PDTTFTScorer:
    """best / estimated TTFT of the whole route, transfer and decode admission included (policy.ttft, pd.*)."""
    return PDTTFTScorer(ctx.policy.ttft, ctx.require_pd("pd_ttft"))


class PDTBTScorer:
    """best / this route's time between tokens: the step its decode instance would run with
    this request added (pd_cost.decode_step_seconds: the engine's measured speed where it is
    known). Not in the ``ttft`` preset: weigh it into a PD pipeline where decode instances
    differ (GPU generations, a degraded instance). Below the TBT target nothing else tells
    them apart, so a 3x slower instance keeps its share of requests and their tokens come 3x
    slower (docs/benchmarks.md, "PD decode steps")."""

    name = "pd_tbt"

    def __init__(self, pd: PDConfig) -> None:
        self._pd = pd

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        steps = [decode_step_seconds(r, self._pd, 1, req.prompt_tokens) for r in routes]
        best = min(steps)
        return [best / s if s > 0 else 1.0 for s in steps]


@plugin("scorer", "pd_tbt")
def pd_tbt(params: NoParams, ctx: BuildContext) -> PDTBTScorer:
    """best / this route's decode step on D with the request added, at the engine's measured speed (pd.*): prefers faster decode instances."""
    return PDTBTScorer(ctx.require_pd("pd_tbt"))


class TwoProfilePolicy:
    """P chosen by the prefill profile among the prefill instances, D by the decode
    profile among the decode-capable instances of the same KV layout (all of them when
    none matches). Without a usable prefill instance, the decode profile alone chooses
    among the decode instances that can prefill for themselves."""

    def __init__(self, name: str, prefill: Pipeline, decode: Pipeline) -> None:
        self.name = name
        self.prefill = prefill
        self.decode = decode
        self.revisable = prefill.revisable or decode.revisable

    def describe(self) -> dict[str, Any]:
        return {"profiles": {"prefill": self.prefill.describe(), "decode": self.decode.describe()}}

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        prefills = [c for c in candidates if c.role == "prefill"]
        decodes = [c for c in candidates if c.role in ("decode", "mixed")]
        if not decodes:
            raise NoRoute("no decode or mixed instance is available")
        if not prefills:
            decodes = [c for c in decodes if c.standalone]
            if not decodes:
                raise NoRoute("no prefill instance, and no decode instance can prefill alone")
            return self.decode.choose(req, decodes, snap)
        p = self.prefill.choose(req, prefills, snap)
        p_compat = next(c.compat for c in prefills if c.id == p.instance)
        decodes = [c for c in decodes if c.compat == p_compat] or decodes
        d = self.decode.choose(req, decodes, snap)
        return Decision(
            instance=d.instance,
            acceptable=frozenset(route_key(di, pi) for di in d.acceptable for pi in p.acceptable),
            reason=f"independent:{p.reason}",
            prefill=p.instance,
            mode="disaggregated",
            prefill_work=p.prefill_work,
            profiles={"prefill": p, "decode": d},
        )
