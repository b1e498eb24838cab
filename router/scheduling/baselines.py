"""The peers' rules as plugins, re-implemented from their documented behaviour.

They exist so that replays and benchmarks compare ``ttft`` with what sglang-router, llm-d
and Dynamo actually do, not with strawmen. Each reads the same snapshot as our own
policies (router-side residency and booked load), which is also what the originals see
in their approximate modes: a prefix index fed by routing history, never by the engine.
The presets (presets.py) assemble them:

* ``sglang_cache_aware`` — sglang-router 0.3.x ``cache_aware`` (CLI defaults 0.3 / 64 /
  1.5): the ``cache_affinity`` filter, then the ``first_max`` picker over no scores, so
  ties go to the FIRST candidate in list order, as the original's index scan does; that
  is what makes it herd onto instance 0 on a cold cluster, and the replay should show it.
* ``llmd_weighted`` — the llm-d scheduler's weighted profile: prefix-cache scorer x3,
  queue scorer x2 (min-max over candidates), kv-cache-utilisation scorer x2, max-score
  picker with a random tie-break.
* ``dynamo_cost`` — Dynamo's KV router cost (classic form, temperature 0):
  ``overlap_weight * prefill_blocks + decode_blocks``, argmin, ties at random.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from router.config.model import CacheAwareWeights
from router.scheduling.framework import RouteRequest, View
from router.scheduling.registry import BuildContext, Params, plugin


class CacheAffinityFilter:
    """sglang-router's ``cache_aware`` rule as a filter on our residency: when loads are
    imbalanced (max - min > abs and max > rel * min) keep the least loaded; else, when the
    deepest match ratio exceeds the threshold (strictly, as in the original), keep the
    instances with that match; else keep the least loaded. The reason names the branch.
    Match ratio = matched blocks / prompt blocks (the original counts characters of a
    radix tree), load = requests in flight booked by the router (its in-flight counter)."""

    name = "cache_affinity"

    def __init__(self, weights: CacheAwareWeights) -> None:
        self._w = weights

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        loads = [v.load.requests for v in routes]
        lo, hi = min(loads), max(loads)
        if hi - lo > self._w.balance_abs_threshold and hi > lo * self._w.balance_rel_threshold:
            return [v for v, load in zip(routes, loads) if load == lo], "load_imbalance"
        total = len(req.keys)
        if total:
            depths = [(v.prefill or v).matched_blocks for v in routes]
            deepest = max(depths)
            if deepest / total > self._w.cache_threshold:
                return [v for v, depth in zip(routes, depths) if depth == deepest], "prefix_hit"
        return [v for v, load in zip(routes, loads) if load == lo], "prefix_miss"


class DynamoCostScorer:
    """Dynamo KV router, classic cost, as the negated cost (argmax = argmin cost):

        prefill_blocks = (booked prefill tokens + max(prompt - cached, 0)) / block
        decode_blocks  = (booked KV tokens + prompt + max_tokens) / block
        score          = -(overlap_weight * prefill_blocks + decode_blocks)

    Not in [0, 1]: it is meant to be the only scorer. The original deduplicates the new
    request's blocks against the worker's active ones; here the whole sequence counts, a
    small overestimate on instances already serving the same prefix."""

    name = "dynamo_cost"

    def __init__(self, overlap_weight: float = 1.0) -> None:
        self._overlap_weight = overlap_weight

    def logits(self, req: RouteRequest, routes: Sequence[View]) -> list[tuple[float, float]]:
        """(prefill_blocks, decode_blocks) per route."""
        return [self._logit(req, v) for v in routes]

    def _logit(self, req: RouteRequest, v: View) -> tuple[float, float]:
        block, p = req.block_tokens, v.prefill or v
        uncached = max(req.prompt_tokens - p.cached_tokens(req), 0)
        return (p.load.prefill_tokens + uncached) / block, (v.load.kv_tokens + req.prompt_tokens + req.max_tokens) / block

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        w = self._overlap_weight
        return [-(w * p + d) for p, d in self.logits(req, routes)]

    def terms(self, req: RouteRequest, route: View) -> dict[str, float]:
        p, d = self._logit(req, route)
        return {"prefill_blocks": p, "decode_blocks": d}


@plugin("filter", "cache_affinity", CacheAwareWeights)
def cache_affinity(params: CacheAwareWeights, ctx: BuildContext) -> CacheAffinityFilter:
    """sglang-router's cache_aware rule: least loaded when imbalanced, else deepest match above the threshold."""
    return CacheAffinityFilter(params)


class DynamoParams(Params):
    overlap_weight: float = Field(default=1.0, ge=0, description="weight of the prefill blocks against the decode blocks")


@plugin("scorer", "dynamo_cost", DynamoParams)
def dynamo_cost(params: DynamoParams, ctx: BuildContext) -> DynamoCostScorer:
    """-(overlap_weight x prefill blocks + decode blocks), Dynamo's KV router cost."""
    return DynamoCostScorer(params.overlap_weight)
