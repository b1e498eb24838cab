"""The Redis key layout shards: a decision is one round trip over a bounded set of slots,
different instances and prompts land on different Cluster nodes, and every key a script
touches is one it declared (what a Cluster needs to route it)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from router.state.redis_calls import LinearPackConnection
from router.state.redis_store import RedisStore
from state.test_contract import GreedyChooser  # type: ignore[import-not-found]

INSTANCES = [f"i{n}" for n in range(24)]


def _keyslot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


async def decide_many(store: RedisStore, prompts: int = 30) -> None:
    for n in range(prompts):
        keys = [1000 * n + j for j in range(1, 6)]
        _, booking = await store.decide(keys, INSTANCES, GreedyChooser(f"s{n}", keys, only=INSTANCES[n % len(INSTANCES)]))
        if n % 2:
            await store.release(booking)


async def test_a_decision_touches_one_residency_shard_and_at_most_every_instance_shard(redis_url, key_prefix):
    store = RedisStore(redis_url, {i: 100 for i in INSTANCES}, key_prefix=key_prefix, instance_shards=4, residency_shards=16)
    await store.start()
    try:
        booking = GreedyChooser("x", [7, 8, 9], only="i3")(await store.snapshot([7, 8, 9], INSTANCES))
        ops = store._read_ops([7, 8, 9], INSTANCES, booking, record=True)
        tags = {op.tag for op in ops}
        assert len([t for t in tags if ":r" in t]) == 1 and len([t for t in tags if ":i" in t]) <= 4
        for op in ops:  # each op's keys in its tag's slot
            assert {_keyslot(k) for k in op.keys} == {_keyslot(op.tag)}
    finally:
        await store.close()


async def test_the_state_is_spread_over_every_cluster_node(redis_cluster_url, key_prefix):
    store = RedisStore(redis_cluster_url, {i: 100 for i in INSTANCES}, key_prefix=key_prefix, cluster=True,
                       instance_shards=8, residency_shards=16)
    await store.start()
    try:
        trips = store.round_trips
        await decide_many(store)
        assert store.round_trips - trips == 30 + 15  # one per decision, one per release
        seed = redis.Redis.from_url(redis_cluster_url, decode_responses=True)
        nodes = list(seed.execute_command("CLUSTER NODES"))  # redis-py: {"host:port": info}
        seed.close()
        counts = []
        for address in nodes:
            host, port = address.rsplit(":", 1)
            node = redis.Redis(host=host, port=int(port), decode_responses=True)
            counts.append(sum(1 for _ in node.scan_iter(match=f"{{{key_prefix}:*")))
            node.close()
        assert len(counts) == 3 and all(c > 0 for c in counts), counts
        client = store._client
        assert all(node.connection_class is LinearPackConnection for node in client.get_nodes())  # not redis-py's quadratic packer
    finally:
        await store.close()


@pytest.mark.parametrize("declare", [True, False])
async def test_every_key_a_script_touches_is_declared(redis_url, key_prefix, declare):
    """MONITOR shows each command a script runs: its key must be among the call's KEYS (as a
    Cluster requires), or, where a standalone Redis's look-up names its blocks itself, in
    the hash tag of a declared key (one slot, too)."""
    store = RedisStore(redis_url, {i: 3 for i in INSTANCES}, key_prefix=key_prefix, lease_s=0.2, declare_keys=declare)
    await store.start()
    seen: list[tuple[str, list[str]]] = []  # (client type, command split into its arguments)
    stop = threading.Event()
    ready = threading.Event()

    def watch() -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        with client.monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                if key_prefix in command["command"]:
                    seen.append((command["client_type"], command["command"].split(" ")))
                if stop.is_set():
                    break
        client.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    try:
        await decide_many(store, 12)  # capacity 3 with 5-block prompts: evictions, queued unholds
        _, b = await store.decide([1001, 1002], INSTANCES, GreedyChooser("pd", [1001, 1002]))
        await store.abandon(b, {})
        await store.forget_instance("i1")
        await asyncio.sleep(0.3)
        await store.refresh_leases()  # sweeps the expired leases of the bookings never released
        await store.drop_instance("i2")
    finally:
        await store.close()
        stop.set()
        redis.Redis.from_url(redis_url).ping()  # wakes the monitor so it sees the stop
        watcher.join(5)
    checked = undeclared = 0
    declared: set[str] = set()
    tags: set[str] = set()
    for client, args in seen:
        if client != "lua" and args[0].upper() == "EVALSHA":
            declared = set(args[3:3 + int(args[2])])
            tags = {key.partition("}")[0] for key in declared}
        elif client == "lua" and args[0].upper() != "TIME":
            if args[1] not in declared:
                assert not declare and args[1].partition("}")[0] in tags and ":b:" in args[1], args
                undeclared += 1
            checked += 1
    assert checked > 50, seen[:5]
    assert (undeclared > 0) is not declare  # the look-ups' blocks, named by the script


def test_block_keys_are_written_the_same_way_however_they_are_formatted():
    """hex_blocks packs 64-bit keys in C; the names of a prompt's blocks are remembered: both
    must give what formatting each key gives."""
    import random

    from router.state.redis_layout import Layout

    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(300)] + [0, 1, 2**64 - 1]
    assert Layout.hex_blocks(keys) == "".join(f"{k:016x}" for k in keys)
    assert Layout.hex_blocks([-1, 5]) == "".join(f"{k:016x}" for k in (-1, 5))  # outside 64 bits: formatted
    lay = Layout("p", residency_shards=4)
    for _ in range(2):  # the second time from memory
        op = lay.lookup(keys, ["i1"], 1000)
        tag = lay.residency_tag(lay.residency_shard(keys[0]))
        assert list(op.keys) == [tag + ":fg", *(f"{tag}:b:{k:016x}" for k in keys)]
    other = lay.lookup([keys[0] + 1, *keys[1:]], [], 1000)  # the same blocks after another first block
    tag = lay.residency_tag(lay.residency_shard(keys[0] + 1))
    assert list(other.keys) == [tag + ":fg", *(f"{tag}:b:{k:016x}" for k in [keys[0] + 1, *keys[1:]])]


async def test_blocks_named_by_the_script_are_the_blocks_the_router_declares(redis_url, key_prefix):
    """A standalone store's look-up names its blocks from the hex (declare_keys=False); a
    Cluster's declares them: one Redis sees the same residency either way, and evictions
    queued by one are taken back under the names the other wrote."""
    named = RedisStore(redis_url, {i: 3 for i in INSTANCES}, key_prefix=key_prefix, declare_keys=False)
    declared = RedisStore(redis_url, {i: 3 for i in INSTANCES}, key_prefix=key_prefix, declare_keys=True)
    await named.start()
    await declared.start()
    try:
        keys = [2**63 + 5, 17, 2**64 - 1]  # hex of 16 digits whatever the size
        _, b = await named.decide(keys, INSTANCES, GreedyChooser("n1", keys, only="i3"))
        assert (await declared.snapshot(keys, INSTANCES)).matched["i3"] == 3
        await named.release(b)
        _, b = await declared.decide(keys[:2], INSTANCES, GreedyChooser("d1", keys[:2], only="i5"))
        assert (await named.snapshot(keys, INSTANCES)).matched["i5"] == 2
        await declared.release(b)
        await named.abandon((await named.decide(keys, INSTANCES, GreedyChooser("n2", keys, only="i7")))[1], {})
        assert (await declared.snapshot(keys, INSTANCES)).matched["i7"] == 0  # taken back under the same names
    finally:
        await named.close()
        await declared.close()
