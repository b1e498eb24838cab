"""External load: what an engine reports beyond what routers sharing this state booked.

Traffic that bypasses the router (or comes through a router with other state) is
invisible to booked load, yet it queues on the engine. At each scrape the engine's
running + waiting requests and KV usage are compared with the load booked on it at that
same moment; the excess, floored at 0, is "external" and is added to the booked load
every scorer sees until the next scrape. Subtracting the booked load taken at scrape
time (not at decision time) keeps the router's own requests from being counted twice.

The engine does not say how long the external requests' prompts are: their queued
prefill is estimated from its counters (mean uncached prompt tokens per finished
request) times the external share of its waiting requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from router.core.instances import Candidate
from router.engines.readings import EngineReading
from router.scheduling.framework import Decision, Policy, RouteRequest
from router.state.base import Load, Snapshot

_IDLE = Load()


def mean_uncached_prompt(reading: EngineReading) -> float:
    """Mean prompt tokens an engine computed (not served from cache) per finished request."""
    if not reading.finished or reading.prompt_tokens is None:
        return 0.0
    uncached = reading.prompt_tokens - (reading.hit_tokens or 0.0)
    return max(0.0, uncached / reading.finished)


def external_load(reading: EngineReading, booked: Load, capacity_tokens: int) -> Load:
    """The part of ``reading`` not explained by ``booked`` (the booked load at scrape time)."""
    total = reading.requests
    if total is None:
        return _IDLE
    requests = max(0, round(total) - booked.requests)
    waiting = reading.waiting or 0.0
    external_waiting = waiting * requests / total if total > 0 else 0.0
    prefill = round(external_waiting * mean_uncached_prompt(reading))
    kv = 0
    if reading.kv_usage is not None:
        kv = max(0, round(reading.kv_usage * capacity_tokens) - booked.kv_tokens)
    return Load(requests=requests, prefill_tokens=prefill, kv_tokens=kv)


def add_loads(snap: Snapshot, extra: Mapping[str, Load]) -> Snapshot:
    """``snap`` with ``extra`` added to the loads of the instances it names (every field;
    the residency confidence is kept)."""
    loads = dict(snap.loads)
    for instance, more in extra.items():
        if instance not in loads:
            continue
        old = loads[instance]  # every other field (bytes in flight, the head's start) stays as booked
        loads[instance] = replace(
            old,
            requests=old.requests + more.requests,
            prefill_tokens=old.prefill_tokens + more.prefill_tokens,
            kv_tokens=old.kv_tokens + more.kv_tokens,
            transfers=old.transfers + more.transfers,
        )
    return replace(snap, loads=loads)


class ExternalLoadPolicy:
    """A policy that sees booked + external load. Wraps any policy: scorers stay unaware
    of where a load figure came from, and the decision path is unchanged when no engine
    reports anything beyond the router's own bookings (the common case costs one call)."""

    def __init__(self, inner: Policy, external: Callable[[], Mapping[str, Load]]) -> None:
        self.inner = inner
        self.name = inner.name
        self.revisable = inner.revisable
        # the wrapped route generator, so decide() prunes the candidates as it would the inner
        # policy's (telling the pruner which instances carry external load: prune.py)
        self.routes = getattr(inner, "routes", None)
        self._external = external

    def external_loads(self) -> Mapping[str, Load]:
        """The instances with external load now, and how much (empty in the common case)."""
        return self._external()

    def describe(self) -> Any:
        """The wrapped policy's description (/debug/route), if it has one."""
        describe = getattr(self.inner, "describe", None)
        return describe() if describe is not None else None

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        extra = self._external()
        if extra:
            snap = add_loads(snap, extra)
        return self.inner.choose(req, candidates, snap)
