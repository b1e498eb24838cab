"""One publisher's stream into one engine table: sequence checks and resynchronisation.

The table is trusted (fresh) only while every batch since a known state was applied:

* the first batch the router sees has sequence 0 (the engine started after us), or a
  batch goes back to 0 (the engine restarted, its cache empty): clear, then in sync;
* the sequence jumps ahead (the PUB/SUB link dropped messages) or goes back elsewhere
  than 0 (a restart whose first batches were lost), or a payload does not decode: stale;
* when the publisher offers a replay endpoint, a stale stream asks it for the missing
  batches (all of them from 0 after a restart) while live batches wait in a bounded
  buffer; if the replay covers the hole, the stream is in sync again;
* without replay (or when the engine no longer buffers the hole), an
  ``AllBlocksCleared`` brings it back: everything after it is known.

A stale table still applies what arrives, so it is closer to the truth when it resyncs,
but ``EventResidency.matched`` ignores it meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from router.kvevents.apply import TableWriter
from router.kvevents.wire import WireError, decode_batch
from router.state.precise import EngineTable

log = logging.getLogger(__name__)

ReplayFn = Callable[[str, int], Awaitable[list[tuple[int, bytes]] | None]]
"""(replay endpoint, first sequence wanted) -> the buffered (sequence, payload) pairs from
there on, in order, or None when the replay failed."""


@dataclass
class StreamCounters:
    batches: int = 0
    gaps: int = 0
    restarts: int = 0
    malformed: int = 0
    duplicates: int = 0
    replays: int = 0
    replays_failed: int = 0
    resyncs: int = 0
    dropped_pending: int = 0


@dataclass(frozen=True)
class SourceSpec:
    """Where one engine (one data-parallel rank of an instance) publishes."""

    instance: str
    model: str
    endpoint: str | None  # the router's SUB connects here; None: the engine connects to ``bind``
    topic: str = ""
    replay_endpoint: str | None = None
    dp_rank: int = 0
    bind: str | None = None  # the router's bound SUB, for an engine that connects

    @property
    def name(self) -> str:
        return f"{self.instance}#{self.dp_rank}" if self.dp_rank else self.instance


@dataclass
class Source:
    spec: SourceSpec
    writer: TableWriter
    replay: ReplayFn | None = None
    max_pending: int = 10_000
    last: int | None = None
    synced: bool = False
    counters: StreamCounters = field(default_factory=StreamCounters)
    _pending: list[tuple[int, bytes]] | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def table(self) -> EngineTable:
        return self.writer.table

    def on_message(self, seq: int, payload: bytes, *, allow_replay: bool = True) -> None:
        """One live message, in arrival order."""
        if self._pending is not None:
            if len(self._pending) < self.max_pending:
                self._pending.append((seq, payload))
            else:
                self.counters.dropped_pending += 1
            return
        last = self.last
        if last is not None and seq == last:
            self.counters.duplicates += 1
            return
        if seq == 0:
            if last is not None:
                self.counters.restarts += 1
                log.info("kv events of %s restarted at sequence 0: cache state rebuilt from scratch", self.spec.name)
            self.writer.table.clear()
            self.synced = True
        elif last is None or seq != last + 1:
            lost = last is not None and seq > last + 1
            if lost:
                self.counters.gaps += 1
            elif last is not None:
                self.counters.restarts += 1
                self.writer.table.clear()  # a restarted engine holds nothing it held before
            if self.synced or last is None:
                log.warning("kv events of %s: %s at sequence %d (last %s); residency stale until resynced",
                            self.spec.name, "gap" if lost else "joined mid-stream" if last is None else "restart",
                            seq, last)
            self.synced = False
            if allow_replay and self.replay is not None and self.spec.replay_endpoint:
                start = last + 1 if lost and last is not None else 0
                self._start_replay(start, (seq, payload))
                return
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last = seq
        self.counters.batches += 1
        try:
            _ts, events, _rank = decode_batch(payload)
            cleared = self.writer.counters.cleared
            self.writer.apply_raw(events)
        except WireError as exc:
            self.counters.malformed += 1
            if self.synced:
                log.warning("kv events of %s: undecodable batch %d (%s); residency stale", self.spec.name, seq, exc)
            self.synced = False
            self.writer.table.fresh = False
            return
        if not self.synced and self.writer.counters.cleared > cleared:
            self.synced = True
            self.counters.resyncs += 1
            log.info("kv events of %s: in sync again after AllBlocksCleared", self.spec.name)
        self.writer.table.fresh = self.synced

    def begin(self) -> None:
        """Just subscribed: with a replay endpoint, ask for everything from sequence 0 at once,
        so an engine that ran before the router (and may be idle now) is known without
        waiting for its next batch; it is in sync if its buffer still starts at 0."""
        if self.replay is not None and self.spec.replay_endpoint and self.last is None and self._pending is None:
            self._start_replay(0, None)

    # -- replay --------------------------------------------------------------------------
    def _start_replay(self, start: int, first: tuple[int, bytes] | None) -> None:
        self._pending = [first] if first is not None else []
        self.writer.table.fresh = False
        self.counters.replays += 1
        self._task = asyncio.get_running_loop().create_task(self._replay(start), name=f"kv-replay-{self.spec.name}")

    async def _replay(self, start: int) -> None:
        assert self.replay is not None and self.spec.replay_endpoint is not None
        try:
            frames = await self.replay(self.spec.replay_endpoint, start)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the stream stale, never the loop broken
            log.warning("kv event replay from %s failed: %s", self.spec.replay_endpoint, exc)
            frames = None
        pending, self._pending = self._pending or [], None
        covered = frames is not None and bool(frames) and frames[0][0] <= start
        if start == 0 and frames == [] and self.last is None:
            covered = True  # nothing published yet: the engine's cache is empty and known
        if covered and frames is not None:
            if start == 0:
                self.writer.table.clear()
            malformed = self.counters.malformed
            expected = start
            for seq, payload in frames:
                if seq < expected:
                    continue
                if seq > expected:
                    covered = False
                    break
                self.synced = True
                self._apply(seq, payload)
                expected += 1
            if self.counters.malformed > malformed:  # a replayed batch that does not decode fills nothing
                covered = False
        if covered:
            self.synced = True
            self.writer.table.fresh = True
            self.counters.resyncs += 1
            log.info("kv events of %s: in sync again after a replay from %d", self.spec.name, start)
        else:
            self.counters.replays_failed += 1
            self.synced = False
            self.writer.table.fresh = False
        for seq, payload in pending:
            if covered and self.last is not None and seq <= self.last:
                continue  # the replay already carried it
            self.on_message(seq, payload, allow_replay=False)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
