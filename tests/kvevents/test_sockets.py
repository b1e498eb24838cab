"""Both topologies over real loopback ZMQ sockets, discovery answers, the replay socket."""

import asyncio

import httpx
import pytest
import zmq
import zmq.asyncio

from router.config.model import load_config
from router.core.instances import InstancePool
from router.kvevents.discovery import DiscoveryError, specs_from_answer
from router.kvevents.ingest import KVEventIngest
from router.kvevents.sockets import replay
from router.state.precise import EventResidency
from router.tools.emulator.kv_events import KVEventLog, KVEventPublisher
from helpers import frames, keys, prompt, stored
from servers import free_port

P = prompt(48)
K = keys(P)


def ingest_for(kv_events: dict, names=("a",)):
    config = load_config(overrides={
        "instances": [{"url": f"http://127.0.0.1:{9000 + i}", "name": n, "model": "m"} for i, n in enumerate(names)],
        "hashing": {"mode": "tokens"}, "kv_events": {"enabled": True, "discover": False, **kv_events},
    })
    return KVEventIngest(config, InstancePool(config), EventResidency(10_000))


async def until(predicate, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def publish_until(pub, topic, residency, instance, timeout=5.0):
    """PUB/SUB drops what is sent before the subscription lands: resend sequence 0 until seen."""
    deadline = asyncio.get_running_loop().time() + timeout
    while residency.matched(K, [instance]) != {instance: 3}:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{instance} never saw the batch")
        await pub.send_multipart(frames(topic, 0, stored([1, 2, 3], None, P)))
        await asyncio.sleep(0.02)


async def test_router_sub_connects_to_an_engine_pub_that_binds():
    port = free_port()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    ingest = ingest_for({"sources": {"a": {"endpoint": f"tcp://*:{port}", "topic": "kv"}}})
    async with httpx.AsyncClient() as client:
        await ingest.start(client)
        try:
            await ingest.wait_subscribed()
            assert ingest.sources[0].spec.endpoint == f"tcp://127.0.0.1:{port}"  # '*' became the instance's host
            await publish_until(pub, "kv", ingest.residency, "a")
        finally:
            await ingest.close()
            ctx.destroy(linger=0)


async def test_engines_pub_connect_to_the_routers_bound_sub_and_topics_tell_them_apart():
    port = free_port()
    ingest = ingest_for({"bind": f"tcp://127.0.0.1:{port}",
                         "sources": {"a": {"topic": "kv@a"}, "b": {"topic": "kv@b"}}}, names=("a", "b"))
    ctx = zmq.asyncio.Context()
    async with httpx.AsyncClient() as client:
        await ingest.start(client)
        try:
            await ingest.wait_subscribed()
            pubs = []
            for _ in range(2):
                pub = ctx.socket(zmq.PUB)
                pub.connect(f"tcp://127.0.0.1:{port}")
                pubs.append(pub)
            await publish_until(pubs[0], "kv@a", ingest.residency, "a")
            assert ingest.residency.matched(K, ["b"]) == {}  # a's events never count for b
            await publish_until(pubs[1], "kv@b", ingest.residency, "b")
            await pubs[1].send_multipart(frames("kv@zzz", 0, stored([1], None, P[:16])))
            await until(lambda: ingest._bound[f"tcp://127.0.0.1:{port}"].unknown_topics >= 1)
        finally:
            await ingest.close()
            ctx.destroy(linger=0)


async def test_the_replay_socket_returns_buffered_batches_to_the_routers_client():
    log = KVEventLog(16)
    pub = KVEventPublisher(log, "tcp://*:0", replay_endpoint="tcp://*:0")
    pub.start()
    ctx = zmq.asyncio.Context()
    try:
        for i in range(3):
            log.stored([10 + i], 9 + i if i else None, P[i * 16:(i + 1) * 16])
            pub.flush()
        got = await replay(ctx, pub.replay_endpoint.replace("*", "127.0.0.1"), 1, timeout_s=5)
        assert [s for s, _ in got] == [1, 2]
        assert await replay(ctx, "tcp://127.0.0.1:1", 0, timeout_s=0.2) is None  # nobody there
    finally:
        await pub.stop()
        ctx.destroy(linger=0)


def test_discovery_answers_say_which_side_binds():
    url = "http://10.1.2.3:8000"
    (spec,) = specs_from_answer("a", url, "m", [
        {"data_parallel_rank": 0, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}])
    assert (spec.endpoint, spec.replay_endpoint, spec.topic, spec.bind) == (
        "tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558", "kv", None)
    specs = specs_from_answer("a", url, "m", [
        {"data_parallel_rank": 0, "endpoint": "tcp://router.svc:5557", "topic": "kv@a"},
        {"data_parallel_rank": 1, "endpoint": "tcp://[::]:5560", "topic": "kv@a"}])
    assert (specs[0].endpoint, specs[0].bind) == (None, "tcp://*:5557")  # the engine connects: the router binds
    assert (specs[1].endpoint, specs[1].dp_rank) == ("tcp://10.1.2.3:5560", 1)
    with pytest.raises(DiscoveryError):
        specs_from_answer("a", url, "m", [])


def test_discovery_reads_vllm_032s_answer_keyed_by_rank():
    """As a real vLLM 0.32 engine answered (tests/realvllm checks it against one)."""
    answer = {"0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:18732",
                    "replay_endpoint": "tcp://*:18733", "buffer_steps": 10000, "hwm": 100000,
                    "max_queue_size": 100000, "topic": "kv"},
              "1": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:18734", "topic": "kv"}}
    specs = specs_from_answer("a", "http://10.1.2.3:8000", "m", answer)
    assert [(s.dp_rank, s.endpoint, s.replay_endpoint, s.topic) for s in specs] == [
        (0, "tcp://10.1.2.3:18732", "tcp://10.1.2.3:18733", "kv"), (1, "tcp://10.1.2.3:18734", None, "kv")]
    with pytest.raises(DiscoveryError):
        specs_from_answer("a", "http://10.1.2.3:8000", "m", {})  # what vLLM answers with events off


async def test_replay_reads_vllm_032s_frames_with_a_topic():
    """vLLM 0.32's ROUTER sends [id, b"", topic, seq, payload] and ends with [id, b"", b"", -1, b""]."""
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    async def serve() -> None:
        ident, _, start = await router.recv_multipart()
        for seq in range(int.from_bytes(start, "big"), 3):
            await router.send_multipart([ident, b"", b"kv", seq.to_bytes(8, "big"), b"payload%d" % seq])
        await router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    task = asyncio.create_task(serve())
    try:
        assert await replay(ctx, f"tcp://127.0.0.1:{port}", 1, timeout_s=5) == [(1, b"payload1"), (2, b"payload2")]
    finally:
        await task
        ctx.destroy(linger=0)


async def test_a_dropped_batch_is_replayed_over_real_sockets_and_the_instance_resyncs():
    log = KVEventLog(16)
    pub = KVEventPublisher(log, "tcp://*:0", replay_endpoint="tcp://*:0")
    pub.start()
    ingest = ingest_for({"sources": {"a": {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint}}})
    async with httpx.AsyncClient() as client:
        await ingest.start(client)
        try:
            await ingest.wait_subscribed()
            source = ingest.sources[0]
            await until(lambda: source.counters.resyncs >= 1)  # the replay on subscribing: known empty
            await asyncio.sleep(0.2)  # the SUB's connection lands
            log.stored([1], None, P[:16])
            pub.flush()
            await until(lambda: ingest.residency.matched(K, ["a"]) == {"a": 1})
            pub.dropped_next = 1  # lost on the way, still in the publisher's replay buffer
            log.stored([2], 1, P[16:32])
            pub.flush()
            log.stored([3], 2, P[32:48])
            pub.flush()
            await until(lambda: ingest.residency.matched(K, ["a"]) == {"a": 3})
            assert source.counters.gaps == 1 and source.counters.replays == 2 and source.synced
        finally:
            await ingest.close()
            await pub.stop()


def test_kv_events_need_token_mode():
    with pytest.raises(Exception, match="hashing.mode: tokens"):
        load_config(overrides={"instances": [{"url": "http://127.0.0.1:1"}], "kv_events": {"enabled": True}})
