"""The ingestion sidecar's process: ``python -m router.kvevents.sidecar_main FD``.

It runs the very ingestion the router runs in-process (``KVEventIngest``'s sockets,
``Source``'s sequence checks and replays, ``TableWriter``) over tables that note their
changes (``router.state.precise_native``: in C where built, else ``TrackedTable``), and
every ``FLUSH_S`` (``IDLE_FLUSH_S`` after a flush with nothing to send) writes the
tables' deltas to the socket ``FD`` (or, with shared tables, applies them to the tables'
shared-memory segments, sending a segment's descriptor when it makes a new one); its
counters go every
``STATS_S``. Commands (the config, then sources to open) come framed on stdin; stdin's
end (the router closed it, or died) ends the process, so a sidecar never outlives its
router.

The deltas are written with blocking sends: when the router's loop falls behind, this
process waits, its ZMQ sockets fill up to their high-water mark and the engines' next
batches are dropped there, which the sequence numbers show as gaps (stale until
resynced), exactly as when the router itself cannot keep up. Memory stays bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import zmq

from router.config.model import RouterConfig, load_config
from router.core.instances import InstancePool
from router.kvevents.ingest import KVEventIngest
from router.kvevents.sidecar_wire import ADD, CONFIG, ERROR, OPENED, REMOVE, SEGMENT, STATS, encode_delta, json_frame
from router.kvevents.source import Source, SourceSpec
from router.state.precise import EventResidency
from router.state.precise_native import Tracked, table_kind, tracked_table
from router.state.shared_mirror import SegmentWriter

log = logging.getLogger("router.kvevents.sidecar")

# Each flush wakes the router's loop once per busy table: 10 ms keeps that at 100 wake-ups
# a second, while the router's own speculation covers what was just routed meanwhile.
FLUSH_S = 0.01
IDLE_FLUSH_S = 0.02
STATS_S = 0.25
_HEADER = 5


def child_config(data: dict[str, Any]) -> RouterConfig:
    """The router's hashing and kv_events settings, without instances: sources come as commands."""
    kv = {**data["kv_events"], "sidecar": False, "discover": False, "sources": {}}
    return load_config(overrides={"instances": [], "hashing": data["hashing"], "kv_events": kv,
                                  "health": data.get("health", {})})


class _ChildIngest(KVEventIngest):
    """The router's ingestion, minus following a pool: this process has none (its sources
    come as ADD/REMOVE commands from the router, which follows its own)."""

    async def _reconcile(self) -> None:
        return


