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
from router.state.precise_native import table_kind

log = logging.getLogger(__name__)


@dataclass
class _Subscription:
    """One instance's sources, as subscribed for the URL it had then."""

    url: str
    sources: list[Source] = field(default_factory=list)
    receivers: list[asyncio.Task[None]] = field(default_factory=list)  # connected SUBs' receive loops


_MEMBERSHIP_POLL_S = 0.2  # how soon a pool change is seen (a version compare, nothing more)


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
    def __init__(self, config: RouterConfig, pool: InstancePool, residency: EventResidency, *,
                 may_bind: bool = True) -> None:
        self._config = config
        self._may_bind = may_bind  # False in one of several worker processes: only one of them could
        self._kv = config.kv_events
        self.tables = table_kind(self._kv.native_tables)  # the engine-block tables': "native" (C) or "python"
        self._pool = pool
        self.residency = residency
        self.sources: list[Source] = []
        self.receive_errors = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._bound: dict[str, _Bound] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None
        self._subs: dict[str, _Subscription] = {}
        self._refused: dict[str, str] = {}  # instance -> the URL it cannot be subscribed at, for good

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
        for sub in self._subs.values():
            for task in sub.receivers:
                task.cancel()
        tasks = self._tasks + [b.task for b in self._bound.values() if b.task is not None]
        tasks += [t for sub in self._subs.values() for t in sub.receivers]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._shut()

    async def _open(self) -> None:
        """Where messages will come from: this process's ZMQ sockets (a sidecar's, in
        ``router.kvevents.sidecar``)."""
        self._ctx = zmq.asyncio.Context()
        if self._kv.bind and self._may_bind:
            self._bind(self._kv.bind)
        elif self._kv.bind:
            log.error("kv events: kv_events.bind %s is not bound: one of several worker processes cannot; "
                      "residency of the engines that connect to it stays approximate", self._kv.bind)

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
    def add_source(self, spec: SourceSpec, url: str | None = None) -> Source:
        """Subscribe one source; ``url`` is its instance's (the subscription ends when it changes)."""
        assert self._ctx is not None, "KVEventIngest.start() was not awaited"
        sub = self._subs.get(spec.instance)
        if sub is None:
            sub = self._subs[spec.instance] = _Subscription(url or "")
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

            sub.receivers.append(asyncio.create_task(self._run(sock, handle, spec.name), name=f"kv-sub-{spec.name}"))
        self.sources.append(source)  # once its socket is there: a failed bind leaves no dead source behind
        sub.sources.append(source)
        source.begin()
        log.info("kv events of %s: %s", spec.name, f"SUB connected to {spec.endpoint}" if spec.endpoint
                 else f"topic {spec.topic!r} on the bound {spec.bind}")
        return source

    def _bind(self, address: str) -> _Bound:
        assert self._ctx is not None
        bound = self._bound.get(address)
        if bound is None:
            if not self._may_bind:
                raise ValueError(f"it publishes by connecting to the router ({address}), which only one process "
                                 "can bind: with serve --workers N give it a binding endpoint (tcp://*:PORT)")
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

    async def remove_instance(self, instance: str) -> None:
        """Unsubscribe an instance that left (or moved): its sockets closed, its bound topics
        freed, its tables dropped, so nothing it publishes later counts for anyone."""
        sub = self._subs.pop(instance, None)
        self.residency.drop(instance)
        if sub is None:
            return
        await self._close_subscription(instance, sub)
        self.sources = [s for s in self.sources if s.spec.instance != instance]
        log.info("kv events of %s: unsubscribed (the instance left the pool)", instance)

    async def _close_subscription(self, instance: str, sub: _Subscription) -> None:
        """The departed instance's sockets closed and its bound topics freed (in this process;
        a sidecar's, in ``router.kvevents.sidecar``)."""
        for task in sub.receivers:
            task.cancel()
        for task in sub.receivers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for source in sub.sources:
            await source.close()
            if source.spec.endpoint is None and source.spec.bind is not None:
                bound = self._bound.get(source.spec.bind)
                if bound is not None and bound.topics.get(source.spec.topic.encode()) is source:
                    del bound.topics[source.spec.topic.encode()]

    # -- discovery -----------------------------------------------------------------------
    async def _discover_loop(self) -> None:
        """Keep the subscriptions equal to the pool: an instance that joins (discovery, the
        admin API) is subscribed within ``_MEMBERSHIP_POLL_S``, one that leaves or moves to
        another URL is unsubscribed; discovery that did not answer yet is retried every
        ``discover_interval_s``. A source stays while its instance does (ZMQ reconnects to
        an engine that comes back at the same address)."""
        loop = asyncio.get_running_loop()
        seen, retry_at = -1, 0.0
        while True:
            if self._pool.version != seen or loop.time() >= retry_at:
                seen, retry_at = self._pool.version, loop.time() + self._kv.discover_interval_s
                await self._reconcile()
            await asyncio.sleep(_MEMBERSHIP_POLL_S)

    async def _reconcile(self) -> None:
        members = {inst.id: inst for inst in self._pool}
        for instance, sub in list(self._subs.items()):
            inst = members.get(instance)
            tables = self.residency.tables(instance)
            dropped = any(tables.get(s.spec.dp_rank) is not s.table for s in sub.sources)  # left and came back
            if inst is None or inst.url != sub.url or dropped:
                await self.remove_instance(instance)
        for instance, url in list(self._refused.items()):
            if instance not in members or members[instance].url != url:
                del self._refused[instance]
        for inst in members.values():
            if inst.id in self._subs or inst.id in self._refused:
                continue
            try:
                await self._subscribe(inst.id, inst.url, inst.config.model)
            except DiscoveryError as exc:
                log.info("kv events of %s not subscribed yet: %s", inst.id, exc)
            except (zmq.ZMQError, ValueError) as exc:  # e.g. the port to bind is taken: say so, keep going
                log.error("kv events of %s cannot be subscribed: %s; its residency stays approximate", inst.id, exc)
                self._refused[inst.id] = inst.url

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
            self.add_source(spec, url)
