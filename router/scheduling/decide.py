"""One routing decision: state lookup -> policy -> booking, as one atomic step of the store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from router.core.errors import SLORejected
from router.core.metrics import Metrics
from router.core.instances import Candidate
from router.core.frozen import quick_init
from router.scheduling.framework import Decision, Policy, RouteRequest, View, route_key
from router.scheduling.prune import Pruner
from router.scheduling.store_cost import loaded_tokens
from router.state.base import Booking, Leg, Load, Snapshot, StateStore
from router.state.store_tier import StoreTier


def booking_for(req: RouteRequest, decision: Decision, snap: Snapshot) -> Booking:
    """Legs of a decision: the answering instance first, then a remote prefill (transient).

    An instance that prefills locally shares the prompt's blocks with every other request
    in flight there that holds them, as engines share cached blocks: its leg pins the
    block keys (the store books the union of the blocks in flight per instance, pins.py)
    and books as its own only the prompt's tail beyond them and its output. Booking the
    whole prompt per request would count one tenant's prefix once per request in flight;
    booking what the request adds (prompt - cached) would lose the prefix from the booked
    KV as soon as the request that brought it ends while its sharers still hold it. A
    decode instance fed by a remote prefill books the whole prompt it receives."""
    kv = req.prompt_tokens + req.max_tokens

    def uncached(instance: str) -> int:
        return req.prompt_tokens - min(req.prompt_tokens, snap.matched.get(instance, 0) * req.block_tokens)

    def queued(instance: str) -> int:
        if decision.prefill_work is not None:  # the policy priced the prefill, attention included
            return decision.prefill_work
        return uncached(instance)

    if decision.prefill is None:
        tail = max(0, req.prompt_tokens - len(req.keys) * req.block_tokens)
        return Booking.single(req.id, decision.instance, queued(decision.instance), tail + req.max_tokens, req.keys,
                              req.block_tokens if req.keys else 0)
    terms = decision.terms.get(route_key(decision.instance, decision.prefill)) or {}
    nbytes = int(terms.get("transfer_bytes", 0))  # booked per NIC: both ends carry them
    legs = (Leg(decision.instance, 0, kv, 1, nbytes),
            Leg(decision.prefill, queued(decision.prefill), 0, 1, nbytes, transient=True))
    return Booking(req.id, legs, req.keys)


def booking_key(booking: Booking) -> str:
    return route_key(booking.legs[0].instance, booking.legs[1].instance if len(booking.legs) > 1 else None)


class RequestChooser:
    """Binds a policy to one request so a state store can ask it to choose (and revise)."""

    def __init__(self, policy: Policy, req: RouteRequest, candidates: Sequence[Candidate], slo_s: float | None = None,
                 pool: Sequence[Candidate] = ()) -> None:
        """``pool``: every candidate when ``candidates`` were pruned from it (see ``widen``)."""
        self._policy = policy
        self._req = req
        self._candidates = candidates
        self._pool = pool
        self._slo_s = slo_s
        self.decision: Decision | None = None

    @property
    def candidates(self) -> Sequence[Candidate]:
        """The candidates chosen among (widened by a shared store's revise, if it was)."""
        return self._candidates

    def widen(self, instances: Sequence[str]) -> list[str]:
        """A shared store found these instances holding the prompt's first block although
        pruning (on this replica's view) left them out: score them too when revising.
        Returns the ones added (those of the pool not already candidates)."""
        if not self._pool:
            return []
        have = {c.id for c in self._candidates}
        wanted = set(instances) - have
        added = [c for c in self._pool if c.id in wanted]
        if added:
            self._candidates = [*self._candidates, *added]
        return [c.id for c in added]

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


@quick_init
@dataclass(frozen=True)
class Routed:
    booking: Booking
    decision: Decision
    snapshot: Snapshot
    started: float  # perf_counter when the decision began
    prefill_rate: float | None = None  # the prefilling candidate's rate when decided (calibration compares with it)
    external_prefill: int = 0  # prefill queued on the prefilling instance beyond the bookings (engine-reported) then


def book_store_load(tier: StoreTier, req: RouteRequest, decision: Decision, snap: Snapshot,
                    candidates: Sequence[Candidate]) -> None:
    """Book on the tier the load the chosen prefilling instance will make (store_cost.py), and,
    colocated, where and when it waits for its last token: at the decision's estimate."""
    prefilling = decision.prefill or decision.instance
    cand = next((c for c in candidates if c.id == prefilling), None)
    if cand is None or req.store is None:
        return
    view = View(cand, snap.matched.get(prefilling, 0), snap.loads.get(prefilling, Load()), None, None,
                snap.confidence.get(prefilling, 1.0))
    landing = prefilling if decision.prefill is None else None  # a prefill leg's last token reaches no client
    tier.book_load(loaded_tokens(req, view), cand.kv_bytes_per_token or req.store.bytes_per_token, landing,
                   decision.estimate_s)


async def decide(
    store: StateStore,
    policy: Policy,
    req: RouteRequest,
    candidates: Sequence[Candidate],
    metrics: Metrics | None = None,
    slo_s: float | None = None,
    pruner: Pruner | None = None,
    tier: StoreTier | None = None,
) -> Routed:
    """Choose and book a route for ``req`` among ``candidates`` (with a ``pruner``, among the
    holders of its first block and the least loaded of them: prune.py). With a shared KV
    store's ``tier``, the request carries what the store holds of it (priced in cost.py), and
    its prefix is believed stored once booked: the engine that computes it writes it there."""
    if tier is not None and req.keys:
        hit, landings = tier.hit(req.keys), tier.landings()
        if hit is not None or landings:
            req = replace(req, store=hit, landings=landings or None)
    elsewhere = getattr(policy, "external_loads", None)  # engines.external.ExternalLoadPolicy
    external_now = elsewhere() if elsewhere is not None else None  # one read for pruning and calibration
    pool: Sequence[Candidate] = ()
    if pruner is not None and getattr(getattr(policy, "routes", None), "name", None) == "instances":
        pruned = pruner.prune(store, req, candidates, external_now)
        if pruned is not None:
            pool, candidates, req = candidates, pruned.candidates, pruned.request
    chooser = RequestChooser(policy, req, candidates, slo_s, pool)
    started = time.perf_counter()
    snap, booking = await store.decide(req.keys, [c.id for c in candidates], chooser)
    assert chooser.decision is not None
    decision = chooser.decision
    if tier is not None:
        if req.store is not None:  # the chosen instance loads what the store holds beyond its cache
            book_store_load(tier, req, decision, snap, candidates)
        tier.record(req.keys)
    if metrics is not None:
        latency, decisions, modes = metrics.decided(policy.name, decision.reason, decision.mode)
        latency.observe(time.perf_counter() - started)
        decisions.inc()
        modes.inc()
        if req.prompt_tokens:
            prefilling = decision.prefill or decision.instance
            cached = min(req.prompt_tokens, snap.matched.get(prefilling, 0) * req.block_tokens)
            series = metrics.engine(prefilling)
            series.cached_ratio.observe(cached / req.prompt_tokens)
            series.predicted_cached.inc(cached * snap.confidence.get(prefilling, 1.0))
            series.routed_prompt.inc(req.prompt_tokens)
    rate, external = None, 0
    if decision.estimate_s is not None:  # the estimate was priced at this rate: calibration needs it (CalibrationHook)
        prefilling = decision.prefill or decision.instance
        rate = next((c.prefill_tokens_per_s for c in chooser.candidates if c.id == prefilling), None)
        if external_now:  # ... and behind this much unbooked queue
            extra = external_now.get(prefilling)
            external = extra.prefill_tokens if extra is not None else 0
    return Routed(booking, decision, snap, started, rate, external)
