"""Shared state in Redis, for several router replicas.

One round trip per routing decision: the policy chooses on this replica's local mirror
(a MemoryStore fed by every answer Redis gives), then a Lua script atomically looks up
the authoritative view and books the choice. If the authoritative view would not have
accepted the choice (another replica booked the same instance, or holds the prefix
elsewhere), a second script moves the booking; that correction is counted.

Booked load carries a lease that this replica refreshes while the request lives, so a
crashed replica's load disappears within ``lease_s``. If Redis cannot be reached the
decision falls back to the local mirror (counted), so a Redis outage degrades routing
quality instead of failing requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.state.base import Booking, Chooser, Load, Snapshot, StateStore
from router.state.memory import MemoryStore

log = logging.getLogger(__name__)

_SCRIPTS = ("route", "lookup", "move", "prefill_done", "release", "abandon", "refresh", "forget")


def _load_scripts() -> dict[str, str]:
    folder = resources.files("router.state") / "lua"
    common = (folder / "common.lua").read_text()
    return {name: common + "\n" + (folder / f"{name}.lua").read_text() for name in _SCRIPTS}


class RedisStore(StateStore):
    def __init__(
        self,
        url: str,
        caps: Mapping[str, int],
        *,
        key_prefix: str = "pdr",
        lease_s: float = 15.0,
        residency_ttl_s: float = 600.0,
        default_cap: int = 8192,
        timeout_s: float = 0.5,
    ) -> None:
        self._url = url
        self._prefix = "{" + key_prefix + "}"
        self._caps = dict(caps)
        self._default_cap = default_cap
        self._lease_ms = int(lease_s * 1000)
        self._ttl_ms = int(residency_ttl_s * 1000)
        self._timeout_s = timeout_s
        self._mirror = MemoryStore(caps, residency_ttl_s, default_cap)
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._active: dict[str, Booking] = {}  # booked in Redis, lease refreshed by us
        self._remote: dict[str, Load] = {}  # last shared view of each instance's load
        self._refresher: asyncio.Task[None] | None = None
        self._round_trips = 0
        self.corrections = 0
        self.errors = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._client = aioredis.from_url(
            self._url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s, decode_responses=True
        )
        self._scripts = {name: self._client.register_script(src) for name, src in _load_scripts().items()}
        self._refresher = asyncio.create_task(self._refresh_loop(), name="pd-router-lease-refresh")

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._client is not None:
            await self._client.aclose()

    @property
    def round_trips(self) -> int:
        return self._round_trips

    async def _call(self, name: str, args: dict[str, Any]) -> Any:
        assert self._client is not None, "RedisStore.start() was not awaited"
        self._round_trips += 1
        return await self._scripts[name](args=[self._prefix, json.dumps(args)])

    # -- reads ---------------------------------------------------------------------------
    @staticmethod
    def _parse_view(raw: str, instances: Sequence[str]) -> Snapshot:
        view = json.loads(raw)
        matched = view.get("matched") or []
        packed = view.get("loads") or []
        idle = Load()
        loads = {}
        for inst, text in zip(instances, packed):
            if text:
                loads[inst] = Load(*(int(field) for field in text.split(":")))
            else:
                loads[inst] = idle
        return Snapshot(matched={inst: int(m) for inst, m in zip(instances, matched)}, loads=loads)

    async def snapshot(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        raw = await self._call("lookup", {"instances": list(instances), "keys": [str(k) for k in keys]})
        return self._parse_view(raw, instances)

    def _book_args(self, booking: Booking, with_keys: bool = True) -> dict[str, Any]:
        return {
            "booking": {
                "id": booking.id,
                "legs": [dataclasses.asdict(leg) for leg in booking.legs],
                "keys": [str(k) for k in booking.keys] if with_keys else [],
            },
            "lease_ms": self._lease_ms,
            "ttl_ms": self._ttl_ms,
            "caps": {i: self._caps.get(i, self._default_cap) for i in booking.instances},
        }

    # -- the decision --------------------------------------------------------------------
    @staticmethod
    def _merged(snap: Snapshot, remote: dict[str, Load], minus: Booking | None = None) -> Snapshot:
        """Per instance, the larger of this replica's own bookings and the shared view.

        Own bookings reach Redis one round trip late, the shared view lacks those still
        in flight; the field-wise max is a lower bound of the truth that sees both."""
        legs = {leg.instance: leg for leg in minus.legs} if minus is not None else {}
        idle = Load()
        loads = {}
        for inst, own in snap.loads.items():
            leg = legs.get(inst)
            if leg is not None:
                own = Load(max(0, own.requests - 1), max(0, own.prefill_tokens - leg.prefill_tokens),
                           max(0, own.kv_tokens - leg.kv_tokens), max(0, own.transfers - leg.transfers),
                           max(0, own.transfer_bytes - leg.transfer_bytes))
            other = remote.get(inst, idle)
            if other is idle or other == own:
                loads[inst] = own
            else:
                loads[inst] = Load(max(own.requests, other.requests), max(own.prefill_tokens, other.prefill_tokens),
                                   max(own.kv_tokens, other.kv_tokens), max(own.transfers, other.transfers),
                                   max(own.transfer_bytes, other.transfer_bytes))
        return Snapshot(snap.matched, loads)

    async def decide(self, keys: Sequence[int], instances: Sequence[str], choose: Chooser) -> tuple[Snapshot, Booking]:
        local = self._merged(self._mirror.snapshot_now(keys, instances), self._remote)
        booking = choose(local)
        self._mirror.book(booking)  # concurrent decisions in this replica see it at once
        same = tuple(booking.keys) == tuple(keys)
        args = {"instances": list(instances), "keys": [str(k) for k in keys], "same_keys": same,
                **self._book_args(booking, with_keys=not same)}
        try:
            shared = self._parse_view(await self._call("route", args), instances)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self.errors += 1
            log.warning("state store unreachable, deciding on the local view: %s", exc)
            return local, booking
        self._remote.update(shared.loads)
        for inst, depth in shared.matched.items():
            if depth:
                self._mirror.record_residency(inst, keys[:depth])
        own = self._mirror.snapshot_now((), instances)
        fresh = self._merged(Snapshot(shared.matched, own.loads), shared.loads, minus=booking)
        revised = choose.revise(fresh, booking)
        if revised is not None:
            booking = await self._move(booking, revised, shared, local)
        self._active[booking.id] = booking
        return fresh, booking

    async def _move(self, booking: Booking, revised: Booking, shared: Snapshot, local: Snapshot) -> Booking:
        """Re-book ``revised`` instead of ``booking``; take back the prefix blocks that the
        first choice recorded on instances that did not hold them before."""
        self.corrections += 1
        undo = {i: [str(k) for k in booking.keys[shared.matched.get(i, 0):]] for i in booking.instances}
        try:
            await self._call("move", {**self._book_args(revised), "undo": undo})
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self.errors += 1
            log.warning("could not move booking %s: %s", booking.id, exc)
            return booking
        await self._mirror.release(booking)
        for inst in booking.instances:
            held = max(shared.matched.get(inst, 0), local.matched.get(inst, 0))
            self._mirror.unrecord_residency(inst, booking.keys[held:])
        self._mirror.book(revised)
        return revised

    async def prefill_done(self, booking: Booking) -> None:
        await self._mirror.prefill_done(booking)
        if booking.id in self._active:
            await self._best_effort("prefill_done", {"id": booking.id})

    async def release(self, booking: Booking) -> None:
        await self._mirror.release(booking)
        if self._active.pop(booking.id, None) is not None:
            await self._best_effort("release", {"id": booking.id})

    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        await self._mirror.abandon(booking, held)
        undo = {i: [str(k) for k in booking.keys[held.get(i, 0):]] for i in booking.instances}
        if self._active.pop(booking.id, None) is not None:
            await self._best_effort("abandon", {"id": booking.id, "undo": undo})

    async def forget_instance(self, instance: str) -> None:
        await self._mirror.forget_instance(instance)
        await self._best_effort("forget", {"instance": instance})

    def set_capacity(self, instance: str, cap: int) -> None:
        self._caps[instance] = cap
        self._mirror.set_capacity(instance, cap)

    async def drop_instance(self, instance: str) -> None:
        await self._mirror.drop_instance(instance)
        self._remote.pop(instance, None)
        self._caps.pop(instance, None)
        await self._best_effort("forget", {"instance": instance, "drop_load": True})

    async def _best_effort(self, name: str, args: dict[str, Any]) -> None:
        # A failed release is not lost: the lease stops being refreshed and expires.
        try:
            await self._call(name, args)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self.errors += 1
            log.warning("state store %s failed (lease will expire): %s", name, exc)

    async def _refresh_loop(self) -> None:
        period = max(0.05, self._lease_ms / 3000)
        while True:
            await asyncio.sleep(period)
            await self.refresh_leases()

    async def refresh_leases(self) -> None:
        """Extend every live booking's lease (one round trip), sweeping expired ones."""
        await self._best_effort("refresh", {"ids": list(self._active), "lease_ms": self._lease_ms})
