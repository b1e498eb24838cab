"""Each replica's share of the shared load: a decision asks the policy again only on news from
elsewhere, never for this replica's own bookings made while its call was out."""

import asyncio
import contextlib

import redis.asyncio as aioredis

from router.state.redis_layout import LOADS_PAD
from router.state.redis_store import RedisStore
from state.test_contract import GreedyChooser  # type: ignore[import-not-found]

INSTANCES = ["a", "b"]
CAPS = {"a": 100, "b": 100}


class Counting(GreedyChooser):
    revised = 0

    def revise(self, snap, booking):
        Counting.revised += 1
        return super().revise(snap, booking)


async def started(target, prefix, **kw):
    url, cluster = target
    store = RedisStore(url, CAPS, key_prefix=prefix, cluster=cluster, **kw)
    await store.start()
    return store


@contextlib.asynccontextmanager
async def replicas(target, prefix, n, **kw):
    """``n`` router replicas' stores on one namespace, closed after."""
    stores = [await started(target, prefix, **kw) for _ in range(n)]
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


async def share_fields(target, store) -> list[str]:
    """"<instance>:<replica>" of every replica share left in the instance shards' loads (lua/ops.lua add_load)."""
    url, cluster = target
    client = aioredis.RedisCluster.from_url(url, decode_responses=True) if cluster else \
        aioredis.from_url(url, decode_responses=True)
    try:
        found: list[str] = []
        for tag in store.layout.instance_tags():
            for inst, value in (await client.hgetall(tag + ":loads")).items():
                if inst != LOADS_PAD:
                    found += [f"{inst}:{part.split('=')[0]}" for part in value.split("|")[1:]]
        return sorted(found)
    finally:
        await client.aclose()


async def test_own_concurrent_bookings_are_no_news(redis_target, key_prefix):
    # Twenty decisions in flight at once: each chose on a view that held the ones before it,
    # so what the others booked while its call was out is nothing it should choose again on.
    store = await started(redis_target, key_prefix)
    try:
        Counting.revised = 0
        results = await asyncio.gather(*(store.decide([n], INSTANCES, Counting(f"c{n}", [n])) for n in range(20)))
        bookings = [b for _, b in results]
        assert Counting.revised == 0 and store.revisions == 0 and store.corrections == 0
        # the policy balanced them on this replica's own view: 10 and 10
        assert sorted(sum(b.instance == i for b in bookings) for i in INSTANCES) == [10, 10]
        await asyncio.gather(*(store.release(b) for b in bookings))
        assert await share_fields(redis_target, store) == []  # idle shares leave nothing behind
    finally:
        await store.close()


async def test_another_replicas_load_is_news_and_moves_the_choice(redis_target, key_prefix):
    async with replicas(redis_target, key_prefix, 2) as (busy, late):
        held = [(await busy.decide([], INSTANCES, GreedyChooser(f"h{n}", [], only="a")))[1] for n in range(3)]
        # late has never read "a": it believes both idle, picks "a" (by name), and the round
        # trip shows the other replica's three requests there
        Counting.revised = 0
        snap, moved = await late.decide([], INSTANCES, Counting("late", []))
        assert Counting.revised == 1 and late.revisions == 1 and late.corrections == 1
        assert moved.instance == "b"
        assert snap.loads["a"].requests == 3  # exactly the other replica's, not a max with its own
        # now it knows: its own booking on b plus the other replica's three on a, summed per instance
        _, second = await late.decide([], INSTANCES, Counting("late2", []))
        assert second.instance == "b" and late.revisions == 1
        view = await late.snapshot([], INSTANCES)
        assert view.loads["a"].requests == 3 and view.loads["b"].requests == 2
        for b in held:
            await busy.release(b)
        await late.release(moved)
        await late.release(second)
        assert await share_fields(redis_target, late) == []


async def test_a_crashed_replicas_share_goes_with_its_leases(redis_target, key_prefix):
    crashed = await started(redis_target, key_prefix, lease_s=0.3)
    await crashed.decide([1], INSTANCES, GreedyChooser("lost", [1], only="a"))
    await crashed.close()  # never releases
    alive = await started(redis_target, key_prefix, lease_s=0.3)
    try:
        assert len(await share_fields(redis_target, alive)) == 1
        await asyncio.sleep(0.45)
        await alive.refresh_leases()  # sweeps the expired booking, and the crashed replica's share with it
        assert await share_fields(redis_target, alive) == []
        assert (await alive.snapshot([], INSTANCES)).loads["a"].requests == 0
    finally:
        await alive.close()


async def test_dropping_an_instance_drops_every_replicas_share_of_it(redis_target, key_prefix):
    async with replicas(redis_target, key_prefix, 2) as (one, two):
        await one.decide([1], INSTANCES, GreedyChooser("x", [1], only="a"))
        _, kept = await two.decide([2], INSTANCES, GreedyChooser("y", [2], only="a"))
        _, other = await two.decide([3], INSTANCES, GreedyChooser("z", [3], only="b"))
        assert len(await share_fields(redis_target, one)) == 3
        await one.drop_instance("a")
        left = await share_fields(redis_target, one)
        assert left == [f"b:{two.replica}"]
        await two.release(kept)  # into the dropped instance: nothing comes back
        await two.release(other)
        assert await share_fields(redis_target, one) == []


async def test_a_share_in_the_middle_leaves_its_neighbours_whole(redis_target, key_prefix):
    async with replicas(redis_target, key_prefix, 3) as stores:
        held = [(await s.decide([], INSTANCES, GreedyChooser(f"m{n}", [], only="a")))[1] for n, s in enumerate(stores)]
        _, more = await stores[2].decide([], INSTANCES, GreedyChooser("m3", [], only="a"))
        assert await share_fields(redis_target, stores[0]) == sorted(f"a:{s.replica}" for s in stores)
        await stores[1].release(held[1])  # the middle segment goes; the others keep their counts
        assert await share_fields(redis_target, stores[0]) == sorted(f"a:{s.replica}" for s in (stores[0], stores[2]))
        observer = stores[0]
        await observer.decide([], INSTANCES, GreedyChooser("look", [], only="b"))
        assert observer._remote["a"].requests == 2  # the third replica's two; its own one is not counted as theirs
        view = await observer.snapshot([], INSTANCES)
        assert view.loads["a"].requests == 3
        await stores[2].release(held[2])
        await stores[2].release(more)
        await stores[0].release(held[0])
        assert [f for f in await share_fields(redis_target, observer) if f.startswith("a:")] == []


def test_a_stored_value_splits_into_the_total_and_one_replicas_share():
    from router.state.base import Load
    from router.state.redis_views import others, parse_load, split_load

    value = "3:200:900:1:64|aa=1:100:0:0:0|bb=2:100:0:1:64"
    total, mine = split_load(value, "aa")
    assert total == Load(3, 200, 900, 1, 64) and mine == Load(1, 100, 0, 0, 0)
    assert split_load(value, "bb")[1] == Load(2, 100, 0, 1, 64)
    assert split_load(value, "cc")[1] == Load()  # no share of its own there
    assert others(total, mine) == Load(2, 100, 0, 1, 64)  # KV is not split by replica: the others' share carries none
    assert parse_load(value) == total  # a reader of the total alone skips the shares
    assert split_load("1:1:1:0:0", "aa") == (Load(1, 1, 1, 0, 0), Load())
