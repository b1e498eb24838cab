"""One routing decision: state lookup -> policy -> booking, as one atomic step of the store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from router.core.errors import SLORejected
from router.core.metrics import Metrics
from router.core.instances import Candidate
from router.scheduling.framework import Decision, Policy, RouteRequest, route_key
from router.scheduling.prune import Pruner
from router.state.base import Booking, Leg, Snapshot, StateStore


def booking_for(req: RouteRequest, decision: Decision, snap: Snapshot) -> Booking:
    """Legs of a decision: the answering instance first, then a remote prefill (transient).

    KV booked on an instance that prefills locally is what the request adds to its cache:
    the prefix it finds there is shared with whoever else holds it, as engines share
    cached blocks, so booking the whole prompt per request would count one tenant's
    prefix once per request in flight and make its home look full. A decode instance fed
    by a remote prefill books the whole prompt it receives."""
    kv = req.prompt_tokens + req.max_tokens

    def uncached(instance: str) -> int:
        return req.prompt_tokens - min(req.prompt_tokens, snap.matched.get(instance, 0) * req.block_tokens)

    def queued(instance: str) -> int:
        if decision.prefill_work is not None:  # the policy priced the prefill, attention included
            return decision.prefill_work
        return uncached(instance)

    if decision.prefill is None:
        own = uncached(decision.instance) + req.max_tokens
        return Booking.single(req.id, decision.instance, queued(decision.instance), own, req.keys)
    terms = decision.terms.get(route_key(decision.instance, decision.prefill)) or {}
    nbytes = int(terms.get("transfer_bytes", 0))  # booked per NIC: both ends carry them
    legs = (Leg(decision.instance, 0, kv, 1, nbytes),
            Leg(decision.prefill, queued(decision.prefill), 0, 1, nbytes, transient=True))
    return Booking(req.id, legs, req.keys)


def booking_key(booking: Booking) -> str:
    return route_key(booking.legs[0].instance, booking.legs[1].instance if len(booking.legs) > 1 else None)


class RequestChooser:
    """Binds a policy to one request so a state store can ask it to choose (and revise)."""

    def __init__(self, policy: Policy, req: RouteRequest, candidates: Sequence[Candidate], slo_s: float | None = None) -> None:
        self._policy = policy
        self._req = req
        self._candidates = candidates
        self._slo_s = slo_s
        self.decision: Decision | None = None

    def __call__(self, snap: Snapshot) -> Booking:
        decision = self._policy.choose(self._req, self._candidates, snap)
        if self._slo_s is not None and decision.estimate_s is not None and decision.estimate_s > self._slo_s:
            raise SLORejected(decision, self._slo_s)
        self.decision = decision
        return booking_for(self._req, decision, snap)

    def revise(self, snap: Snapshot, booking: Booking) -> Booking | None:
        if not self._policy.revisable:
            return None
        decision = self._policy.choose(self._req, self._candidates, snap)
        if booking_key(booking) in decision.acceptable:
            return None
        self.decision = decision
        return booking_for(self._req, decision, snap)


@dataclass(frozen=True)
class Routed:
    booking: Booking
    decision: Decision
    snapshot: Snapshot
    started: float  # perf_counter when the decision began


async def decide(
    store: StateStore,
    policy: Policy,
    req: RouteRequest,
    candidates: Sequence[Candidate],
    metrics: Metrics | None = None,
    slo_s: float | None = None,
    pruner: Pruner | None = None,
) -> Routed:
    """Choose and book a route for ``req`` among ``candidates`` (with a ``pruner``, among the
    holders of its first block and the least loaded of them: prune.py)."""
    if pruner is not None and getattr(getattr(policy, "routes", None), "name", None) == "instances":
        pruned = pruner.prune(store, req, candidates)
        if pruned is not None:
            candidates, req = pruned.candidates, pruned.request
    chooser = RequestChooser(policy, req, candidates, slo_s)
    started = time.perf_counter()
    snap, booking = await store.decide(req.keys, [c.id for c in candidates], chooser)
    assert chooser.decision is not None
    decision = chooser.decision
    if metrics is not None:
        metrics.store_latency.labels("decide").observe(time.perf_counter() - started)
        metrics.decisions.labels(policy.name, decision.reason).inc()
        metrics.modes.labels(decision.mode).inc()
        if req.prompt_tokens:
            prefilling = decision.prefill or decision.instance
            cached = min(req.prompt_tokens, snap.matched.get(prefilling, 0) * req.block_tokens)
            metrics.cached_ratio.labels(prefilling).observe(cached / req.prompt_tokens)
            metrics.predicted_cached.labels(prefilling).inc(cached * snap.confidence.get(prefilling, 1.0))
            metrics.routed_prompt.labels(prefilling).inc(req.prompt_tokens)
    return Routed(booking, decision, snap, started)
