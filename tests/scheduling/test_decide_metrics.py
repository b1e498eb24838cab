"""What a decision tells /metrics: the router's predicted hit ratio, token-weighted per engine."""

import asyncio
import random

from router.config.model import PolicyConfig
from router.core.instances import Candidate
from router.core.metrics import Metrics
from router.scheduling import build_policy
from router.scheduling.decide import decide
from router.scheduling.framework import RouteRequest
from router.state.base import Booking
from router.state.memory import MemoryStore


def _value(metrics: Metrics, name: str, engine: str) -> float:
    return metrics.registry.get_sample_value(name, {"engine": engine}) or 0.0


def test_predicted_cached_and_routed_prompt_tokens_are_counted_per_engine():
    store = MemoryStore({"a": 1000}, clock=lambda: 0.0)
    keys = tuple(range(10))
    store.book(Booking.single("x", "a", 0, 0, keys[:6]))  # a holds the first 6 of 10 blocks
    metrics = Metrics()
    policy = build_policy(PolicyConfig(name="ttft"), rng=random.Random(0))
    req = RouteRequest("r", keys, 640, 8, 64)
    asyncio.run(decide(store, policy, req, [Candidate("a")], metrics))
    assert _value(metrics, "pd_router_routed_prompt_tokens_total", "a") == 640
    assert _value(metrics, "pd_router_predicted_cached_tokens_total", "a") == 6 * 64  # confidence 1: a fresh entry
