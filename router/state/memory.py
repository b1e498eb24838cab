"""The embedded default store: one router process, no network.

Every method runs without yielding to the event loop, so a decision (look up, choose,
book) is atomic with respect to every other request in the process. A leg that pins its
prompt's blocks (``Leg.block_tokens``) books the union of the blocks in flight on its
instance (pins.py): a block's tokens are added when its first holder books and taken
back when its last holder releases.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from router.state.base import Booking, Chooser, Leg, Load, Snapshot, StateStore
from router.state.load_index import LoadIndex
from router.state.pins import PinCounts
from router.state.residency import ResidencyIndex


_IDLE = Load()


class MemoryStore(StateStore):
    def __init__(
        self,
        caps: Mapping[str, int],
        residency_ttl_s: float = 600.0,
        default_cap: int = 8192,
        clock: Callable[[], float] = time.monotonic,
        request_tokens: float = 16.0,
    ) -> None:
        """``request_tokens``: what one request in flight weighs in the load index, in prefill
        tokens (load_index.py; the ttft defaults give 0.002 s x 8000 tokens/s = 16)."""
        self._caps = dict(caps)
        self._index = LoadIndex(request_tokens)
        self._default_cap = default_cap
        self._clock = clock
        self._residency = ResidencyIndex(residency_ttl_s)
        self._loads: dict[str, Load] = {}
        self._bookings: dict[str, Booking] = {}
        self._prefilled: set[str] = set()
        self._legs_done: set[str] = set()  # bookings whose remote prefill leg finished computing
        # FCFS prefill per instance: booking id -> queued work, oldest first; and the head's (id, start, work)
        self._queues: dict[str, dict[str, int]] = {}
        self._heads: dict[str, tuple[str, float, int]] = {}
        # per instance, the blocks pinned by its bookings in flight (one table per instance life:
        # dropped with the instance, each at most its cap of keys); per booking that pinned
        # any, per leg: (the table it pinned in, keys pinned, KV the leg booked in all)
        self._pins: dict[str, PinCounts] = {}
        self._pinned: dict[str, list[tuple[PinCounts, int, int] | None]] = {}

    # -- reads ---------------------------------------------------------------------------
    def snapshot_now(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        """``snapshot`` without awaiting, for callers that read and act in one step with no
        await in between (a decision here, the Redis store's decisions on its local mirror)."""
        now = self._clock()
        matched = self._residency.matched(keys, instances, now)
        booked, heads = self._loads, self._heads
        if not heads:
            loads = {i: booked.get(i, _IDLE) for i in instances}
        else:  # per candidate, not per queue: a decision scores a few dozen of a thousand queues
            loads = {}
            for i in instances:
                load, head = booked.get(i, _IDLE), heads.get(i)
                loads[i] = load if head is None else load.with_head(max(0.0, now - head[1]), head[2])
        return Snapshot(matched, loads, self._residency.confidences(keys, matched), self._residency.rooms())

    def load_of(self, instance: str) -> Load:
        """What this store has booked on ``instance``."""
        return self._loads.get(instance, _IDLE)

    async def snapshot(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        return self.snapshot_now(keys, instances)

    def load_index(self) -> LoadIndex:
        return self._index

    def first_block_holders(self, key: int) -> list[str]:
        return self._residency.holders(key, self._clock())

    # -- writes --------------------------------------------------------------------------
    async def decide(self, keys: Sequence[int], instances: Sequence[str], choose: Chooser) -> tuple[Snapshot, Booking]:
        snap = self.snapshot_now(keys, instances)
        booking = choose(snap)
        self.book(booking)
        return snap, booking

    def book(self, booking: Booking) -> None:
        """Apply a booking (also used by the Redis store to keep its local mirror)."""
        if booking.id in self._bookings:
            return
        self._bookings[booking.id] = booking
        for i, leg in enumerate(booking.legs):
            kv = leg.kv_tokens
            if leg.block_tokens and booking.keys:
                kv = self._pin(booking, i, leg)
            self._add(leg.instance, 1, leg.prefill_tokens, kv, leg.transfers, leg.transfer_bytes, bid=booking.id)
            if booking.keys:
                self.record_residency(leg.instance, booking.keys)

    def _pin(self, booking: Booking, i: int, leg: Leg) -> int:
        """Pin the booking's blocks on the leg's instance; the KV the leg books: its own,
        the blocks no booking held there before, and those the cap left unpinned."""
        table = self._pins.get(leg.instance)
        if table is None:
            table = self._pins[leg.instance] = PinCounts(self._caps.get(leg.instance, self._default_cap))
        n, new = table.pin(booking.keys)
        kv = leg.kv_tokens + (len(booking.keys) - n + new) * leg.block_tokens
        legs = self._pinned.setdefault(booking.id, [None] * len(booking.legs))
        legs[i] = (table, n, kv)
        return kv

    def booked_kv(self, booking: Booking) -> dict[str, int]:
        """instance -> the KV ``booking`` added there when it was booked (for a pinning leg,
        not its ``kv_tokens``: the blocks it was the first to pin too)."""
        pinned = self._pinned.get(booking.id) or [None] * len(booking.legs)
        return {leg.instance: (leg.kv_tokens if rec is None else rec[2]) for leg, rec in zip(booking.legs, pinned)}

    def _unpin(self, booking: Booking, i: int, leg: Leg) -> int | None:
        """Release the leg's pins; the KV to take back: its own, the blocks the cap left
        unpinned, and those no booking holds any more. None when the instance was dropped
        since (its table with it: a new life has a new table): its booked load went with it."""
        legs = self._pinned.get(booking.id)
        rec = legs[i] if legs is not None else None
        if rec is None:
            return leg.kv_tokens
        table, n, _ = rec
        freed = table.unpin(booking.keys[:n])
        if self._pins.get(leg.instance) is not table:
            return None
        return leg.kv_tokens + (len(booking.keys) - n + freed) * leg.block_tokens

    def record_residency(self, instance: str, keys: Sequence[int]) -> None:
        cap = self._caps.get(instance, self._default_cap)
        self._residency.record(instance, keys, cap, self._clock())

    def unrecord_residency(self, instance: str, keys: Sequence[int]) -> None:
        self._residency.unrecord(instance, keys)

    async def prefill_leg_done(self, booking: Booking) -> None:
        bid = booking.id
        if bid in self._bookings and bid not in self._prefilled and bid not in self._legs_done:
            self._legs_done.add(bid)
            for leg in booking.legs:
                if leg.transient:
                    self._add(leg.instance, 0, leg.prefill_tokens, 0, 0, 0, sign=-1, bid=bid)

    def _queued_work(self, bid: str, leg: Leg) -> int:
        """The prefill work a leg still has booked (none once its remote prefill finished)."""
        return 0 if leg.transient and bid in self._legs_done else leg.prefill_tokens

    async def prefill_done(self, booking: Booking) -> None:
        if booking.id in self._bookings and booking.id not in self._prefilled:
            self._prefilled.add(booking.id)
            for leg in booking.legs:
                pf = self._queued_work(booking.id, leg)
                if leg.transient:
                    self._add(leg.instance, 1, pf, leg.kv_tokens, leg.transfers, leg.transfer_bytes, sign=-1, bid=booking.id)
                else:
                    self._add(leg.instance, 0, pf, 0, leg.transfers, leg.transfer_bytes, sign=-1, bid=booking.id)

    async def release(self, booking: Booking) -> None:
        if self._bookings.pop(booking.id, None) is None:
            return
        prefilled = booking.id in self._prefilled
        self._prefilled.discard(booking.id)
        for i, leg in enumerate(booking.legs):
            if prefilled and leg.transient:
                continue  # released at the first byte
            pf, tx, tb = (0, 0, 0) if prefilled else (self._queued_work(booking.id, leg), leg.transfers, leg.transfer_bytes)
            kv = self._unpin(booking, i, leg) if leg.block_tokens else leg.kv_tokens
            if kv is not None:
                self._add(leg.instance, 1, pf, kv, tx, tb, sign=-1, bid=booking.id)
        self._legs_done.discard(booking.id)
        self._pinned.pop(booking.id, None)

    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        await self.release(booking)
        for inst in booking.instances:
            self.unrecord_residency(inst, booking.keys[held.get(inst, 0):])

    async def forget_instance(self, instance: str) -> None:
        self._residency.forget(instance)

    def set_capacity(self, instance: str, cap: int) -> None:
        self._caps[instance] = cap
        table = self._pins.get(instance)
        if table is not None:  # pins above a lowered cap stay until released; no new key is pinned meanwhile
            table.cap = cap

    async def drop_instance(self, instance: str) -> None:
        self._residency.forget(instance)
        self._loads.pop(instance, None)
        self._queues.pop(instance, None)
        self._heads.pop(instance, None)
        self._pins.pop(instance, None)  # its bookings still in flight release into the detached table
        self._index.update(instance, None)
        self._caps.pop(instance, None)

    def _track_head(self, instance: str, bid: str, work: int, sign: int) -> None:
        """FCFS prefill: the oldest booking with work queued on an instance is its head, and
        has been computing since it became the head (booked onto an empty queue, or the one
        before it finished). An estimate, since the router does not see the engine pick
        requests, but it tells a half-done queue from a full one."""
        queue = self._queues.setdefault(instance, {})
        if sign > 0:
            queue[bid] = work
        else:
            queue.pop(bid, None)
        if not queue:
            del self._queues[instance]
            self._heads.pop(instance, None)
            return
        first = next(iter(queue))
        head = self._heads.get(instance)
        if head is None or head[0] != first:
            self._heads[instance] = (first, self._clock(), queue[first])

    def _add(self, instance: str, requests: int, prefill: int, kv: int, transfers: int, nbytes: int, sign: int = 1,
             bid: str = "") -> None:
        """Add (``sign`` 1) or take back (-1) a leg's load on ``instance``, never below zero."""
        old = self._loads.get(instance, _IDLE)
        # max(0, x) each, as comparisons: five builtin calls per booking change were a tenth of this method
        r = old.requests + sign * requests
        r = r if r > 0 else 0
        p = old.prefill_tokens + sign * prefill
        p = p if p > 0 else 0
        k = old.kv_tokens + sign * kv
        k = k if k > 0 else 0
        t = old.transfers + sign * transfers
        t = t if t > 0 else 0
        b = old.transfer_bytes + sign * nbytes
        b = b if b > 0 else 0
        if prefill and bid:
            self._track_head(instance, bid, prefill, sign)
        if not (r or p or k or t or b):  # absent means idle: instances that come and go leave nothing behind
            self._loads.pop(instance, None)
            self._index.update(instance, None)
            return
        new = self._loads[instance] = Load.booked(r, p, k, t, b)
        self._index.update(instance, new)
