"""The loop's side of the sidecar channel, driven through a real socketpair: over random
event streams its mirror tables hold what in-process ingestion holds, whatever the slice
size and however the bytes split; a big delta is applied in slices other tasks run
between; a delta of a closed subscription never lands, also once the instance is back.
With shared tables, the same through segments whose descriptors cross the socket."""

import asyncio
import json
import os
import random
import socket

import pytest

import router.kvevents.sidecar as sidecar_mod
from router.config.model import load_config
from router.core.instances import InstancePool
from router.kvevents import precise_store
from router.kvevents.apply import TableWriter
from router.kvevents.sidecar import SidecarIngest
from router.kvevents.sidecar_wire import SEGMENT, STATS, encode_delta, json_frame
from router.kvevents.source import SourceSpec
from router.kvevents.wire import decode_batch
from router.state.memory import MemoryStore
from router.state.precise import BlockTable
from router.state.precise_mirror import MirrorTable, TableDelta
from router.state.precise_native import Tracked, tracked_table
from router.state.shared_mirror import SegmentWriter, SharedMirrorTable, shared_tables
from array import array
from helpers import batch, cleared, keys, prompt, removed, stored


class Channel:
    """A ``SidecarIngest`` with no process: the test plays the sidecar on the other end of
    the socketpair the loop reads, as ``_spawn`` would have set it up."""

    def __init__(self, native_key_sets: bool = True, shared: bool = False) -> None:
        config = load_config(overrides={
            "instances": [{"url": "http://127.0.0.1:9000", "name": "a", "model": "m"}],
            "hashing": {"mode": "tokens"},
            "kv_events": {"enabled": True, "discover": False, "sidecar": True, "native_key_sets": native_key_sets,
                          "shared_tables": shared,
                          "sources": {"a": {"endpoint": "tcp://127.0.0.1:1", "topic": "kv"}}},
        })
        _store, ingest = precise_store(config, InstancePool(config), MemoryStore({"a": 8}))
        assert isinstance(ingest, SidecarIngest)
        self.ingest = ingest
        self.spec = SourceSpec("a", "m", "tcp://127.0.0.1:1", topic="kv")
        ingest.add_source(self.spec)  # the first subscription of "a": generation 1
        ours, self.theirs = socket.socketpair()
        ours.setblocking(False)
        self.theirs.setblocking(False)
        ingest._sock = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), ingest._readable)
        self.marks = 0

    def mirror(self) -> MirrorTable:
        table = self.ingest.residency.table("a")
        assert isinstance(table, MirrorTable)
        return table

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.theirs, data)

    async def settle(self) -> None:
        """Until everything sent so far is applied: a STATS frame after it is handled in
        stream order, so its count shows once the deltas before it are in the tables."""
        self.marks += 1
        await self.send(json_frame(STATS, {"sources": {}, "receive_errors": self.marks}))
        deadline = asyncio.get_running_loop().time() + 10
        while self.ingest.receive_errors != self.marks:
            assert asyncio.get_running_loop().time() < deadline, "the loop never applied what was sent"
            await asyncio.sleep(0.001)

    async def send_segment(self, fd: int, gen: int = 1, rank: int = 0) -> None:
        """A table's new segment, as the sidecar sends it: the frame with its descriptor."""
        frame = json_frame(SEGMENT, {"instance": "a", "rank": rank, "gen": gen})
        while True:
            try:
                socket.send_fds(self.theirs, [frame], [fd])
                return
            except BlockingIOError:
                await asyncio.sleep(0.001)

    def close(self) -> None:
        self.ingest._stop_reading()
        self.theirs.close()


