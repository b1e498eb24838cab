"""Policies for clusters with a prefill pool: joint pair scoring, and the peers' way.

``PairTTFTPolicy`` (the ``ttft`` policy when prefill instances exist) prices every route a
request can take — each compatible (P, D) pair, and prefill on the decode instance alone —
with the TTFT terms of pd_cost.py and takes the cheapest, near-ties at random. Only the
best ``max_pair_candidates`` prefill and decode instances (each ranked on its own terms)
are paired, so the work stays linear in the pool size.

``IndependentPDPolicy`` chooses P and D separately, as sglang-router and vllm-router do;
it is the baseline pair scoring is measured against.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence

from router.config.model import PDConfig, TTFTWeights
from router.core.errors import NoRoute
from router.core.instances import Candidate
from router.scheduling.framework import Decision, Policy, RouteRequest, View, build_views, route_key
from router.scheduling.cost import colocated_ttft, prefill_work
from router.scheduling.filters import BoundedLoadFilter
from router.scheduling.pd_cost import (
    RouteCost,
    admission_seconds,
    decode_step_seconds,
    kv_fits,
    transfer_seconds,
    transfer_tokens,
)
from router.state.base import Snapshot


def split_pools(views: Sequence[View]) -> tuple[list[View], list[View]]:
    prefills = [v for v in views if v.candidate.role == "prefill"]
    decodes = [v for v in views if v.candidate.role in ("decode", "mixed")]
    return prefills, decodes


def _fail_open(kept: list[View], views: list[View]) -> list[View]:
    return kept or views


class PairTTFTPolicy:
    name = "ttft"
    revisable = True

    def __init__(self, weights: TTFTWeights, pd: PDConfig, rng: random.Random) -> None:
        self._w = weights
        self._pd = pd
        self._rng = rng
        self._bounded = BoundedLoadFilter(weights.bounded_load_factor, weights.bounded_load_slack)

    # -- the decode profile --------------------------------------------------------------
    def _decode_pool(self, req: RouteRequest, decodes: list[View]) -> list[View]:
        """Instances that can take one more decode: TBT under target, KV room, bounded load."""
        pool = _fail_open([d for d in decodes if decode_step_seconds(d, self._pd, 1, req.prompt_tokens) <= self._pd.tbt_target_s], decodes)
        pool = _fail_open([d for d in pool if kv_fits(req, d)], pool)
        return _fail_open(self._bounded.keep(req, pool), pool)

    def _local(self, req: RouteRequest, d: View) -> RouteCost:
        t = colocated_ttft(req, d, self._w)
        return RouteCost(t.queue_s, t.prefill_s + t.interference_s, 0.0, admission_seconds(req, d, self._pd),
                         decode_step_seconds(d, self._pd, 1, req.prompt_tokens), t.uncached_tokens, 0)

    def _pair(self, req: RouteRequest, p: View, d: View) -> RouteCost:
        t = colocated_ttft(req, p, self._w)
        return RouteCost(t.queue_s, t.prefill_s, transfer_seconds(req, p, d, self._pd), admission_seconds(req, d, self._pd),
                         decode_step_seconds(d, self._pd, 1, req.prompt_tokens), t.uncached_tokens, transfer_tokens(req, d))

    def routes(self, req: RouteRequest, views: list[View]) -> dict[str, tuple[RouteCost, View, View | None]]:
        """Every eligible route, by route key: (cost, decode view, prefill view or None).

        A mixed instance may always serve alone (colocated). A decode instance prefills
        alone only when selective disaggregation allows it: it lacks fewer than
        ``selective_threshold_tokens`` of the prompt, there is no usable prefill instance,
        or the queue ahead on the best pair's prefill instance alone outlasts doing the
        whole request locally. Otherwise prefill stays off the decode instances, whose
        time between tokens is what PD protects. SGLang decode workers never serve alone
        (they only take requests paired through a bootstrap room).
        """
        prefills, decodes = split_pools(views)
        if not decodes:
            raise NoRoute("no decode or mixed instance is available")
        decodes = self._decode_pool(req, decodes)
        pairs: dict[str, tuple[RouteCost, View, View | None]] = {}
        if prefills:
            k = self._pd.max_pair_candidates
            prefills = _fail_open(self._bounded.keep(req, prefills), prefills)
            top_p = heapq.nsmallest(k, prefills, key=lambda p: colocated_ttft(req, p, self._w).total_s)
            top_d = heapq.nsmallest(k, decodes, key=lambda d: self._local(req, d).admission_s + transfer_tokens(req, d))
            for d in top_d:
                for p in top_p:
                    if p.candidate.compat == d.candidate.compat:
                        pairs[route_key(d.id, p.id)] = (self._pair(req, p, d), d, p)
        best_pair = min((c for c, _, _ in pairs.values()), key=lambda c: c.total_s, default=None)
        out = dict(pairs)
        for d in decodes:
            if not d.candidate.standalone:
                continue
            local = self._local(req, d)
            if (
                d.candidate.role == "mixed"
                or best_pair is None
                or transfer_tokens(req, d) < self._pd.selective_threshold_tokens
                or best_pair.queue_s > local.total_s
            ):
                out[route_key(d.id)] = (local, d, None)
        return out

    # -- the choice ----------------------------------------------------------------------
    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        routes = self.routes(req, build_views(candidates, snap))
        if not routes:
            raise NoRoute("no compatible prefill instance for decode instances that cannot prefill alone")
        best = min(cost.total_s for cost, _, _ in routes.values())
        ties = [key for key, (cost, _, _) in routes.items() if cost.total_s <= best * (1 + self._w.tie_tolerance) + 1e-12]
        key = self._rng.choice(ties)
        cost, d, p = routes[key]
        reason = "pair" if p is not None else ("colocated" if d.candidate.role == "mixed" else "decode_only_faster")
        if p is not None and route_key(d.id) in routes and transfer_tokens(req, d) < self._pd.selective_threshold_tokens:
            # Selective disaggregation: D lacks so little that moving KV is not worth a hop.
            key, (cost, d, p), reason = route_key(d.id), routes[route_key(d.id)], "decode_only_threshold"
        terms = {k: c.as_dict() for k, (c, _, _) in routes.items()}
        return Decision(
            instance=d.id,
            acceptable=frozenset({key}) if reason == "decode_only_threshold" else frozenset(ties),
            reason=reason,
            scores={k: -c.total_s for k, (c, _, _) in routes.items()},
            terms=terms,
            prefill=p.id if p is not None else None,
            mode="disaggregated" if p is not None else ("colocated" if d.candidate.role == "mixed" else "decode_only"),
            estimate_s=cost.total_s,
            prefill_tokens=cost.prefill_tokens,
            prefill_work=prefill_work(req, p if p is not None else d, self._w),
        )


class IndependentPDPolicy:
    """P chosen by one policy over the prefill pool, D by another over the decode pool,
    each blind to the other and to the transfer between them (the peers' approach)."""

    revisable = True

    def __init__(self, name: str, prefill_policy: Policy, decode_policy: Policy) -> None:
        self.name = name
        self._prefill = prefill_policy
        self._decode = decode_policy
        self.revisable = prefill_policy.revisable or decode_policy.revisable

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        prefills = [c for c in candidates if c.role == "prefill"]
        decodes = [c for c in candidates if c.role in ("decode", "mixed")]
        if not decodes:
            raise NoRoute("no decode or mixed instance is available")
        if not prefills:
            decodes = [c for c in decodes if c.standalone]
            if not decodes:
                raise NoRoute("no prefill instance, and no decode instance can prefill alone")
            return self._decode.choose(req, decodes, snap)
        p = self._prefill.choose(req, prefills, snap)
        p_compat = next(c.compat for c in prefills if c.id == p.instance)
        decodes = [c for c in decodes if c.compat == p_compat] or decodes
        d = self._decode.choose(req, decodes, snap)
        cached = min(req.prompt_tokens, snap.matched.get(p.instance, 0) * req.block_tokens)
        return Decision(
            instance=d.instance,
            acceptable=frozenset(route_key(di, pi) for di in d.acceptable for pi in p.acceptable),
            reason=f"independent:{p.reason}",
            prefill=p.instance,
            mode="disaggregated",
            prefill_tokens=req.prompt_tokens - cached,
        )
