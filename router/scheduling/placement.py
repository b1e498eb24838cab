"""Placement that prices cache room: keep a prefix at its home, copy it only when the copy
pays for what it displaces, and agree on the home without talking.

``cache_room`` (filter): a route that would prefill a prefix some other instance already
holds makes a second copy of it: the copy computes the duplicated tokens again (work the
home would not do, which delays whatever queues behind it), and beyond the instance's
free room it evicts as many tokens of other prefixes, which someone will miss later, as
often as that instance's evictions come back (router/state/displacement.py's LRU model:
near 0 when what it evicts is cold, several times over under pressure, where each
re-miss evicts in turn; 0 where the store does not measure it). Both are priced as
prefill time on that instance (``displacement`` x tokens / rate). A non-holder is kept only when its
estimated TTFT plus that cost still beats the best holder: hot-spot replication, when the
holders' queues outgrow what the copy costs; otherwise the prefix stays home, and the
scorers choose among its holders. A prefix nobody holds (reason ``room``) goes where its
TTFT plus what it evicts there costs the least: free room first (``_place_new``).

``rendezvous`` (picker): highest total, and among the near-ties the instance with the
highest hash of (block key, instance id) — highest-random-weight hashing — where the key
is the first block none of the tied routes holds: the part of the prompt that still needs
a home. For a new tenant that is its first distinguishing block (past any system prompt
every tenant shares, which would otherwise send every tie to one instance), so every
router replica computes the same home for it without sharing anything; for a prompt the
tied routes hold alike it is the block after their match. Requests without a full block
fall back to a seeded random tie break.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash
from pydantic import Field

from router.config.model import TTFTWeights
from router.scheduling.framework import RouteRequest, View
from router.scheduling.registry import BuildContext, Params, plugin
from router.scheduling.scorers import TTFTScorer, shared_ttft
from router.scheduling.store_cost import load_seconds


def copy_tokens(duplicated: float, room: tuple[int, float, float], block: int) -> float:
    """The tokens a copy of ``duplicated`` tokens costs on an instance with ``room`` (free
    blocks, re-prefills per evicted token: View.room): those it computes again, plus the
    future re-prefills of what it evicts beyond the free room."""
    free, misses = room[0], room[1]
    evicted = duplicated - free * block
    return duplicated + misses * evicted if evicted > 0.0 else duplicated


class CacheRoomFilter:
    name = "cache_room"

    def __init__(self, weights: TTFTWeights, displacement: float, ttft: TTFTScorer | None = None) -> None:
        """``ttft``: the policy's estimator (its ttft scorer), so routes are priced once."""
        self._ttft = ttft or TTFTScorer(weights)
        self._default_rate = weights.prefill_tokens_per_s
        self._displacement = displacement

    def displacement_s(self, req: RouteRequest, route: View, held: float) -> float:
        """What a copy on ``route`` costs beyond its own TTFT: it computes the tokens it
        duplicates (``held`` by the best holder, minus what this route already has) a
        second time, which delays whatever queues behind it there; and beyond the
        instance's free room it evicts as many tokens of other prefixes, each re-prefilled
        later as often as that instance's evictions come back (``View.room``:
        router/state/displacement.py)."""
        p = route.prefilling
        duplicated = held - p.expected_cached_tokens(req)
        if duplicated <= 0.0:
            return 0.0
        return self._redo_s(req, p, copy_tokens(duplicated, p.room, req.block_tokens))

    def _redo_s(self, req: RouteRequest, p: View, tokens: float) -> float:
        """The price of ``tokens`` prefilled again on ``p``'s instance: prefill seconds there,
        or with a shared store a load, on the store as busy as it is now (store_cost.py),
        whichever is less; times ``displacement``."""
        recompute = tokens / (p.candidate.prefill_tokens_per_s or self._default_rate)
        if req.store is not None:
            recompute = min(recompute, load_seconds(req, p, tokens))
        return self._displacement * recompute

    def _place_new(self, req: RouteRequest, routes: Sequence[View], prefilling: Sequence[View],
                   cached: Sequence[float]) -> tuple[list[View], str | None]:
        """A prefix nobody holds takes cache room wherever it goes: keep the routes whose TTFT
        plus the re-prefills of what the prompt evicts beyond the instance's free room is the
        least, so new prefixes fill free room before they push others out.

        What an eviction costs is priced at the pool's re-prefills per evicted token (as of
        the instance's last record: View.room), not the instance's own: in a pool under one
        workload the instances' shares differ mostly by sampling noise, and a prompt's
        thousands of evicted tokens times several re-prefills each dwarf a queue of
        milliseconds, so pricing each one's own sends every new prefix to whichever cache
        looks coldest until its queue grows by seconds (in the replay matrix: p90 up to 1.9x
        the peers' where the mean keeps 0.86x). Free room is what is known per instance.
        Where no route would evict anything that comes back, every route is kept and the
        scorers choose."""
        prompt, block = req.prompt_tokens, req.block_tokens
        costs = []
        for p, c in zip(prefilling, cached):
            free, _, misses = p.room
            evicted = prompt - c - free * block
            costs.append(self._redo_s(req, p, misses * evicted) if evicted > 0.0 and misses > 0.0 else 0.0)
        if not any(costs):
            return list(routes), None
        totals = [e + d for e, d in zip(self._ttft.estimates(req, routes), costs)]
        best = min(totals)
        kept = [r for r, t in zip(routes, totals) if t <= best]
        return kept, ("room" if len(kept) < len(routes) else None)

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        # View.prefilling.expected_cached_tokens, inlined (it runs for every candidate)
        prompt, block = req.prompt_tokens, req.block_tokens
        prefilling = [r.prefill or r for r in routes]
        cached = [(prompt if p.matched_blocks * block > prompt else p.matched_blocks * block) * p.confidence
                  for p in prefilling]
        held = max(cached, default=0.0)
        if held < block:  # nobody holds this prefix: its home is where it displaces the least
            return self._place_new(req, routes, prefilling, cached)
        estimates = self._ttft.estimates(req, routes)
        floor = held - block  # a block short of the deepest still counts as a holder
        home = min(e for e, c in zip(estimates, cached) if c >= floor)
        kept: list[View] = []
        copies = 0
        store, price, rate = req.store is not None, self._displacement, self._default_rate
        for r, p, e, c in zip(routes, prefilling, estimates, cached):
            if c >= floor:
                kept.append(r)
                continue
            if store:
                cost = self.displacement_s(req, r, held)
            else:  # displacement_s without a store, inlined: c < floor, so held - c > 0
                cost = price * (copy_tokens(held - c, p.room, block) / (p.candidate.prefill_tokens_per_s or rate))
            if e + cost < home:
                kept.append(r)
                copies += 1
        if len(kept) == len(routes):
            return kept, None
        return kept, "replicate" if copies else "home"


