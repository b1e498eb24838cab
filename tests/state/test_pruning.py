"""Candidate pruning on the Redis store: a decision scores the holders of the first block
plus the k least loaded, in one round trip, on standalone Redis and a Cluster; a replica
that never saw a prefix learns its holder from Redis and moves there before it books."""

from __future__ import annotations

import random

from router.config.model import PolicyConfig
from router.core.instances import Candidate
from router.scheduling import RouteRequest, build_policy
from router.scheduling.decide import decide
from router.scheduling.prune import Pruner
from router.state.base import Booking
from router.state.redis_store import RedisStore

POOL = [Candidate(f"i{n}", cache_tokens=100_000, prefill_tokens_per_s=10_000) for n in range(40)]
IDS = [c.id for c in POOL]
KEYS = tuple(range(5000, 5040))  # 40 blocks of 16 tokens: a 640-token prompt


class Book:
    def __init__(self, booking: Booking) -> None:
        self.booking = booking

    def __call__(self, snap):
        return self.booking

    def revise(self, snap, booking):
        return None


async def started(target, prefix: str) -> RedisStore:
    url, cluster = target
    store = RedisStore(url, {i: 10_000 for i in IDS}, key_prefix=prefix, cluster=cluster, default_cap=10_000)
    await store.start()
    return store


def request(n: int) -> RouteRequest:
    return RouteRequest(f"r{n}", KEYS, len(KEYS) * 16, 16, 16)


async def test_a_pruned_decision_scores_holders_and_the_least_loaded_in_one_round_trip(redis_target, key_prefix):
    store = await started(redis_target, key_prefix)
    policy = build_policy(PolicyConfig(seed=1), None)
    try:
        _, warm = await store.decide(KEYS, IDS, Book(Booking.single("warm", "i17", 0, 0, KEYS)))
        await store.release(warm)
        for n, inst in enumerate(IDS[:30]):  # most of the pool busy: pruning must not fall back to scanning
            if inst == "i17":
                continue
            await store.decide((), [inst], Book(Booking.single(f"busy{n}", inst, 1000 + 100 * n, 100)))
        trips = store.round_trips
        routed = await decide(store, policy, request(1), POOL, pruner=Pruner(4, random.Random(1)))
        assert store.round_trips - trips == 1
        assert routed.booking.instance == "i17"  # the holder
        assert len(routed.snapshot.loads) <= 5  # the holder and 4 others were scored, not 40
        assert "i17" in routed.snapshot.loads and routed.snapshot.matched["i17"] == len(KEYS)
    finally:
        await store.close()


async def test_a_replica_that_never_saw_the_prefix_finds_its_holder_through_redis(redis_target, key_prefix):
    first = await started(redis_target, key_prefix)
    second = await started(redis_target, key_prefix)
    policy = build_policy(PolicyConfig(seed=1), None)
    pruner = Pruner(4, random.Random(7))
    try:
        _, warm = await first.decide(KEYS, IDS, Book(Booking.single("warm", "i17", 0, 0, KEYS)))
        await first.release(warm)
        assert "i17" not in second.first_block_holders(KEYS[0])  # its own view: nobody holds it
        routed = await decide(second, policy, request(1), POOL, pruner=pruner)
        assert routed.booking.instance == "i17" and second.corrections == 1
        await second.release(routed.booking)
        assert "i17" in second.first_block_holders(KEYS[0])  # learnt from the answer
        trips = second.round_trips
        routed = await decide(second, policy, request(2), POOL, pruner=pruner)
        assert routed.booking.instance == "i17" and second.corrections == 1 and second.round_trips - trips == 1
        await second.release(routed.booking)
        view = await first.snapshot((), IDS)
        assert all(load.requests == 0 for load in view.loads.values())  # the moved booking left nothing behind
    finally:
        await first.close()
        await second.close()


async def test_the_load_index_carries_what_other_replicas_booked(redis_target, key_prefix):
    first = await started(redis_target, key_prefix)
    second = await started(redis_target, key_prefix)
    try:
        await first.decide((), ["i3"], Book(Booking.single("heavy", "i3", 50_000, 100)))
        assert "i3" not in second.load_index().loaded
        await second.snapshot((), ["i3", "i4"])
        assert second.load_index().loaded["i3"] >= 50_000  # read once: now in its pruning order
        assert "i4" not in second.load_index().loaded  # idle stays out of the index
    finally:
        await first.close()
        await second.close()
