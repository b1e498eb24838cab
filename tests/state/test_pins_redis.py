"""lua/pins.lua's tree of pinned chains against pins.py's PinCounts (the memory store): the
booked KV that random traffic of chained prompts leaves, read straight from Redis after every
booking and release (the store's own view would hide an error behind its mirror)."""

import random

import pytest
import redis.asyncio as aioredis

from router.state.base import Booking, Snapshot
from router.state.memory import MemoryStore
from router.state.pins import PIN_FINE, PIN_STRIDE
from router.state.redis_store import RedisStore

BLOCK_TOKENS = 16
OWN = 3


class Fixed:
    def __init__(self, booking: Booking) -> None:
        self.booking = booking

    def __call__(self, snap: Snapshot) -> Booking:
        return self.booking

    def revise(self, snap: Snapshot, booking: Booking) -> None:
        return None


def prompt(rng: random.Random, longest: int) -> tuple[int, ...]:
    """Chained block keys of a prompt through a small tree of shared prefixes (each key stands
    for its whole prefix, as request/hashing.py's do); lengths off the grid too."""
    keys, key = [], 17
    for _ in range(rng.randint(1, longest)):
        branch = rng.randrange(2) if rng.random() < 0.08 else 0
        key = (key * 1_000_003 + branch + 1) % (1 << 61)
        keys.append(key)
    return tuple(keys)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_the_lua_tree_books_and_releases_the_kv_the_memory_store_does(redis_url, key_prefix, seed):
    rng = random.Random(seed)
    # seeds 4 and 5: prompts across the grid's octaves (PIN_FINE and beyond)
    longest, scale = (9 * PIN_STRIDE, 1) if seed <= 3 else (6 * PIN_FINE, 25)
    caps = {"a": 40 * PIN_STRIDE * scale}  # below what the bookings in flight pin at times: the cap is met
    memory = MemoryStore(caps, 600.0)
    store = RedisStore(redis_url, caps, key_prefix=key_prefix)
    await store.start()
    raw = aioredis.from_url(redis_url, decode_responses=True)
    live: list[Booking] = []

    async def shared_kv() -> int:
        stored = await raw.hget(store.layout.loads_key("a"), "a")
        return int(stored.split(":")[2]) if stored else 0

    try:
        for step in range(160):
            if live and rng.random() < 0.45:
                booking = live.pop(rng.randrange(len(live)))
                await memory.release(booking)
                await store.release(booking)
            else:
                keys = prompt(rng, longest)
                booking = Booking.single(f"r{step}", "a", 0, OWN, keys, BLOCK_TOKENS)
                await memory.decide(keys, ["a"], Fixed(booking))
                await store.decide(keys, ["a"], Fixed(booking))
                live.append(booking)
            assert await shared_kv() == memory.load_of("a").kv_tokens, step
        for booking in live:
            await memory.release(booking)
            await store.release(booking)
        assert await shared_kv() == memory.load_of("a").kv_tokens == 0
        pins = await raw.hkeys(store.layout.instance_tag("a") + ":pin")
        assert not [f for f in pins if f.startswith("a\x1f")]  # every pinned key went with its last holder
    finally:
        await raw.aclose()
        await store.close()
