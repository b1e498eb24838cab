"""KV-event ingestion for one router process: sources, sockets, discovery, lifecycle.

Every instance gets its sources from ``kv_events.sources`` or, failing that and with
``kv_events.discover``, from its own ``GET /kv_event_sources`` (retried every
``discover_interval_s`` until it answers, so engines may start after the router). Each
source writes into its engine's table in ``EventResidency``; an instance without a
working source simply has no fresh table and is routed on approximate residency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import httpx
import zmq
import zmq.asyncio

from router.config.model import RouterConfig
from router.core.instances import InstancePool
from router.kvevents.apply import TableWriter
from router.kvevents.discovery import DiscoveryError, discover, served_model, spec_from_config
from router.kvevents.sockets import Handler, receive_loop, replay, sub_socket
from router.kvevents.source import Source, SourceSpec
from router.state.precise import EventResidency

log = logging.getLogger(__name__)


@dataclass
class _Bound:
    """A SUB the router binds; publishers connect to it and are told apart by topic."""

    address: str
    socket: zmq.asyncio.Socket
    topics: dict[bytes, Source] = field(default_factory=dict)
    clashes: set[bytes] = field(default_factory=set)
    unknown_topics: int = 0
    task: asyncio.Task[None] | None = None


class KVEventIngest:
    def __init__(self, config: RouterConfig, pool: InstancePool, residency: EventResidency) -> None:
        self._config = config
        self._kv = config.kv_events
        self._pool = pool
        self.residency = residency
        self.sources: list[Source] = []
        self.receive_errors = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._bound: dict[str, _Bound] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, client: httpx.AsyncClient) -> None:
        self._client = client
        await self._open()
        for inst in self._pool:
            self.residency.table(inst.id)  # stale until its events say otherwise
        self._tasks.append(asyncio.create_task(self._discover_loop(), name="pd-router-kv-discovery"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for bound in self._bound.values():
            if bound.task is not None:
                bound.task.cancel()
        tasks = self._tasks + [b.task for b in self._bound.values() if b.task is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._shut()

    async def _open(self) -> None:
        """Where messages will come from: this process's ZMQ sockets (a sidecar's, in
        ``router.kvevents.sidecar``)."""
        self._ctx = zmq.asyncio.Context()
        if self._kv.bind:
            self._bind(self._kv.bind)

    async def _shut(self) -> None:
        for source in self.sources:
            await source.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    async def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        """Until every instance has a source (tests, benchmarks)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        wanted = {i.id for i in self._pool}
        while {s.spec.instance for s in self.sources} < wanted:
            if loop.time() > deadline:
                raise TimeoutError(f"no kv event source for {sorted(wanted - {s.spec.instance for s in self.sources})}")
            await asyncio.sleep(0.02)

    # -- sources -------------------------------------------------------------------------
    def add_source(self, spec: SourceSpec) -> Source:
        assert self._ctx is not None, "KVEventIngest.start() was not awaited"
        writer = TableWriter(self.residency.table(spec.instance, spec.dp_rank), spec.model,
                             self._config.hashing.block_tokens, self._config.hashing.seed)
        source = Source(spec, writer, self._replay, self._kv.max_pending_batches)
        if spec.endpoint is None:
            assert spec.bind is not None, "a connecting publisher's source names the router's bind address"
            self._route_topic(self._bind(spec.bind), spec.topic.encode(), source)
        else:
            sock = sub_socket(self._ctx, self._kv.hwm, [spec.topic])
            sock.connect(spec.endpoint)

            def handle(topic: bytes, seq: int, payload: bytes) -> None:
                source.on_message(seq, payload)

            self._tasks.append(asyncio.create_task(self._run(sock, handle, spec.name), name=f"kv-sub-{spec.name}"))
        self.sources.append(source)  # once its socket is there: a failed bind leaves no dead source behind
        source.begin()
        log.info("kv events of %s: %s", spec.name, f"SUB connected to {spec.endpoint}" if spec.endpoint
                 else f"topic {spec.topic!r} on the bound {spec.bind}")
        return source

    def _bind(self, address: str) -> _Bound:
        assert self._ctx is not None
        bound = self._bound.get(address)
        if bound is None:
            sock = sub_socket(self._ctx, self._kv.hwm, [""])
            sock.bind(address)
            bound = self._bound[address] = _Bound(address, sock)

            def handle(topic: bytes, seq: int, payload: bytes) -> None:
                source = bound.topics.get(topic)
                if source is None:
                    bound.unknown_topics += 1
                    return
                source.on_message(seq, payload)

            bound.task = asyncio.create_task(self._run(sock, handle, address), name=f"kv-bind-{address}")
        return bound

    def _route_topic(self, bound: _Bound, topic: bytes, source: Source) -> None:
        if topic in bound.clashes or topic in bound.topics:
            other = bound.topics.pop(topic, None)
            bound.clashes.add(topic)
            names = ", ".join(s.spec.name for s in (other, source) if s is not None)
            log.error("kv events: %s publish to %s under one topic %r; give each its own topic — their "
                      "residency stays approximate", names, bound.address, topic.decode(errors="replace"))
            return
        bound.topics[topic] = source

    async def _run(self, sock: zmq.asyncio.Socket, handle: Handler, name: str) -> None:
        try:
            await receive_loop(sock, handle, name, self._count_error)
        finally:
            sock.close(linger=0)

    def _count_error(self) -> None:
        self.receive_errors += 1

    async def _replay(self, endpoint: str, start: int) -> list[tuple[int, bytes]] | None:
        assert self._ctx is not None
        return await replay(self._ctx, endpoint, start, self._kv.replay_timeout_s)

    # -- discovery -----------------------------------------------------------------------
    async def _discover_loop(self) -> None:
        """Subscribe every instance of the pool, those that join later too (discovery, the
        admin API): the pool is looked at again every ``discover_interval_s``. A source stays
        once opened (ZMQ reconnects to an instance that comes back at the same address)."""
        done: set[str] = set()  # subscribed, or refused for good
        while True:
            for inst in list(self._pool):
                if inst.id in done:
                    continue
                try:
                    await self._subscribe(inst.id, inst.url, inst.config.model)
                    done.add(inst.id)
                except DiscoveryError as exc:
                    log.info("kv events of %s not subscribed yet: %s", inst.id, exc)
                except (zmq.ZMQError, ValueError) as exc:  # e.g. the port to bind is taken: say so, keep going
                    log.error("kv events of %s cannot be subscribed: %s; its residency stays approximate", inst.id, exc)
                    done.add(inst.id)
            await asyncio.sleep(self._kv.discover_interval_s)

    async def _subscribe(self, instance: str, url: str, model: str | None) -> None:
        assert self._client is not None
        timeout = self._config.health.timeout_s
        configured = self._kv.sources.get(instance)
        if configured is not None:
            if not (configured.model or model):
                model = await served_model(self._client, url, timeout)
            specs = [spec_from_config(instance, url, model or "", configured, self._kv.bind)]
        elif self._kv.discover:
            specs = await discover(self._client, instance, url, model, timeout)
        else:
            log.warning("kv events of %s: no source configured and discovery is off; residency stays approximate", instance)
            return
        for spec in specs:  # all known before any is added, so a failure never leaves a half-subscribed retry
            self.add_source(spec)
