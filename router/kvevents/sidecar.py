"""KV-event ingestion in a child process the router owns (``kv_events.sidecar``).

Decoding the engines' batches and hashing their token ids into router keys costs a few
microseconds per event; at 100k events/s that is half a core, taken on the event loop
in slices that every request then waits behind. Here the sockets, the sequence checks
and replays, decoding and the engine-block tables run in ``router.kvevents.sidecar_main``
and the loop only reads the tables: in shared memory the sidecar writes in place
(``router.state.shared_mirror``; Linux with the C extension, ``kv_events.shared_tables``),
else applying what changed: per table, the router keys that became held or not held
since the last shipment (``router.state.precise_mirror``), every 10 ms while events
flow, in slices of ``SLICE_KEYS`` key changes per loop callback. Stale, gap and
restart handling is the same code as in-process, run there; each delta names the
generation of its instance's subscription, so none outlives the subscription it was for.

The router starts the sidecar with itself, resends it the sources (discovery stays
here), and restarts it with a growing delay if it dies: meanwhile, and until each new
stream shows a known state, every table is stale (approximate residency), as after a
router restart. The sidecar reads its commands on stdin, so it ends when the router does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from router.config.model import RouterConfig
from router.core.instances import InstancePool
from router.kvevents.apply import ApplyCounters, TableWriter
from router.kvevents.ingest import KVEventIngest, _Subscription
from router.config.precise import KVEventsConfig
from router.kvevents.sidecar_wire import (
    ADD, CONFIG, DELTA, ERROR, OPENED, REMOVE, SEGMENT, STATS, ChannelError, DeltaFrame, FrameReader, decode_delta,
    json_frame,
)
from router.kvevents.source import Source, SourceSpec, StreamCounters
from router.state.precise import EventResidency
from router.state.precise_mirror import MirrorTable, delta_changes, key_sets
from router.state.shared_mirror import SharedMirrorTable, map_segment, shared_tables

log = logging.getLogger(__name__)

_RESTART_S, _MAX_RESTART_S, _STABLE_S = 0.5, 10.0, 30.0
_READ_CHUNK = 1 << 20  # per readiness callback; reading pauses while what was read is being applied
_MAX_FDS = 64  # segment descriptors per read (one read never spans two sends that carry some)
# Key changes applied per loop callback (~0.1-0.2 ms of set operations): a decision waits
# behind at most one slice, however large the delta (a resync ships a whole table).
SLICE_KEYS = 2048


def mirror_kind(kv: KVEventsConfig) -> Literal["shared", "deltas"]:
    """How the sidecar's tables reach the loop: shared memory where asked and possible
    (native key sets, Linux), else deltas the loop applies."""
    if key_sets(kv.native_key_sets) != "native":
        return "deltas"
    return shared_tables(kv.shared_tables)


def mirror_factory(kv: KVEventsConfig) -> Callable[[int], MirrorTable]:
    """The router's tables of a sidecar's (``EventResidency``'s factory)."""
    kind = SharedMirrorTable if mirror_kind(kv) == "shared" else MirrorTable
    return functools.partial(kind, native=kv.native_key_sets)


def _sum(a: Any, b: Any) -> Any:
    """Field-wise sum of two counter dataclasses of one type."""
    return type(a)(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)})


@dataclasses.dataclass
class _View:
    """What the router knows of one source the sidecar runs: its spec, and the counters of
    earlier sidecars (a restart must not make Prometheus counters go back)."""

    source: Source
    gen: int  # the generation of its instance's subscription
    base_stream: StreamCounters = dataclasses.field(default_factory=StreamCounters)
    base_apply: ApplyCounters = dataclasses.field(default_factory=ApplyCounters)