def random_batch(rng: random.Random, live: list[tuple[int, list[int]]], next_hash: list[int]) -> bytes:
    """A vLLM-shaped batch: new chains (some extending a held block), removals of held and
    unknown blocks on either tier, re-stores, now and then AllBlocksCleared."""
    events = []
    for _ in range(rng.randrange(1, 8)):
        op, medium = rng.random(), ("GPU" if rng.random() < 0.75 else "CPU")
        if op < 0.5:
            n = rng.randrange(1, 5)
            hashes = list(range(next_hash[0], next_hash[0] + n))
            next_hash[0] += n
            parent = rng.choice(live)[0] if live and rng.random() < 0.4 else None
            tokens = prompt(16 * n, seed=rng.randrange(40))  # repeated prompts: shared router keys
            events.append(stored(hashes, parent, tokens, medium=medium))
            live.extend((h, tokens) for h in hashes)
        elif op < 0.75 and live:
            gone = rng.sample(live, min(len(live), rng.randrange(1, 5)))
            events.append(removed([h for h, _ in gone] + [10**9 + rng.randrange(5)], medium=medium))
        elif op < 0.99 and live:
            h, tokens = rng.choice(live)
            events.append(stored([h], None, tokens[:16], medium=medium))  # the other tier, or again
        else:
            events.append(cleared())
            live.clear()
    return batch(*events)


def next_delta(rng: random.Random, reference: TableWriter, tracked: TableWriter,
               live: list[tuple[int, list[int]]], next_hash: list[int]) -> TableDelta:
    """A few random batches into both writers, then the tracked table's delta."""
    for _ in range(rng.randrange(0, 6)):
        payload = random_batch(rng, live, next_hash)
        reference.apply_raw(decode_batch(payload)[1])
        tracked.apply_raw(decode_batch(payload)[1])
    tracked.table.fresh = reference.table.fresh = rng.random() < 0.9
    assert isinstance(tracked.table, Tracked)
    delta = tracked.table.take_delta()
    assert delta is not None
    return delta


def same_tables(mirror: MirrorTable, ref: BlockTable, probes: list[list[int]]) -> None:
    assert mirror.held() == (set(ref._gpu), set(ref._offload))
    assert len(mirror) == len(ref) and mirror.overflow == ref.overflow and mirror.fresh == ref.fresh
    for probe in probes:
        assert mirror.depth(probe, 0.8) == ref.depth(probe, 0.8)


@pytest.mark.parametrize("seed", range(8))
async def test_the_loops_table_equals_in_process_ingestion_over_random_streams(seed, native_key_sets, native_tables,
                                                                             monkeypatch):
    rng = random.Random(seed)
    monkeypatch.setattr(sidecar_mod, "SLICE_KEYS", rng.choice((1, 3, 7, 64)))
    ch = Channel(native_key_sets)
    try:
        assert ch.mirror().native == native_key_sets
        assert ch.ingest.key_sets == ("native" if native_key_sets else "python")
        reference = TableWriter(BlockTable(32), "m", 16)  # small: evictions too
        tracked = TableWriter(tracked_table(native_tables)(32), "m", 16)  # the sidecar's, in C or Python
        live: list[tuple[int, list[int]]] = []
        next_hash = [1]
        probes = [keys(prompt(64, seed=s)) for s in range(40)]
        for _ in range(30):
            stream = b""
            for _ in range(rng.randrange(1, 4)):  # several deltas per read, split anywhere
                stream += encode_delta("a", 0, next_delta(rng, reference, tracked, live, next_hash), gen=1)
            cut = rng.randrange(len(stream) + 1)
            await ch.send(stream[:cut])
            await asyncio.sleep(0)
            await ch.send(stream[cut:])
            await ch.settle()
            same_tables(ch.mirror(), reference.table, probes)
        assert reference.table.overflow > 0 and reference.counters.cleared > 0
    finally:
        ch.close()