class Sidecar:
    def __init__(self, config: RouterConfig, out: socket.socket, may_bind: bool = True, shared: bool = False) -> None:
        kv = config.kv_events
        self.shared = shared  # the router reads the tables in shared memory (it asked: it checked it can)
        self.writers: dict[tuple[str, int], SegmentWriter] = {}
        self.tables = table_kind(kv.native_tables)  # "native" (router.state._tracked) or "python"
        self.residency = EventResidency(kv.max_blocks_per_instance, kv.cpu_weight,
                                        factory=tracked_table(kv.native_tables))
        self.ingest = _ChildIngest(config, InstancePool(config), self.residency, may_bind=may_bind)
        self.sources: dict[int, Source] = {}
        self.gens: dict[str, int] = {}  # instance -> the router's generation of its subscription
        self._out = out

    def add(self, sid: int, spec: SourceSpec, gen: int = 0) -> None:
        self.gens[spec.instance] = gen
        try:
            self.sources[sid] = self.ingest.add_source(spec)
        except (zmq.ZMQError, ValueError) as exc:
            self._out.sendall(json_frame(ERROR, {"sid": sid, "error": str(exc)}))
        else:
            self._out.sendall(json_frame(OPENED, {"sid": sid}))

    async def remove(self, instance: str) -> None:
        """The instance left the router's pool: its sockets closed, its tables dropped."""
        await self.ingest.remove_instance(instance)
        self.sources = {sid: s for sid, s in self.sources.items() if s.spec.instance != instance}
        self.gens.pop(instance, None)
        for key in [k for k in self.writers if k[0] == instance]:
            self.writers.pop(key).close()

    def flush(self) -> bool:
        """Every table's changes since the last flush, one frame each (or applied to its
        segment, a new one sent when made); False when there were none."""
        chunks, segments, changed = [], [], False
        for instance in self.residency.instances():
            gen = self.gens.get(instance, 0)
            for rank, table in self.residency.tables(instance).items():
                assert isinstance(table, Tracked)
                delta = table.take_delta()
                if delta is None:
                    continue
                changed = True
                if not self.shared:
                    chunks.append(encode_delta(instance, rank, delta, gen))
                    continue
                writer = self.writers.get((instance, rank))
                if writer is None:
                    writer = self.writers[(instance, rank)] = SegmentWriter()
                fd = writer.ship(delta)
                if fd is not None:
                    segments.append((json_frame(SEGMENT, {"instance": instance, "rank": rank, "gen": gen}), fd))
        if chunks:
            self._out.sendall(b"".join(chunks))
        try:
            for frame, fd in segments:  # the router maps it; this process keeps its own mapping
                socket.send_fds(self._out, [frame], [fd])
        finally:
            for _frame, fd in segments:
                os.close(fd)
        return changed

    def send_stats(self) -> None:
        """The counters, after the deltas of every event they count (the router reads the
        stream in order, so its applied sequence never runs ahead of its tables)."""
        self.flush()
        stats = {str(sid): {"stream": dataclasses.asdict(s.counters), "apply": dataclasses.asdict(s.writer.counters),
                            "last": s.last, "synced": s.synced} for sid, s in self.sources.items()}
        self._out.sendall(json_frame(STATS, {"sources": stats, "receive_errors": self.ingest.receive_errors}))


async def _commands(stdin: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, Any]]:
    """Yield (kind, JSON object) commands until the router closes stdin."""
    while True:
        try:
            head = await stdin.readexactly(_HEADER)
            body = await stdin.readexactly(int.from_bytes(head[:4], "little"))
        except asyncio.IncompleteReadError:
            return
        yield head[4:5], json.loads(body)


async def run(out_fd: int) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin.buffer)
    out = socket.socket(fileno=out_fd)
    out.setblocking(True)
    commands = _commands(stdin)
    kind, first = await anext(commands)
    if kind != CONFIG:
        raise SystemExit("the first command must be the config")
    logging.basicConfig(level=first.get("log_level", logging.INFO), stream=sys.stderr,
                        format="pd-router kv-sidecar %(levelname)s %(name)s: %(message)s")
    config = child_config(first["config"])
    if config.kv_events.sidecar_nice:
        os.nice(config.kv_events.sidecar_nice)
    sidecar = Sidecar(config, out, bool(first.get("may_bind", True)), bool(first.get("shared", False)))

    def flush() -> None:
        try:
            sent = sidecar.flush()
        except OSError:  # the router is gone: nothing to clean up that the exit does not
            os._exit(0)
        timers[0] = loop.call_later(FLUSH_S if sent else IDLE_FLUSH_S, flush)

    def stats() -> None:
        try:
            sidecar.send_stats()
        except OSError:
            os._exit(0)
        timers[1] = loop.call_later(STATS_S, stats)

    async with httpx.AsyncClient() as client:
        await sidecar.ingest.start(client)
        timers = [loop.call_later(FLUSH_S, flush), loop.call_later(STATS_S, stats)]
        try:
            async for kind, obj in commands:
                if kind == ADD:
                    sidecar.add(int(obj["sid"]), SourceSpec(**obj["spec"]), int(obj.get("gen", 0)))
                elif kind == REMOVE:
                    await sidecar.remove(str(obj["instance"]))
        finally:
            for timer in timers:
                timer.cancel()
            await sidecar.ingest.close()
    out.close()


def main() -> None:
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # plain asyncio works too
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run(int(sys.argv[1])))
    except (BrokenPipeError, ConnectionResetError):  # the router went away
        pass


if __name__ == "__main__":
    main()
