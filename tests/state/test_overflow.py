"""Finding 1 of issue 10: no argument may corrupt the shared load in Redis.

A booking of 10^30 tokens used to be stored as ``1:1:-9223372036854775808:0`` (Lua's '%d'
wraps), which no script could parse again: every later route, sweep and abandon failed."""

import redis.asyncio as aioredis

from router.state.base import Booking
from router.state.redis_store import RedisStore
from state.test_contract import GreedyChooser  # type: ignore[import-not-found]

INSTANCES = ["a", "b"]


class HugeChooser(GreedyChooser):
    def __call__(self, snap):
        return Booking.single(self.req_id, "a", 10**30, 10**30, self.keys)


async def test_huge_amounts_are_clamped_and_released(redis_url, key_prefix):
    store = RedisStore(redis_url, {"a": 10, "b": 10}, key_prefix=key_prefix)
    observer = RedisStore(redis_url, {"a": 10, "b": 10}, key_prefix=key_prefix)  # sees the shared load only
    await store.start()
    await observer.start()
    try:
        _, huge = await store.decide([1], INSTANCES, HugeChooser("huge", [1]))
        assert store.errors == 0
        snap = await observer.snapshot([1], INSTANCES)
        assert snap.loads["a"].requests == 1 and 0 < snap.loads["a"].kv_tokens <= 2**52
        _, other = await store.decide([2], INSTANCES, GreedyChooser("next", [2], only="b"))  # scripts still run
        await store.release(huge)
        await store.release(other)
        assert store.errors == 0
        snap = await observer.snapshot([], INSTANCES)
        assert snap.loads["a"].requests == 0 and snap.loads["a"].kv_tokens == 0
    finally:
        await store.close()
        await observer.close()


async def test_an_unparsable_stored_load_counts_as_idle(redis_url, key_prefix):
    raw = aioredis.from_url(redis_url, decode_responses=True)
    store = RedisStore(redis_url, {"a": 10, "b": 10}, key_prefix=key_prefix)
    loads = store.layout.loads_key("a")
    await raw.hset(loads, "a", "1:1:-9223372036854775808:0")  # what the bug left behind
    await store.start()
    try:
        _, booking = await store.decide([1], INSTANCES, GreedyChooser("r", [1], only="a"))
        await store.release(booking)
        assert store.errors == 0
        assert await raw.hget(loads, "a") is None  # healed: idle again
    finally:
        await store.close()
        await raw.aclose()