async def test_a_big_delta_is_applied_in_slices_that_other_tasks_run_between():
    ch = Channel()
    try:
        n = 20 * sidecar_mod.SLICE_KEYS
        big = TableDelta(True, n, 0, False, array("Q", range(1, n + 1)))
        seen: list[int] = []
        done = asyncio.Event()

        async def watcher() -> None:  # what a request being routed meanwhile would see
            while not done.is_set():
                seen.append(len(ch.mirror()._held_gpu))
                await asyncio.sleep(0)

        task = asyncio.create_task(watcher())
        await ch.send(encode_delta("a", 0, big, gen=1))
        await ch.settle()
        done.set()
        await task
        partial = [s for s in seen if 0 < s < n]
        assert len(set(partial)) >= 5  # the watcher ran between slices, many times
        assert len(ch.mirror()) == n and ch.mirror().fresh  # the table's state came with the last slice
    finally:
        ch.close()


async def test_a_delta_of_a_closed_subscription_never_lands_also_once_the_instance_is_back():
    ch = Channel()
    try:
        old = TableDelta(True, 1, 0, False, array("Q", [111]))
        await ch.ingest.remove_instance("a")
        ch.ingest.add_source(ch.spec)  # back (e.g. at another URL): generation 2
        new = TableDelta(True, 1, 0, False, array("Q", [222]))
        # the sidecar had flushed the old subscription's delta before it read REMOVE
        await ch.send(encode_delta("a", 0, old, gen=1) + encode_delta("a", 0, new, gen=2))
        await ch.settle()
        assert ch.mirror().depth([222], 0.8) == 1.0
        assert ch.mirror().depth([111], 0.8) == 0.0
        await ch.ingest.remove_instance("a")
        await ch.send(encode_delta("a", 0, TableDelta(True, 1, 0, False, array("Q", [333])), gen=2))
        await ch.settle()
        assert "a" not in ch.ingest.residency.instances()  # not even a table was made for it
    finally:
        ch.close()


def test_the_child_sends_its_counters_after_the_deltas_they_count_tagged_with_the_generation():
    from router.kvevents.sidecar_main import Sidecar, child_config
    from router.kvevents.sidecar_wire import DELTA, FrameReader, decode_delta

    config = child_config({"hashing": {"mode": "tokens"}, "kv_events": {"enabled": True}})
    ours, theirs = socket.socketpair()
    try:
        child = Sidecar(config, theirs)
        child.gens["a"] = 7  # as an ADD of the router's 7th subscription set it
        table = child.residency.table("a")
        table.store_run([1], [(42,)], 1)
        table.fresh = True
        child.send_stats()  # no flush came first: the stats flush the pending delta before them
        ours.settimeout(5)
        got: list[tuple[bytes, bytes]] = []
        reader = FrameReader()
        while len(got) < 2:
            got += reader.feed(ours.recv(1 << 16))
        assert [kind for kind, _ in got] == [DELTA, STATS]
        frame = decode_delta(got[0][1])
        assert (frame.instance, frame.gen, list(frame.delta.added_gpu), frame.delta.fresh) == ("a", 7, [42], True)
    finally:
        ours.close()
        theirs.close()


needs_shared = pytest.mark.skipif(shared_tables() != "shared", reason="needs the C extension and memfd_create")


@needs_shared
@pytest.mark.parametrize("seed", range(6))
async def test_shared_segments_sent_with_their_descriptors_hold_what_in_process_ingestion_holds(seed, native_tables):
    """With shared tables the test plays the sidecar writing segments in place and sending
    each new one's descriptor; between reads the loop's table holds what in-process
    ingestion holds."""
    rng = random.Random(seed)
    ch, writer = Channel(shared=True), SegmentWriter()
    try:
        assert ch.ingest.mirror == "shared" and isinstance(ch.mirror(), SharedMirrorTable)
        reference = TableWriter(BlockTable(200), "m", 16)
        tracked = TableWriter(tracked_table(native_tables)(200), "m", 16)
        live: list[tuple[int, list[int]]] = []
        next_hash = [1]
        probes = [keys(prompt(64, seed=s)) for s in range(40)]
        segments = 0
        for _ in range(30):
            for _ in range(rng.randrange(1, 4)):
                fd = writer.ship(next_delta(rng, reference, tracked, live, next_hash))
                if fd is not None:
                    segments += 1
                    try:
                        await ch.send_segment(fd)
                    finally:
                        os.close(fd)
            await ch.settle()
            same_tables(ch.mirror(), reference.table, probes)
        assert segments >= 2 and reference.counters.cleared > 0
    finally:
        writer.close()
        ch.close()