class SidecarIngest(KVEventIngest):
    """``KVEventIngest`` whose sources run in a sidecar process; ``sources`` are views (of
    the sources whose sockets the sidecar opened) whose counters and sequence state are
    copied from the sidecar's several times a second."""

    def __init__(self, config: RouterConfig, pool: InstancePool, residency: EventResidency, *,
                 may_bind: bool = True) -> None:
        super().__init__(config, pool, residency, may_bind=may_bind)
        self._views: dict[int, _View] = {}
        self._next_sid = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._frames = FrameReader()
        self._gens: dict[str, int] = {}  # instance -> its current subscription's generation
        self._next_gen = 1
        # frames read but not yet handled, in stream order, and how far the head delta is applied
        self._pending: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._head_done = 0
        self._drain_handle: asyncio.Handle | None = None
        self._paused = False
        self._closing = False
        self._errors_base = 0
        self._errors_now = 0
        self.restarts = 0  # sidecars started after the first
        self.key_sets = key_sets(self._kv.native_key_sets)  # the mirrors': "native" (router.state._keyset) or "python"
        self.mirror = mirror_kind(self._kv)  # "shared" (memory the sidecar writes) or "deltas" (applied here)
        self._fds: collections.deque[int] = collections.deque()  # received with segment frames not yet read

    # -- the process ---------------------------------------------------------------------
    async def _open(self) -> None:
        if self.key_sets == "native":
            log.info("kv events: the mirror tables use native key sets (router.state._keyset)")
        else:
            log.warning("kv events: the mirror tables use Python sets (%s): each key change costs the event loop "
                        "~4x more", "kv_events.native_key_sets is false" if not self._kv.native_key_sets
                        else "router.state._keyset was not built: no C compiler at install time")
        if self.tables == "python":
            log.warning("kv events: the sidecar's tables are Python (%s): ~2.4x its CPU per event",
                        "kv_events.native_tables is false" if not self._kv.native_tables
                        else "router.state._tracked was not built: no C compiler at install time")
        if self.mirror == "shared":
            log.info("kv events: the sidecar writes the tables in shared memory the loop reads in place")
        await self._spawn()
        self._tasks.append(asyncio.create_task(self._watch(), name="pd-router-kv-sidecar"))

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "router.kvevents.sidecar_main", str(theirs.fileno()),
                stdin=asyncio.subprocess.PIPE, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock, self._frames = ours, FrameReader()
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable)
        config = {"hashing": self._config.hashing.model_dump(mode="json"),
                  "kv_events": self._kv.model_dump(mode="json"),
                  "health": self._config.health.model_dump(mode="json")}
        self._send(json_frame(CONFIG, {"config": config, "log_level": logging.getLogger().getEffectiveLevel(),
                                       "may_bind": self._may_bind, "shared": self.mirror == "shared"}))
        for sid, view in self._views.items():
            self._send_add(sid, view.source.spec, view.gen)
        log.info("kv events: sidecar process %d started", self._proc.pid)

    def _send(self, data: bytes) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and proc.returncode is None:
            proc.stdin.write(data)

    def _send_add(self, sid: int, spec: SourceSpec, gen: int) -> None:
        self._send(json_frame(ADD, {"sid": sid, "spec": dataclasses.asdict(spec), "gen": gen}))

    async def _watch(self) -> None:
        """Restart the sidecar whenever it ends while the router runs."""
        delay = _RESTART_S
        while not self._closing:
            proc = self._proc
            started = time.monotonic()
            code = await proc.wait() if proc is not None else None
            self._lost()
            if time.monotonic() - started > _STABLE_S:
                delay = _RESTART_S
            log.error("kv events: the sidecar process exited (%s); every instance's residency is approximate "
                      "until its events resync; restarting in %.1f s", code, delay)
            await asyncio.sleep(delay)
            delay = min(_MAX_RESTART_S, delay * 2)
            self.restarts += 1
            try:
                await self._spawn()
            except OSError as exc:  # e.g. out of processes: try again later
                log.error("kv events: the sidecar could not be started: %s", exc)
                self._proc = None

    def _lost(self) -> None:
        """The sidecar is gone: what it knew is gone with it."""
        self._stop_reading()
        for view in self._views.values():  # the views' counters already include the earlier sidecars'
            view.base_stream = dataclasses.replace(view.source.counters)
            view.base_apply = dataclasses.replace(view.source.writer.counters)
            view.source.last, view.source.synced = None, False
        self._errors_base += self._errors_now
        self._errors_now = 0
        for instance in self.residency.instances():
            for table in self.residency.tables(instance).values():
                table.clear()
                table.fresh = False

    def _stop_reading(self) -> None:
        for kind, item in self._pending:
            if kind == SEGMENT:
                os.close(item[1])
        while self._fds:
            os.close(self._fds.popleft())
        self._pending.clear()
        self._head_done = 0
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None
        self._paused = False
        if self._sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    async def _shut(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # the sidecar ends on its stdin's end
            try:
                await asyncio.wait_for(proc.wait(), 3.0)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        self._stop_reading()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    # -- sources -------------------------------------------------------------------------
    def add_source(self, spec: SourceSpec, url: str | None = None) -> Source:
        view = Source(spec, TableWriter(self.residency.table(spec.instance, spec.dp_rank), spec.model,
                                        self._config.hashing.block_tokens, self._config.hashing.seed))
        sid, self._next_sid = self._next_sid, self._next_sid + 1
        if spec.instance not in self._subs:  # a new subscription: what the sidecar sent for an older one is void
            self._subs[spec.instance] = _Subscription(url or "")
            self._gens[spec.instance], self._next_gen = self._next_gen, self._next_gen + 1
        gen = self._gens[spec.instance]
        self._views[sid] = _View(view, gen)
        self._subs[spec.instance].sources.append(view)
        self._send_add(sid, spec, gen)  # in ``sources`` once the sidecar says its socket is open
        log.info("kv events of %s: %s, in the sidecar", spec.name, f"SUB connected to {spec.endpoint}"
                 if spec.endpoint else f"topic {spec.topic!r} on the bound {spec.bind}")
        return view

    async def _close_subscription(self, instance: str, sub: _Subscription) -> None:
        """The sidecar closes the instance's sockets; deltas it sent before it read the
        command carry this subscription's generation and are dropped (also once the
        instance is subscribed again, under a new generation)."""
        self._gens.pop(instance, None)
        for sid, view in list(self._views.items()):
            if view.source.spec.instance == instance:
                del self._views[sid]
        self._send(json_frame(REMOVE, {"instance": instance}))

    # -- what the sidecar sends ----------------------------------------------------------
    def _readable(self) -> None:
        """Read what the sidecar sent, then apply it in slices (``_drain``); reading pauses
        until it is all applied, so the socket buffer and the sidecar's blocking writes
        are the backpressure (memory stays bounded)."""
        sock = self._sock
        if sock is None:
            return
        try:
            data, fds, flags, _addr = socket.recv_fds(sock, _READ_CHUNK, _MAX_FDS)
        except BlockingIOError:
            return
        except OSError:
            data, fds, flags = b"", [], 0
        self._fds.extend(fds)
        if not data:  # the sidecar closed its end: _watch restarts it
            self._stop_reading()
            return
        try:
            if flags & socket.MSG_CTRUNC:
                raise ChannelError("segment descriptors were cut off")
            shared = self.mirror == "shared"
            for kind, body in self._frames.feed(data):
                if (kind == DELTA and shared) or (kind == SEGMENT and not shared):
                    raise ChannelError(f"a {'delta' if shared else 'segment'} frame, with the tables "
                                       f"{'in shared memory' if shared else 'shipped as deltas'}")
                if kind == DELTA:
                    self._pending.append((kind, decode_delta(body)))
                elif kind == SEGMENT:
                    if not self._fds:
                        raise ChannelError("a segment frame without its descriptor")
                    self._pending.append((kind, (_json(body), self._fds.popleft())))
                else:
                    self._pending.append((kind, _json(body)))
        except (ChannelError, ValueError, KeyError) as exc:
            self._unreadable(exc)
            return
        if self._pending and self._drain_handle is None:
            self._drain()

    def _drain(self) -> None:
        """Handle pending frames in order, at most ``SLICE_KEYS`` key changes per call; the
        rest in a later loop iteration, after whatever requests became ready meanwhile."""
        self._drain_handle = None
        pending, budget = self._pending, SLICE_KEYS
        while pending and budget > 0:
            kind, item = pending[0]
            if kind == DELTA:
                assert isinstance(item, DeltaFrame)
                if self._gens.get(item.instance) == item.gen:  # else: a closed subscription's
                    table = self.residency.table(item.instance, item.rank)
                    assert isinstance(table, MirrorTable)  # not shared: _readable refused its deltas
                    done = table.apply_part(item.delta, self._head_done, budget)
                    budget -= max(done - self._head_done, 1)
                    if done < delta_changes(item.delta):
                        self._head_done = done
                        break
                self._head_done = 0
            else:
                try:
                    if kind == SEGMENT:
                        pending.popleft()  # its descriptor is _attach's now
                        self._attach(*item)
                        continue
                    self._on_message(kind, item)
                except (KeyError, ValueError, TypeError, OSError) as exc:
                    self._unreadable(exc)
                    return
            pending.popleft()
        loop = asyncio.get_running_loop()
        if pending:
            self._drain_handle = loop.call_soon(self._drain)
            if not self._paused and self._sock is not None:
                loop.remove_reader(self._sock.fileno())
                self._paused = True
        elif self._paused and self._sock is not None:
            loop.add_reader(self._sock.fileno(), self._readable)
            self._paused = False

    def _unreadable(self, exc: Exception) -> None:
        log.error("kv events: unreadable message from the sidecar (%s); restarting it", exc)
        self._stop_reading()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()

    def _attach(self, obj: dict[str, Any], fd: int) -> None:
        """A table's new segment: mapped and read from now on, unless its subscription is
        closed (``map_segment`` closes the descriptor either way)."""
        instance, rank, gen = str(obj["instance"]), int(obj["rank"]), int(obj["gen"])
        if self._gens.get(instance) != gen:
            os.close(fd)
            return
        table = self.residency.table(instance, rank)
        assert isinstance(table, SharedMirrorTable)  # shared: _readable refused segments otherwise
        mm, keys = map_segment(fd)
        table.attach(mm, keys)

    def _on_message(self, kind: bytes, obj: dict[str, Any]) -> None:
        if kind == STATS:
            self._on_stats(obj)
        elif kind == OPENED:
            opened = self._views.get(int(obj["sid"]))
            if opened is not None and opened.source not in self.sources:
                self.sources.append(opened.source)
        elif kind == ERROR:
            view = self._views.pop(int(obj["sid"]), None)
            if view is not None:
                if view.source in self.sources:
                    self.sources.remove(view.source)
                log.error("kv events of %s cannot be subscribed: %s; its residency stays approximate",
                          view.source.spec.name, obj["error"])

    def _on_stats(self, obj: dict[str, Any]) -> None:
        self._errors_now = int(obj["receive_errors"])
        self.receive_errors = self._errors_base + self._errors_now
        for sid, stats in obj["sources"].items():
            view = self._views.get(int(sid))
            if view is None:
                continue
            view.source.counters = _sum(view.base_stream, StreamCounters(**stats["stream"]))
            view.source.writer.counters = _sum(view.base_apply, ApplyCounters(**stats["apply"]))
            view.source.last, view.source.synced = stats["last"], bool(stats["synced"])


def _json(body: bytes) -> dict[str, Any]:
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ChannelError("a JSON frame must hold an object")
    return obj

