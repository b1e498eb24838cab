"""Sequence gaps and restarts make an instance's residency stale until it resyncs."""

import asyncio

from router.kvevents.apply import TableWriter
from router.kvevents.source import Source, SourceSpec
from router.state.precise import EventResidency
from helpers import batch, cleared, keys, prompt, removed, stored

P = prompt(64)
K = keys(P)


def source(replay=None, replay_endpoint=None):
    res = EventResidency(10_000)
    spec = SourceSpec("a", "m", "tcp://127.0.0.1:1", replay_endpoint=replay_endpoint)
    return res, Source(spec, TableWriter(res.table("a"), "m", 16), replay)


def test_a_stream_from_sequence_zero_is_fresh_and_follows_evictions():
    res, src = source()
    assert res.matched(K, ["a"]) == {}  # nothing heard yet: stale, the caller falls back
    src.on_message(0, batch(stored([1, 2, 3, 4], None, P)))
    assert res.matched(K, ["a"]) == {"a": 4}
    src.on_message(1, batch(removed([4])))  # the engine evicted the tail
    assert res.matched(K, ["a"]) == {"a": 3}
    src.on_message(1, batch(removed([3])))  # a duplicate is ignored
    assert res.matched(K, ["a"]) == {"a": 3} and src.counters.duplicates == 1


def test_a_gap_without_replay_is_stale_until_all_blocks_cleared():
    res, src = source()
    src.on_message(0, batch(stored([1, 2], None, P[:32])))
    src.on_message(5, batch(stored([3], 2, P[32:48])))  # 1..4 lost
    assert res.matched(K, ["a"]) == {} and src.counters.gaps == 1
    src.on_message(6, batch(stored([4], 3, P[48:])))
    assert res.matched(K, ["a"]) == {}  # still stale: what 1..4 did is unknown
    src.on_message(7, batch(cleared(), stored([1], None, P[:16])))
    assert res.matched(K, ["a"]) == {"a": 1} and src.counters.resyncs == 1


def test_joining_mid_stream_is_stale_and_a_restart_at_zero_resyncs_from_empty():
    res, src = source()
    src.on_message(41, batch(stored([1, 2, 3, 4], None, P)))
    assert res.matched(K, ["a"]) == {}
    src.on_message(0, batch(stored([7], None, P[:16])))  # the engine restarted: its cache is empty
    assert res.matched(K, ["a"]) == {"a": 1} and src.counters.restarts == 1


def test_a_restart_whose_first_batches_were_lost_clears_and_stays_stale():
    res, src = source()
    src.on_message(0, batch(stored([1, 2, 3, 4], None, P)))
    src.on_message(1, batch())
    src.on_message(2, batch())
    src.on_message(1, batch(stored([9], None, P[:16])))  # back to 1, not 0: a restart, batch 0 lost
    assert res.matched(K, ["a"]) == {} and src.counters.restarts == 1
    assert len(res.table("a")) == 1  # the old blocks are gone with the old process


def test_an_undecodable_batch_makes_the_stream_stale():
    res, src = source()
    src.on_message(0, batch(stored([1], None, P[:16])))
    src.on_message(1, b"\xc1garbage")
    assert res.matched(K, ["a"]) == {} and src.counters.malformed == 1


async def test_a_gap_is_filled_by_the_replay_and_live_batches_wait_for_it():
    history = {1: batch(stored([3], 2, P[32:48])), 2: batch(stored([4], 3, P[48:])), 3: batch(removed([4]))}
    release = asyncio.Event()
    asked = []

    async def replay(endpoint, start):
        asked.append((endpoint, start))
        await release.wait()
        return [(s, history[s]) for s in sorted(history) if s >= start]

    res, src = source(replay, "tcp://127.0.0.1:2")
    src.on_message(0, batch(stored([1, 2], None, P[:32])))
    src.on_message(3, history[3])  # 1 and 2 lost
    src.on_message(4, batch(stored([4], 3, P[48:])))  # live, arrives during the replay
    assert res.matched(K, ["a"]) == {}
    release.set()
    await asyncio.sleep(0.01)
    assert asked == [("tcp://127.0.0.1:2", 1)]
    assert res.matched(K, ["a"]) == {"a": 4} and src.counters.resyncs == 1 and src.last == 4


async def test_a_replay_that_no_longer_holds_the_hole_leaves_the_stream_stale():
    async def replay(endpoint, start):
        return [(7, batch()), (8, batch())]  # the engine's buffer starts after the hole

    res, src = source(replay, "tcp://127.0.0.1:2")
    src.on_message(0, batch(stored([1], None, P[:16])))
    src.on_message(8, batch())
    await asyncio.sleep(0.01)
    assert res.matched(K, ["a"]) == {} and src.counters.replays_failed == 1 and src.last == 8


async def test_on_subscribing_the_replay_brings_an_engine_that_ran_before_in_sync():
    history = {0: batch(stored([1, 2], None, P[:32])), 1: batch(stored([3, 4], 2, P[32:]))}

    async def replay(endpoint, start):
        return [(s, history[s]) for s in sorted(history) if s >= start]

    res, src = source(replay, "tcp://127.0.0.1:2")
    src.begin()
    src.on_message(2, batch(removed([4])))  # live, while the replay runs
    await asyncio.sleep(0.01)
    assert res.matched(K, ["a"]) == {"a": 3} and src.last == 2


async def test_an_engine_that_never_published_is_known_empty_from_its_replay():
    async def replay(endpoint, start):
        return []

    res, src = source(replay, "tcp://127.0.0.1:2")
    src.begin()
    await asyncio.sleep(0.01)
    assert res.matched(K, ["a"]) == {"a": 0}


async def test_a_replay_with_an_undecodable_batch_does_not_resync():
    async def replay(endpoint, start):
        return [(0, batch(stored([1], None, P[:16]))), (1, b"\xc1garbage")]

    res, src = source(replay, "tcp://127.0.0.1:2")
    src.begin()
    await asyncio.sleep(0.01)
    assert res.matched(K, ["a"]) == {} and src.counters.replays_failed == 1
