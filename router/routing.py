"""One routing decision: prompt -> block keys -> state lookup -> policy -> booking."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from router.config import HashingConfig
from router.hashing import root_seed, text_block_keys, token_block_keys
from router.metrics import Metrics
from router.policy.base import Candidate, Decision, Policy, RouteRequest
from router.prompt import ParsedRequest
from router.state.base import Booking, Snapshot, StateStore


def route_request(parsed: ParsedRequest, hashing: HashingConfig, request_id: str, default_max_tokens: int) -> RouteRequest:
    """Block keys and token counts of a parsed request (keys of the first prompt of a batch)."""
    seed = root_seed(parsed.model, hashing.seed)
    if parsed.tokens is not None:
        keys = token_block_keys(parsed.tokens, hashing.block_tokens, seed, hashing.max_blocks)
    else:
        keys = text_block_keys(parsed.text or "", hashing.block_chars, seed, hashing.max_blocks)
    return RouteRequest(
        id=request_id,
        keys=tuple(keys),
        prompt_tokens=parsed.prompt_tokens,
        max_tokens=parsed.max_tokens or default_max_tokens,
        block_tokens=hashing.block_tokens,
    )


class RequestChooser:
    """Binds a policy to one request so a state store can ask it to choose (and revise)."""

    def __init__(self, policy: Policy, req: RouteRequest, candidates: Sequence[Candidate]) -> None:
        self._policy = policy
        self._req = req
        self._candidates = candidates
        self.decision: Decision | None = None

    def _booking(self, decision: Decision, snap: Snapshot) -> Booking:
        self.decision = decision
        req = self._req
        cached = min(req.prompt_tokens, snap.matched.get(decision.instance, 0) * req.block_tokens)
        return Booking.single(req.id, decision.instance, req.prompt_tokens - cached, req.prompt_tokens + req.max_tokens, req.keys)

    def __call__(self, snap: Snapshot) -> Booking:
        return self._booking(self._policy.choose(self._req, self._candidates, snap), snap)

    def revise(self, snap: Snapshot, booking: Booking) -> Booking | None:
        if not self._policy.revisable:
            return None
        decision = self._policy.choose(self._req, self._candidates, snap)
        if booking.instance in decision.acceptable:
            return None
        return self._booking(decision, snap)


@dataclass(frozen=True)
class Routed:
    booking: Booking
    decision: Decision
    snapshot: Snapshot


async def decide(
    store: StateStore, policy: Policy, req: RouteRequest, candidates: Sequence[Candidate], metrics: Metrics | None = None
) -> Routed:
    """Choose and book an instance for ``req`` among ``candidates``."""
    chooser = RequestChooser(policy, req, candidates)
    started = time.perf_counter()
    snap, booking = await store.decide(req.keys, [c.id for c in candidates], chooser)
    assert chooser.decision is not None
    if metrics is not None:
        metrics.store_latency.labels("decide").observe(time.perf_counter() - started)
        metrics.decisions.labels(policy.name, chooser.decision.reason).inc()
        if req.prompt_tokens:
            metrics.cached_ratio.observe((req.prompt_tokens - booking.prefill_tokens) / req.prompt_tokens)
    return Routed(booking, chooser.decision, snap)
