"""The store term of the TTFT estimate: load a prefix from a shared KV store, or compute it.

With a store (kv_store), an instance that lacks part of a prefix the store holds can load
it instead of computing it: the bytes cross the store's bandwidth while the instance
computes the rest of the prompt, so the prefill takes

    max(load, prefill of what the store lacks)      load = setup + (T + min(n T, B)) / (1 - rho)
                                                    T = tokens x bytes / bandwidth

(n loads booked in the store tier still moving B seconds of bytes share the bandwidth, and
so will the loads that start while this one moves: at the store's recent utilization rho,
a processor-sharing queue's expected stay is the work in front of it stretched 1 / (1 - rho))

against ``prefill of what the instance lacks`` without the store; the estimate takes the
cheaper (cost.py). A load-bound request (the rest computed before its load ends) still needs a
step for its last token once the load is done; where another prefill computes then, that step
and the one in progress are its chunks, so a route that computes where loads are about to land
also delays them (``landing_delay_s``): a cost of the route, not of its own first token. Stored tokens are expected ones (the tier's LRU confidence), as cached
ones are. A copy on a new instance then costs a load, not a recompute: the placement filter
(cache_room) prices displacing a stored prefix at its reload, on the store as busy as it is.
"""

from __future__ import annotations

import math

from router.scheduling.framework import RouteRequest, View
from router.state.store_tier import StoreTier


def stored_tokens(req: RouteRequest) -> float:
    """Prompt tokens the store is expected to hold (0 without a store)."""
    hit = req.store
    if hit is None:
        return 0.0
    return min(req.prompt_tokens, hit.blocks * req.block_tokens) * hit.confidence


def load_seconds(req: RouteRequest, view: View, tokens: float) -> float:
    """Seconds to load ``tokens`` of KV from the store onto ``view``'s instance."""
    hit = req.store
    if hit is None or tokens <= 0:
        return 0.0
    per_token = view.candidate.kv_bytes_per_token or hit.bytes_per_token
    alone = tokens * per_token / hit.bytes_per_s
    # loads booked and still moving share the bandwidth fairly: each costs min(T, its rest);
    # those starting meanwhile take the store's utilization of it
    stretch = 1.0 / (1.0 - min(hit.utilization, StoreTier.max_utilization))  # bounded for any StoreHit
    return hit.setup_s + (alone + min(hit.loads * alone, hit.backlog_s)) * stretch


def loaded_tokens(req: RouteRequest, view: View) -> float:
    """Tokens ``view``'s instance would load from the store: what it holds beyond the instance's cache."""
    return stored_tokens(req) - view.expected_cached_tokens(req)


def computed_tokens(req: RouteRequest, view: View) -> float:
    """Prompt tokens ``view``'s instance would compute itself: what neither its cache nor the
    store holds (what the store holds is loaded, not computed)."""
    return req.prompt_tokens - max(float(view.cached_tokens(req)), stored_tokens(req))


def landing_delay_s(req: RouteRequest, view: View, start_s: float, compute_s: float, uncached: float,
                    chunk: int) -> float:
    """Seconds of other requests' first tokens a prefill computing on ``view``'s instance from
    ``start_s`` for ``compute_s`` delays: the loads booked there that land meanwhile
    (``RouteRequest.landings``) each wait for the step in progress (half a step on average)
    and then share a step with the next chunk, if any. The prefill runs k = ceil(uncached /
    chunk) steps of compute / k, so a landing waits s / 2 + s (1 - 1 / k) (up to 1.5 steps;
    half of the only step when k = 1). 0 without landings or a step budget (``chunk``)."""
    landings = req.landings.get(view.candidate.id) if req.landings else None
    if not landings or chunk <= 0 or compute_s <= 0 or uncached <= 0:
        return 0.0
    end = start_s + compute_s
    hit = sum(1 for t in landings if start_s <= t <= end)
    if not hit:
        return 0.0
    steps = math.ceil(uncached / chunk)
    step = compute_s / steps
    return hit * step * (1.5 - 1.0 / steps)
