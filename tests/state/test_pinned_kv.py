"""Booked KV as the union of the blocks in flight per instance (router/state/pins.py), in
every store: memory, a real redis-server and a 3-node Redis Cluster (``make_store``)."""

import asyncio

from router.state.base import Booking, Snapshot
from router.state.pins import PIN_STRIDE
from router.state.redis_store import RedisStore

INSTANCES = ["a", "b", "c"]
# The tests speak of blocks of PIN_STRIDE block keys (the stores count every PIN_STRIDE-th key
# of a chain: pins.py), so that the union they assert is exact.
BLOCK = 10 * PIN_STRIDE  # tokens per such block
OWN = 5  # what each request holds alone (its tail and output)


CAPS = {i: 8 * PIN_STRIDE for i in INSTANCES}  # residency capacity: 8 such blocks


def blocks(keys) -> list[int]:
    """Each of ``keys`` as PIN_STRIDE chained block keys."""
    return [k * 1000 + j for k in keys for j in range(PIN_STRIDE)]


class Pinning:
    """Books a colocated leg that pins its keys on one instance."""

    def __init__(self, req_id: str, keys, instance: str = "a") -> None:
        self.req_id, self.keys, self.instance = req_id, tuple(blocks(keys)), instance

    def __call__(self, snap: Snapshot) -> Booking:
        return Booking.single(self.req_id, self.instance, 0, OWN, self.keys, BLOCK // PIN_STRIDE)

    def revise(self, snap: Snapshot, booking: Booking) -> None:
        return None


async def book(store, req_id, keys, instance="a") -> Booking:
    return (await store.decide(blocks(keys), INSTANCES, Pinning(req_id, keys, instance)))[1]


async def kv(store, instance="a") -> int:
    return (await store.snapshot([], INSTANCES)).loads[instance].kv_tokens


async def test_a_shared_prefix_is_booked_once_and_released_with_its_last_holder(make_store):
    store = await make_store(caps=CAPS)
    first = await book(store, "r1", [1, 2, 3])
    assert await kv(store) == 3 * BLOCK + OWN
    second = await book(store, "r2", [1, 2, 3, 4])  # shares 3 blocks: adds only its 4th and its own
    assert await kv(store) == 4 * BLOCK + 2 * OWN
    other = await book(store, "r3", [1, 2], instance="b")  # per instance: b pins its own copy
    assert await kv(store, "b") == 2 * BLOCK + OWN
    await store.release(first)  # the prefix stays: r2 still holds it
    assert await kv(store) == 4 * BLOCK + OWN
    await store.release(second)
    await store.release(other)
    loads = (await store.snapshot([], INSTANCES)).loads
    assert (loads["a"].kv_tokens, loads["a"].requests, loads["b"].kv_tokens) == (0, 0, 0)


async def test_a_duplicate_release_never_takes_another_holders_blocks(make_store):
    store = await make_store(caps=CAPS)
    first = await book(store, "r1", [1, 2, 3])
    second = await book(store, "r2", [1, 2, 3])
    await store.release(first)
    await store.release(first)
    assert await kv(store) == 3 * BLOCK + OWN  # r2's blocks are still counted
    await store.release(second)
    await store.release(second)
    assert await kv(store) == 0
    again = await book(store, "r3", [1, 2, 3])  # nothing left over: counted afresh
    assert await kv(store) == 3 * BLOCK + OWN
    await store.release(again)
    assert await kv(store) == 0


async def test_a_request_that_never_reached_an_engine_unpins_on_abandon(make_store):
    store = await make_store(caps=CAPS)
    kept = await book(store, "r1", [1, 2])
    failed = await book(store, "r2", [1, 2, 3])
    await store.abandon(failed, {"a": 2 * PIN_STRIDE})
    await store.release(failed)  # a release after the abandon (a cancel racing a failure) changes nothing
    assert await kv(store) == 2 * BLOCK + OWN
    await store.release(kept)
    assert await kv(store) == 0


async def test_at_the_cap_the_rest_is_booked_as_the_requests_own(make_store):
    store = await make_store(caps={"a": 4 * PIN_STRIDE, "b": 8 * PIN_STRIDE, "c": 8 * PIN_STRIDE})
    long = await book(store, "r1", range(1, 7))  # 6 blocks, 4 may be pinned: the other 2 are its own
    assert await kv(store) == 6 * BLOCK + OWN
    other = await book(store, "r2", [20, 21])  # the cap is reached: pins nothing new
    assert await kv(store) == 8 * BLOCK + 2 * OWN
    sharer = await book(store, "r3", [1, 2, 3, 4, 5])  # pins the 4 already pinned; its 5th is its own
    assert await kv(store) == 9 * BLOCK + 3 * OWN
    await store.release(long)
    assert await kv(store) == 7 * BLOCK + 2 * OWN  # blocks 1-4 stay with r3
    await store.release(sharer)
    await store.release(other)
    assert await kv(store) == 0
    after = await book(store, "r4", [20, 21])  # the cap is free again
    assert await kv(store) == 2 * BLOCK + OWN
    await store.release(after)


async def test_a_release_after_the_instance_was_dropped_leaves_its_next_life_alone(make_store):
    store = await make_store(caps=CAPS)
    old = await book(store, "r1", [1, 2, 3])
    await store.drop_instance("a")
    assert await kv(store) == 0
    new = await book(store, "r2", [1, 2, 3])  # the instance came back: a new life, counted afresh
    assert await kv(store) == 3 * BLOCK + OWN
    await store.release(old)  # into the dropped life: the new one's pins and KV stay whole
    assert await kv(store) == 3 * BLOCK + OWN
    await store.release(new)
    assert await kv(store) == 0
    last = await book(store, "r3", [1, 2, 3])
    assert await kv(store) == 3 * BLOCK + OWN
    await store.release(last)
    assert await kv(store) == 0


async def test_a_cancelled_request_releases_its_pins(make_store):
    store = await make_store(caps=CAPS)
    held = await book(store, "r0", [1, 2])

    async def request() -> None:
        booking = await book(store, "r1", [1, 2, 3])
        try:
            await asyncio.sleep(10)  # streaming, until cancelled
        finally:
            await store.release(booking)  # the request path releases in a finally

    task = asyncio.create_task(request())
    await asyncio.sleep(0.05)
    assert await kv(store) == 3 * BLOCK + 2 * OWN
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await kv(store) == 2 * BLOCK + OWN
    await store.release(held)
    assert await kv(store) == 0


async def test_replicas_book_one_union_and_a_crashed_replicas_pins_expire(redis_target, key_prefix):
    url, cluster = redis_target
    crashed = RedisStore(url, {"a": 8 * PIN_STRIDE}, key_prefix=key_prefix, lease_s=0.3, cluster=cluster)
    alive = RedisStore(url, {"a": 8 * PIN_STRIDE}, key_prefix=key_prefix, lease_s=0.3, cluster=cluster)
    await crashed.start()
    await alive.start()
    try:
        await book(crashed, "x1", [1, 2, 3])
        before = alive.round_trips
        mine = await book(alive, "y1", [1, 2, 3, 4])  # the prefix another replica pinned is counted once
        assert alive.round_trips - before == 1  # pinning costs no round trip of its own
        assert await kv(alive) == 4 * BLOCK + 2 * OWN
        crashed._refresher.cancel()  # the replica dies without releasing: its lease is no longer refreshed
        await asyncio.sleep(0.45)
        await alive.refresh_leases()  # sweeps the expired booking, and its pins with it
        assert await kv(alive) == 4 * BLOCK + OWN
        before = alive.round_trips
        await alive.release(mine)
        assert alive.round_trips - before == 1
        assert await kv(alive) == 0
        again = await book(alive, "y2", [1, 2, 3])  # nothing leaked: counted afresh
        assert await kv(alive) == 3 * BLOCK + OWN
        await alive.release(again)
        assert await kv(alive) == 0
    finally:
        await alive.close()
        await crashed.close()


class Counting(Pinning):
    revised = 0

    def revise(self, snap: Snapshot, booking: Booking) -> None:
        Counting.revised += 1
        return None


async def test_the_replica_mirror_takes_a_pinning_booking_back_out_exactly(redis_target, key_prefix):
    # A Redis store revises a decision when the shared view differs from the one chosen on;
    # the mirror's view without the new booking must give back exactly that view, pinned
    # blocks included, or every decision that pins a new prefix would be revised.
    url, cluster = redis_target
    store = RedisStore(url, {i: 8 * PIN_STRIDE for i in INSTANCES}, key_prefix=key_prefix, cluster=cluster)
    await store.start()
    try:
        Counting.revised = 0
        bookings = [(await store.decide(blocks(keys), INSTANCES, Counting(f"r{n}", keys)))[1]
                    for n, keys in enumerate(([1, 2, 3], [1, 2, 3, 4], [7, 8]))]
        assert Counting.revised == 0 and store.corrections == 0
        assert store._mirror.load_of("a").kv_tokens == await kv(store) == 6 * BLOCK + 3 * OWN
        for booking in bookings:
            await store.release(booking)
        assert store._mirror.load_of("a").kv_tokens == await kv(store) == 0
    finally:
        await store.close()


async def test_the_pin_hash_stays_out_of_the_ziplist_encoding(redis_url, key_prefix):
    # A few dozen pinned fields would be a ziplist in Redis, rewritten whole at each field a
    # booking pins or a release unpins (pins.lua's PIN_PAD); a hashtable writes one entry.
    import redis

    store = RedisStore(redis_url, {i: 8 * PIN_STRIDE for i in INSTANCES}, key_prefix=key_prefix)
    await store.start()
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        booking = await book(store, "r1", [1, 2, 3])
        pins = store.layout.instance_tag("a") + ":pin"
        assert 0 < raw.hlen(pins) < 64  # small enough for Redis to keep it as a ziplist
        assert raw.object("encoding", pins) == "hashtable"
        await store.release(booking)
        assert await kv(store) == 0
    finally:
        raw.close()
        await store.close()


async def test_the_loads_hash_stays_out_of_the_ziplist_encoding(redis_url, key_prefix):
    # A shard's loads hash holds one field per instance: below 512 fields Redis would keep it
    # as a ziplist, which every HGET/HMGET/HSET of a decision scans from its head
    # (lua/ops.lua's LOADS_PAD); the pad field is no instance's and never read as a load.
    import redis

    from router.state.redis_layout import LOADS_PAD

    store = RedisStore(redis_url, CAPS, key_prefix=key_prefix)
    await store.start()
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        booking = await book(store, "r1", [1, 2, 3])
        loads = store.layout.loads_key("a")
        assert raw.object("encoding", loads) == "hashtable"
        assert LOADS_PAD in raw.hkeys(loads)
        snap = await store.snapshot([], INSTANCES)
        assert snap.loads["a"].requests == 1 and set(snap.loads) == set(INSTANCES)
        await store.release(booking)
        assert raw.hkeys(loads) == [LOADS_PAD]  # the instance's load is gone: idle, as before
    finally:
        raw.close()
        await store.close()
