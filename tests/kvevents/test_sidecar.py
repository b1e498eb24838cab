"""Ingestion in the sidecar process: events reach the loop's mirror tables, sequence
semantics are the in-process ones, the sidecar is restarted when it dies and ends with
the ingestion."""

import asyncio
import os
import signal

import httpx
import pytest
import zmq
import zmq.asyncio

from router.config.model import load_config
from router.core.instances import InstancePool
from router.kvevents import precise_store
from router.kvevents.describe import describe
from router.kvevents.metrics import KVEventsCollector
from router.kvevents.sidecar import SidecarIngest, mirror_kind
from router.kvevents.source import SourceSpec
from router.state.memory import MemoryStore
from helpers import cleared, frames, keys, prompt, stored
from servers import free_port

P = prompt(48)
K = keys(P)


async def until(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Flood:
    """A bound PUB and a sidecar ingestion subscribed to it (through ``precise_store``,
    as the app builds it)."""

    def __init__(self, shared: bool = True) -> None:
        self.port = free_port()
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        config = load_config(overrides={
            "instances": [{"url": "http://127.0.0.1:9000", "name": "a", "model": "m"}],
            "hashing": {"mode": "tokens"},
            "kv_events": {"enabled": True, "discover": False, "sidecar": True, "shared_tables": shared,
                          "sources": {"a": {"endpoint": f"tcp://*:{self.port}", "topic": "kv"}}},
        })
        self.store, ingest = precise_store(config, InstancePool(config), MemoryStore({"a": 8}))
        assert isinstance(ingest, SidecarIngest)
        self.ingest = ingest
        self.residency = ingest.residency

    async def __aenter__(self) -> "Flood":
        self.client = httpx.AsyncClient()
        await self.ingest.start(self.client)
        await self.ingest.wait_subscribed()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ingest.close()
        await self.client.aclose()
        self.ctx.destroy(linger=0)

    async def send(self, seq: int, *events) -> None:
        await self.pub.send_multipart(frames("kv", seq, *events))

    async def start_at_zero(self) -> None:
        """PUB/SUB drops what is sent before the subscription lands: resend sequence 0 until seen."""
        deadline = asyncio.get_running_loop().time() + 10
        while self.residency.matched(K, ["a"]) != {"a": 3}:
            assert asyncio.get_running_loop().time() < deadline, "the sidecar never applied sequence 0"
            await self.send(0, stored([1, 2, 3], None, P))
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "deltas"])
async def test_events_applied_in_the_sidecar_reach_the_mirror_and_the_counters(shared):
    async with Flood(shared) as f:
        assert f.ingest.mirror == (mirror_kind(f.ingest._kv) if shared else "deltas")
        await f.start_at_zero()
        await f.send(1, {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"})
        await until(lambda: f.residency.matched(K, ["a"]) == {"a": 2})
        source = f.ingest.sources[0]
        await until(lambda: source.counters.batches >= 2 and source.writer.counters.removed_blocks == 1)
        assert source.last == 1 and source.synced
        assert len(f.residency.table("a")) == 2
        shared_bytes = describe(f.ingest)["instances"]["a"]["shared_bytes"]
        assert shared_bytes > 0 if f.ingest.mirror == "shared" else shared_bytes == 0
        gauges = {s.labels["engine"]: s.value for m in KVEventsCollector(f.ingest, f.store).collect()
                  if m.name == "pd_router_kv_shared_table_bytes" for s in m.samples}
        assert gauges == ({"a": shared_bytes} if f.ingest.mirror == "shared" else {})


async def test_a_gap_seen_in_the_sidecar_makes_the_instance_stale_until_all_blocks_cleared():
    async with Flood() as f:
        await f.start_at_zero()
        await f.send(5, stored([4], 3, prompt(16, seed=1)))  # 1..4 were lost
        await until(lambda: not f.residency.is_fresh("a"))
        assert f.residency.matched(K, ["a"]) == {}  # the caller falls back to approximate
        await f.send(6, cleared(), stored([1, 2], None, P[:32]))
        await until(lambda: f.residency.matched(K, ["a"]) == {"a": 2})
        await until(lambda: f.ingest.sources[0].counters.gaps == 1 and f.ingest.sources[0].counters.resyncs == 1)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "deltas"])
async def test_a_sidecar_that_dies_is_restarted_and_the_instance_resyncs(shared):
    async with Flood(shared) as f:
        await f.start_at_zero()
        source = f.ingest.sources[0]
        await until(lambda: source.counters.batches >= 1)
        first = f.ingest.pid
        os.kill(first, signal.SIGKILL)
        await until(lambda: not f.residency.is_fresh("a"))
        assert f.residency.matched(K, ["a"]) == {} and len(f.residency.table("a")) == 0  # what it knew is gone
        await until(lambda: f.ingest.restarts == 1 and f.ingest.pid not in (None, first))
        deadline = asyncio.get_running_loop().time() + 10
        while source.last != 7:  # the new sidecar joins mid-stream: stale
            assert asyncio.get_running_loop().time() < deadline, "the new sidecar never saw sequence 7"
            await f.send(7, stored([9], None, P[:16]))
            await asyncio.sleep(0.05)
        assert not f.residency.is_fresh("a") and source.counters.batches == 2
        await f.start_at_zero()  # the engine's restart (or a replay) brings it back
        await until(lambda: source.counters.batches >= 3 and source.counters.restarts == 1)  # never went back


async def test_closing_the_ingestion_ends_the_sidecar():
    async with Flood() as f:
        pid = f.ingest.pid
        assert pid is not None
    assert f.ingest.pid is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError("the sidecar outlived its ingestion")


async def test_a_source_whose_socket_cannot_open_is_dropped():
    async with Flood() as f:
        busy = f.ctx.socket(zmq.PUB)
        port = free_port()
        busy.bind(f"tcp://127.0.0.1:{port}")
        view = f.ingest.add_source(SourceSpec("a", "m", None, topic="x", bind=f"tcp://127.0.0.1:{port}"))
        await asyncio.sleep(1.0)
        assert view not in f.ingest.sources and len(f.ingest.sources) == 1
        busy.close(linger=0)


OWNER = """
import asyncio, sys
import httpx
from router.config.model import load_config
from router.core.instances import InstancePool
from router.kvevents import precise_store
from router.state.memory import MemoryStore

async def main():
    config = load_config(overrides={
        "instances": [{"url": "http://127.0.0.1:9000", "name": "a", "model": "m"}], "hashing": {"mode": "tokens"},
        "kv_events": {"enabled": True, "discover": False, "sidecar": True,
                      "sources": {"a": {"endpoint": "tcp://127.0.0.1:%d", "topic": "kv"}}}})
    _store, ingest = precise_store(config, InstancePool(config), MemoryStore({"a": 8}))
    async with httpx.AsyncClient() as client:
        await ingest.start(client)
        await ingest.wait_subscribed()
        print(ingest.pid, flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_sidecar_ends_when_its_router_is_killed():
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", OWNER % free_port()], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 (no I/O waits on it)
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 30)
        pid = int(line)
        os.kill(pid, 0)  # running
        owner.kill()
        owner.wait(10)
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # an exited child of a dead parent is reaped by init; until then it may be a zombie
            try:
                with open(f"/proc/{pid}/stat") as fh:  # noqa: ASYNC230 (procfs: never blocks)
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return
            except FileNotFoundError:
                return
            assert asyncio.get_running_loop().time() < deadline, "the sidecar outlived its router"
            await asyncio.sleep(0.05)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
