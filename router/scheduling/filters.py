"""Filters drop routes before scoring; the pipeline keeps all when a filter would drop all.

Each looks at a route's answering instance (the decode instance of a pair); the pd_pairs
route generator applies the same filters to the decode pool before pairing.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from router.config.model import PDConfig
from router.scheduling.framework import RouteRequest, View
from router.scheduling.pd_cost import decode_step_seconds, kv_fits
from router.scheduling.registry import BuildContext, NoParams, Params, plugin


class BoundedLoadFilter:
    """Consistent-hashing-with-bounded-loads guard: skip an instance whose in-flight
    requests would exceed ``factor`` x the mean (and ``slack`` above it). However good the
    cache saving looks, no instance takes much more than its share, which caps the damage
    when the TTFT model's rates are wrong for the hardware at hand.

    The slack (8 by default) keeps the bound from cutting ordinary fluctuation: with a few
    requests in flight per instance, a prefix's home is often 2-3 above the mean for a
    moment, and a slack of 2 pushed those requests to instances without the prefix (in the
    quality matrix's long-document replay, 47 of the 85 requests that left their prefix's
    holder were pushed by this filter, and each such copy evicted another document). Above
    ``slack / (factor - 1)`` requests per instance the factor bounds alone.

    The bound never pushes a request off an instance expected to hold ``keep_tokens`` or
    more of its prompt (matched blocks x confidence): leaving would recompute them, and a
    forced recompute of a long document or session history holds the new instance's GPU
    for whole steps, delaying everything queued there, which is the damage the bound exists
    to cap. A home over its bound because of such requests serves them from cache (mostly
    decode work); copying a long prefix stays with ``cache_room``, which prices it. Short
    shared prefixes (system prompts, under ``keep_tokens``) are still spread by the bound,
    which is what seeds their second homes. Replay matrix (docs/benchmarks.md): forced copies
    of 6-16K-token documents had made `ttft`'s p90 4-11x the peers' on long-document cells;
    2K, 4K and 8K thresholds gave the same cells within a few percent."""

    name = "bounded_load"

    def __init__(self, factor: float, slack: int, keep_tokens: int = 4096) -> None:
        self._factor = factor
        self._slack = slack
        self._keep_tokens = keep_tokens

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        if req.population is not None:  # the routes were pruned: the pool's mean, not theirs
            mean = (req.population[0] + 1) / req.population[1]
        else:
            mean = (sum(v.load.requests for v in routes) + 1) / len(routes)  # count this request too
        bound = max(self._factor * mean, mean + self._slack)
        keep = self._keep_tokens
        if keep <= 0 or req.prompt_tokens < keep:
            return [v for v in routes if v.load.requests + 1 <= bound], None
        block, prompt = req.block_tokens, req.prompt_tokens
        return [v for v in routes if v.load.requests + 1 <= bound
                or min(prompt, v.matched_blocks * block) * v.confidence >= keep], None


class TBTFilter:
    """Skip a decode instance whose step time with this request added would pass the
    time-between-tokens target: PD exists to protect it."""

    name = "tbt"

    def __init__(self, pd: PDConfig) -> None:
        self._pd = pd

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        pd, target = self._pd, self._pd.tbt_target_s
        return [v for v in routes if decode_step_seconds(v, pd, 1, req.prompt_tokens) <= target], None


class KVRoomFilter:
    """Skip an instance whose KV cache cannot hold this request's prompt and output next
    to what it already holds (it would have to wait for room)."""

    name = "kv_room"

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        return [v for v in routes if kv_fits(req, v)], None


class BoundedLoadParams(Params):
    factor: float = Field(default=2.0, gt=1, description="bound as a multiple of the mean in-flight requests")
    slack: int = Field(default=8, ge=0, description="requests always allowed above the mean")
    keep_tokens: int = Field(default=4096, ge=0, description="a request expected to find this many prompt tokens cached on an "
                             "instance is never pushed off it by the bound (leaving would recompute them); 0 = always bound")


@plugin("filter", "bounded_load", BoundedLoadParams)
def bounded_load(params: BoundedLoadParams, ctx: BuildContext) -> BoundedLoadFilter:
    """Skip instances far above the mean in-flight load (factor x mean, and slack above it), unless they hold keep_tokens of the prompt."""
    return BoundedLoadFilter(params.factor, params.slack, params.keep_tokens)


@plugin("filter", "tbt", NoParams)
def tbt(params: NoParams, ctx: BuildContext) -> TBTFilter:
    """Skip decode instances whose step time would pass pd.tbt_target_s (needs a prefill pool)."""
    return TBTFilter(ctx.require_pd("the tbt filter"))


@plugin("filter", "kv_room", NoParams)
def kv_room(params: NoParams, ctx: BuildContext) -> KVRoomFilter:
    """Skip instances whose KV cache cannot hold prompt + max_tokens now."""
    return KVRoomFilter()