@needs_shared
async def test_a_segment_of_a_closed_subscription_is_never_attached():
    ch, old, new = Channel(shared=True), SegmentWriter(), SegmentWriter()
    try:
        await ch.ingest.remove_instance("a")
        ch.ingest.add_source(ch.spec)  # back: generation 2
        for writer, gen, key in ((old, 1, 111), (new, 2, 222)):
            fd = writer.ship(TableDelta(True, 1, 0, False, array("Q", [key])))
            assert fd is not None
            await ch.send_segment(fd, gen=gen)
            os.close(fd)
        await ch.settle()
        assert ch.mirror().depth([222], 0.8) == 1.0 and ch.mirror().depth([111], 0.8) == 0.0
    finally:
        old.close()
        new.close()
        ch.close()


@needs_shared
async def test_a_delta_for_a_shared_table_is_refused_as_a_channel_error():
    """Shared tables never take deltas: one arriving means the peer is not the sidecar this
    router configured, so the channel is dropped (the sidecar would be restarted), with the
    table unchanged."""
    ch = Channel(shared=True)
    try:
        await ch.send(encode_delta("a", 0, TableDelta(True, 1, 0, False, array("Q", [5])), gen=1))
        deadline = asyncio.get_running_loop().time() + 10
        while ch.ingest._sock is not None:
            assert asyncio.get_running_loop().time() < deadline, "the delta was not refused"
            await asyncio.sleep(0.001)
        assert ch.mirror().depth([5], 0.8) == 0.0 and not ch.mirror().attached
    finally:
        ch.close()


@needs_shared
def test_the_shared_child_writes_in_place_and_sends_a_descriptor_only_for_a_new_segment():
    from router.kvevents.sidecar_main import Sidecar, child_config
    from router.kvevents.sidecar_wire import FrameReader
    from router.state.shared_mirror import map_segment

    config = child_config({"hashing": {"mode": "tokens"}, "kv_events": {"enabled": True}})
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    try:
        child = Sidecar(config, theirs, shared=True)
        child.gens["a"] = 7
        table = child.residency.table("a")
        table.store_run([1], [(42,)], 1)
        table.fresh = True
        child.send_stats()

        def frames(n: int) -> tuple[list[tuple[bytes, bytes]], list[int]]:
            got: list[tuple[bytes, bytes]] = []
            fds: list[int] = []
            reader = FrameReader()
            while len(got) < n:
                data, more, _flags, _addr = socket.recv_fds(ours, 1 << 16, 8)
                fds += more
                got += reader.feed(data)
            return got, fds

        got, fds = frames(2)
        assert [kind for kind, _ in got] == [SEGMENT, STATS] and len(fds) == 1  # no delta crossed the socket
        assert json.loads(got[0][1]) == {"instance": "a", "rank": 0, "gen": 7}
        mm, seg = map_segment(fds[0])
        assert seg.tolist(0) == [42] and seg.fresh and seg.size == 1
        table.store_run([2], [(43,)], 1)
        assert child.flush()  # in place: nothing sent
        assert sorted(seg.tolist(0)) == [42, 43] and seg.size == 2
        table.store_run(list(range(10, 60)), [(k,) for k in range(1000, 1050)], 1)  # outgrows 16 slots
        child.send_stats()
        got, fds = frames(2)
        assert [kind for kind, _ in got] == [SEGMENT, STATS] and len(fds) == 1
        mm2, seg2 = map_segment(fds[0])
        assert len(seg2.tolist(0)) == 52 and seg2.caps[0] > seg.caps[0]
        del seg, seg2
        mm.close()
        mm2.close()
    finally:
        ours.close()
        theirs.close()
