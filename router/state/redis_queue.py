"""Writes of the Redis store that need no answer, held for this replica's next round trip.

A first byte's write (prefill done) and the residency entries capacity eviction took off
an instance's LRU (their blocks live in another shard) wait here, and ride in front of the
next call this replica makes (a decision, a release) or go alone ``flush_s`` later, so they
cost no round trip of their own. A release supersedes a queued prefill done of the same
booking. Bounded: beyond ``max_unholds`` queued entries, evicted ones are left to expire
with the residency TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from router.state.base import Booking
from router.state.redis_layout import Layout, Op

Taken = tuple[dict[str, tuple[str, Booking]], dict[int, list[tuple[str, str]]]]


class WriteQueue:
    def __init__(self, layout: Layout, request_tokens: float, flush_s: float, flush: Callable[[], Coroutine[Any, Any, None]],
                 max_unholds: int = 100_000) -> None:
        self._layout = layout
        self._request_tokens = request_tokens
        self._flush_s = flush_s
        self._flush = flush
        self._max_unholds = max_unholds
        self._bookings: dict[str, tuple[str, Booking]] = {}  # booking id -> ('L' leg done | 'P' prefill done | 'R' release, booking)
        self._unholds: dict[int, list[tuple[str, str]]] = {}  # residency shard -> (block key, instance)
        self._unhold_count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        return bool(self._bookings or self._unholds)

    def __contains__(self, booking_id: str) -> bool:
        return booking_id in self._bookings

    def put(self, booking: Booking, op: str, arm: bool = True) -> None:
        """Queue ``op`` for ``booking`` (replacing what was queued for it); ``arm``: send it
        ``flush_s`` from now unless another round trip takes it first."""
        self._bookings[booking.id] = (op, booking)
        if arm:
            self._arm()

    def op(self, booking_id: str) -> str | None:
        entry = self._bookings.get(booking_id)
        return entry[0] if entry is not None else None

    def discard(self, booking_id: str) -> None:
        self._bookings.pop(booking_id, None)

    def unhold(self, shard: int, pairs: list[tuple[str, str]]) -> None:
        if self._unhold_count + len(pairs) > self._max_unholds:
            return
        self._unholds.setdefault(shard, []).extend(pairs)
        self._unhold_count += len(pairs)
        self._arm()

    def take(self) -> tuple[list[Op], Taken]:
        """Everything queued as ops (one per shard), and what they were made of (``restore``)."""
        self.cancel_timer()
        ops: list[Op] = []
        if self._bookings:
            by_tag: dict[str, list[tuple[str, str]]] = {}
            for booking_id, (op, booking) in self._bookings.items():
                for tag in dict.fromkeys(self._layout.instance_tag(i) for i in booking.instances):
                    by_tag.setdefault(tag, []).append((op, booking_id))
            ops += [self._layout.writes(tag, self._request_tokens, pairs) for tag, pairs in by_tag.items()]
        ops += [self._layout.unhold(shard, pairs) for shard, pairs in self._unholds.items()]
        taken = (self._bookings, self._unholds)
        self._bookings, self._unholds, self._unhold_count = {}, {}, 0
        return ops, taken

    def restore(self, taken: Taken) -> None:
        """Writes that were not sent go with the next round trip (newer ones win)."""
        bookings, unholds = taken
        for booking_id, entry in bookings.items():
            self._bookings.setdefault(booking_id, entry)
        for shard, pairs in unholds.items():
            self.unhold(shard, pairs)

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def wait(self) -> None:
        """Let flushes already under way finish (at close)."""
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self:
            task = asyncio.get_running_loop().create_task(self._flush(), name="pd-router-state-flush")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
