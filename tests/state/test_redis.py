"""Redis-only behaviour, on standalone Redis and a Cluster: leases, namespaces, round trips, replicas, outages."""

import asyncio

from router.state.redis_store import RedisStore
from state.test_contract import GreedyChooser  # type: ignore[import-not-found]

INSTANCES = ["a", "b"]
CAPS = {"a": 100, "b": 100}


async def started(target, prefix, **kw):
    url, cluster = target if isinstance(target, tuple) else (target, False)
    store = RedisStore(url, CAPS, key_prefix=prefix, cluster=cluster, **kw)
    await store.start()
    return store


async def test_crashed_replica_load_expires_with_its_lease(redis_target, key_prefix):
    crashed = await started(redis_target, key_prefix, lease_s=0.4)
    await crashed.decide([1], INSTANCES, GreedyChooser("lost", [1], only="a"))
    await crashed.close()  # stops refreshing and never releases: a crash as far as Redis knows
    observer = await started(redis_target, key_prefix, lease_s=0.4)
    try:
        assert (await observer.snapshot([], INSTANCES)).loads["a"].requests == 1
        await asyncio.sleep(0.6)
        # every replica's lease refresh sweeps expired leases; a decision's lookup sees the load gone
        snap, b = await observer.decide([], INSTANCES, GreedyChooser("next", [], only="b"))
        assert snap.loads["a"].requests == 0
        await observer.release(b)
    finally:
        await observer.close()


async def test_live_requests_keep_their_lease(redis_target, key_prefix):
    store = await started(redis_target, key_prefix, lease_s=0.3)
    try:
        _, b = await store.decide([], INSTANCES, GreedyChooser("long", [], only="a"))
        await asyncio.sleep(0.8)  # several lease periods, refreshed in the background
        await store.refresh_leases()
        assert (await store.snapshot([], INSTANCES)).loads["a"].requests == 1
        await store.release(b)
        assert (await store.snapshot([], INSTANCES)).loads["a"].requests == 0
    finally:
        await store.close()


async def test_namespaces_are_isolated(redis_target, key_prefix):
    one = await started(redis_target, key_prefix + "one")
    two = await started(redis_target, key_prefix + "two")
    try:
        await one.decide([1, 2], INSTANCES, GreedyChooser("n1", [1, 2], only="a"))
        view = await two.snapshot([1, 2], INSTANCES)
        assert view.matched == {"a": 0, "b": 0} and view.loads["a"].requests == 0
        assert (await one.snapshot([1, 2], INSTANCES)).matched["a"] == 2
    finally:
        await one.close()
        await two.close()


async def test_one_round_trip_per_decision(redis_target, key_prefix):
    store = await started(redis_target, key_prefix)
    try:
        for i in range(5):
            before = store.round_trips
            await store.decide([i, i + 1], INSTANCES, GreedyChooser(f"rt{i}", [i, i + 1], only="a"))
            assert store.round_trips - before == 1
    finally:
        await store.close()


async def test_second_replica_follows_the_shared_prefix(redis_target, key_prefix):
    first = await started(redis_target, key_prefix)
    second = await started(redis_target, key_prefix)
    try:
        _, b1 = await first.decide([5, 6, 7], INSTANCES, GreedyChooser("p1", [5, 6, 7], only="b"))
        await first.release(b1)
        # the second replica has never seen the prefix: it decides locally, then corrects
        _, b2 = await second.decide([5, 6, 7], INSTANCES, GreedyChooser("p2", [5, 6, 7]))
        assert b2.instance == "b"
        assert second.corrections == 1 and second.round_trips == 2
        # the correction taught its mirror: next time one round trip suffices
        before = second.round_trips
        _, b3 = await second.decide([5, 6, 7], INSTANCES, GreedyChooser("p3", [5, 6, 7]))
        assert b3.instance == "b" and second.round_trips - before == 1
        view = await first.snapshot([], INSTANCES)
        assert view.loads["b"].requests == 2 and view.loads["a"].requests == 0
    finally:
        await first.close()
        await second.close()


async def test_unreachable_redis_falls_back_to_local_view(key_prefix):
    from servers import free_port  # type: ignore[import-not-found]

    store = await started(f"redis://127.0.0.1:{free_port()}/0", key_prefix, timeout_s=0.2)
    try:
        _, b = await store.decide([1], INSTANCES, GreedyChooser("x", [1], only="a"))
        assert b.instance == "a" and store.errors == 1
        await store.release(b)  # best effort, must not raise
    finally:
        await store.close()


async def test_at_most_two_round_trips_per_request_whatever_its_kind(redis_target, key_prefix):
    store = await started(redis_target, key_prefix, flush_s=10.0)  # no timer flush during the test
    observer = await started(redis_target, key_prefix)
    try:
        for i, streams in enumerate([True, False, True]):
            before = store.round_trips
            _, b = await store.decide([i], INSTANCES, GreedyChooser(f"kind{i}", [i], only="a"))
            if streams:  # the first byte of an answer: queued, no round trip of its own
                await store.prefill_done(b)
            await store.release(b)
            assert store.round_trips - before == 2
            assert (await observer.snapshot([], INSTANCES)).loads["a"].requests == 0
    finally:
        await store.close()
        await observer.close()


async def test_a_queued_first_byte_reaches_other_replicas_with_the_next_round_trip_or_the_timer(redis_target, key_prefix):
    store = await started(redis_target, key_prefix, flush_s=0.05)
    observer = await started(redis_target, key_prefix)
    try:
        _, one = await store.decide([1], INSTANCES, GreedyChooser("q1", [1], only="a"))
        await store.prefill_done(one)
        assert (await observer.snapshot([], INSTANCES)).loads["a"].prefill_tokens > 0  # still queued here
        trips = store.round_trips
        _, two = await store.decide([2], INSTANCES, GreedyChooser("q2", [2], only="b"))  # carries it along
        assert store.round_trips - trips == 1
        assert (await observer.snapshot([], INSTANCES)).loads["a"].prefill_tokens == 0
        await store.prefill_done(two)
        await asyncio.sleep(0.2)  # nothing else happens: the timer sends it
        assert (await observer.snapshot([], INSTANCES)).loads["b"].prefill_tokens == 0
        await store.release(one)
        await store.release(two)
        assert (await observer.snapshot([], INSTANCES)).loads["a"].requests == 0
    finally:
        await store.close()
        await observer.close()
