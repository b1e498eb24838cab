"""A state store whose residency comes from the engines' KV events where it can.

Wraps any store (memory or Redis): load booking, leases and the approximate routing
history stay the inner store's; only the ``matched`` a policy sees changes. For each
candidate whose event table is fresh, matched is what the engine really holds
(evictions included), raised by the prefixes of requests this router sent there that
have not started answering yet (their blocks reach the events only once the engine has
computed them, and a burst of one prefix must not scatter meanwhile). That speculation
ends at the request's first byte, when the engine's own events have taken over, or after
``speculative_s`` at the latest; it must not outlive the truth, or an engine that keeps
evicting would keep looking warm. A stale or event-less instance keeps the inner
store's approximate figure.

With the Redis store each replica (and each ``serve --workers`` process) subscribes to
the engines itself and keeps its own tables: the events are the shared truth, so there
is nothing to share through Redis beyond what the inner store already shares.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from router.state.base import Booking, Chooser, Snapshot, StateStore
from router.state.load_index import LoadIndex
from router.state.precise import EventResidency
from router.state.residency import ResidencyIndex


class PreciseStore(StateStore):
    def __init__(
        self,
        inner: StateStore,
        residency: EventResidency,
        caps: Mapping[str, int],
        *,
        speculative_s: float = 2.0,
        default_cap: int = 8192,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.residency = residency
        self._caps = dict(caps)
        self._default_cap = default_cap
        self._clock = clock
        self._recent = ResidencyIndex(speculative_s) if speculative_s > 0 else None
        # What the inner store's approximate view held for each live booking, so an
        # abandoned booking takes back exactly the approximate entries it added.
        self._approx_held: dict[str, dict[str, int]] = {}
        self.precise_lookups = 0  # candidate lookups answered from events
        self.fallback_lookups = 0  # candidate lookups answered from routing history

    # -- lifecycle, counters -----------------------------------------------------------
    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    @property
    def round_trips(self) -> int:
        return self.inner.round_trips

    @property
    def corrections(self) -> int:
        return getattr(self.inner, "corrections", 0)

    @property
    def revisions(self) -> int:
        return getattr(self.inner, "revisions", 0)

    @property
    def errors(self) -> int:
        return getattr(self.inner, "errors", 0)

    # -- the overlay -------------------------------------------------------------------
    def overlay(self, keys: Sequence[int], snap: Snapshot, count: bool = True) -> Snapshot:
        """``snap`` with matched replaced, for every fresh instance, by its events' figure."""
        precise = self.residency.matched(keys, snap.matched)
        if not precise:
            if count:
                self.fallback_lookups += len(snap.matched)
            return snap
        if self._recent is not None and keys:
            recent = self._recent.matched(keys, precise, self._clock())
            for inst, depth in recent.items():
                if depth > precise[inst]:
                    precise[inst] = depth
        if count:
            self.precise_lookups += len(precise)
            self.fallback_lookups += len(snap.matched) - len(precise)
        return dataclasses.replace(snap, matched={**snap.matched, **precise})

    async def snapshot(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        return self.overlay(keys, await self.inner.snapshot(keys, instances))

    async def decide(self, keys: Sequence[int], instances: Sequence[str], choose: Chooser) -> tuple[Snapshot, Booking]:
        chooser = _OverlayChooser(self, keys, choose)
        snap, booking = await self.inner.decide(keys, instances, chooser)
        self._approx_held[booking.id] = dict(snap.matched)
        seen = self.overlay(keys, snap, count=False)  # the view before this booking, as the inner store returns it
        if self._recent is not None and booking.keys:
            now = self._clock()
            for inst in booking.instances:
                self._recent.record(inst, booking.keys, self._caps.get(inst, self._default_cap), now)
        return seen, booking

    # -- the rest is the inner store's ---------------------------------------------------
    def _unspeculate(self, booking: Booking) -> None:
        if self._recent is not None and booking.keys:
            for inst in booking.instances:
                self._recent.unrecord(inst, booking.keys)

    async def prefill_done(self, booking: Booking) -> None:
        self._unspeculate(booking)
        await self.inner.prefill_done(booking)

    async def prefill_leg_done(self, booking: Booking) -> None:
        await self.inner.prefill_leg_done(booking)

    async def release(self, booking: Booking) -> None:
        self._approx_held.pop(booking.id, None)
        self._unspeculate(booking)
        await self.inner.release(booking)

    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        approx = self._approx_held.pop(booking.id, held)
        if self._recent is not None:
            for inst in booking.instances:
                self._recent.unrecord(inst, booking.keys[held.get(inst, 0):])
        await self.inner.abandon(booking, approx)

    async def forget_instance(self, instance: str) -> None:
        """The instance came back from being down: its tables are stale until its
        events show a fresh start (sequence 0) or continue without a gap."""
        self.residency.mark_stale(instance)
        if self._recent is not None:
            self._recent.forget(instance)
        await self.inner.forget_instance(instance)


    def load_index(self) -> LoadIndex | None:
        return self.inner.load_index()  # booked load is the inner store's

    def first_block_holders(self, key: int) -> Collection[str]:
        """Holders by the events (traffic that bypassed this router included) or by routing
        history (stale instances): a superset is safe, pruning only scores more."""
        held = dict.fromkeys(self.inner.first_block_holders(key))
        held.update(dict.fromkeys(self.residency.holders(key)))
        return held.keys()

    def set_capacity(self, instance: str, cap: int) -> None:
        self._caps[instance] = cap
        self.inner.set_capacity(instance, cap)

    async def drop_instance(self, instance: str) -> None:
        """The instance left: its event tables, speculation and the inner store's state go."""
        self.residency.drop(instance)
        if self._recent is not None:
            self._recent.forget(instance)
        await self.inner.drop_instance(instance)


class _OverlayChooser:
    """Hands the policy the overlaid snapshot, on the first choice and on a revision."""

    def __init__(self, store: PreciseStore, keys: Sequence[int], inner: Chooser) -> None:
        self._store = store
        self._keys = keys
        self._inner = inner

    def __call__(self, snap: Snapshot) -> Booking:
        return self._inner(self._store.overlay(self._keys, snap))

    def revise(self, snap: Snapshot, booking: Booking) -> Booking | None:
        return self._inner.revise(self._store.overlay(self._keys, snap), booking)