def rendezvous_weight(key: int, instance: str) -> int:
    """Highest-random-weight of ``instance`` for a block key: the same on every replica."""
    return xxhash.xxh64_intdigest(instance.encode(), seed=key & 0xFFFFFFFFFFFFFFFF)


class RendezvousPicker:
    name = "rendezvous"
    revisable = True

    def __init__(self, rng: random.Random, tolerance: float) -> None:
        self._rng = rng
        self._tolerance = tolerance

    def _ties(self, totals: Sequence[float]) -> list[int]:
        best = max(totals)
        floor = best - abs(best) * self._tolerance - 1e-12
        return [i for i, t in enumerate(totals) if t >= floor]

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        ties = self._ties(totals)
        return self._rng.choice(ties), ties

    def pick_for(self, req: RouteRequest, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        ties = self._ties(totals)
        if not req.keys or len(ties) == 1:
            return (ties[0], ties) if len(ties) == 1 else self.pick(routes, totals)
        held = max(routes[i].prefilling.matched_blocks for i in ties)
        key = req.keys[min(held, len(req.keys) - 1)]
        return max(ties, key=lambda i: rendezvous_weight(key, routes[i].prefilling.key)), ties


class CacheRoomParams(Params):
    displacement: float = Field(default=1.0, ge=0, description="price of the tokens a copy evicts, as a multiple of re-prefilling them")


class RendezvousParams(Params):
    tolerance: float = Field(default=0.0, ge=0, lt=1, description="totals within this fraction of the best are ties, broken by rendezvous hash")


@plugin("filter", "cache_room", CacheRoomParams)
def cache_room(params: CacheRoomParams, ctx: BuildContext) -> CacheRoomFilter:
    """Keep a prefix at its holders unless a copy's TTFT gain pays for the cache it displaces."""
    return CacheRoomFilter(ctx.policy.ttft, params.displacement, shared_ttft(ctx))


@plugin("picker", "rendezvous", RendezvousParams)
def rendezvous(params: RendezvousParams, ctx: BuildContext) -> RendezvousPicker:
    """Highest total; near-ties go to the highest rendezvous hash of (first unheld block, instance)."""
    return RendezvousPicker(ctx.rng, params.tolerance)
