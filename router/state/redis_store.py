"""Shared state in Redis, for several router replicas.

At most two round trips per request, whatever its kind: the decision, and the release.
The first byte's write (prefill done) needs no answer, so it waits in a queue and rides
along with this replica's next round trip (any request's decision or release, or a timer
``flush_s`` later), pipelined in front of it, so reads still see every earlier write; a
release that finds it still queued supersedes it (dropping the booking subsumes it).

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
from redis.exceptions import NoScriptError, RedisError

from router.state.base import Booking, Chooser, Load, Snapshot, StateStore
from router.state.breaker import Breaker, BreakerOpen
from router.state.memory import MemoryStore

log = logging.getLogger(__name__)

_SCRIPTS = ("route", "lookup", "move", "batch", "abandon", "refresh", "forget")


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
        breaker_failures: int = 3,
        breaker_probe_s: float = 0.5,
        flush_s: float = 0.005,
    ) -> None:
        self._url = url
        self._flush_s = flush_s
        self._queued: dict[str, str] = {}  # booking id -> batched write ('P' prefill done, 'R' release)
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
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
        self._breaker = Breaker(breaker_failures, breaker_probe_s)
        # Bookings whose route call timed out: a hung Redis may still run it once it wakes up,
        # which would leave phantom load until the lease ran out. Dropped once Redis answers again.
        self._uncertain: set[str] = set()
        self.corrections = 0
        self.errors = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._client = aioredis.from_url(
            self._url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s, decode_responses=True
        )
        self._scripts = {name: self._client.register_script(src) for name, src in _load_scripts().items()}
        with contextlib.suppress(RedisError, OSError, asyncio.TimeoutError):  # else loaded on first use
            await self._load_scripts()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="pd-router-lease-refresh")

    async def close(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        if self._queued and self._client is not None:
            await self._send_queued()
        for task in list(self._flushing):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._client is not None:
            await self._client.aclose()

    @property
    def round_trips(self) -> int:
        return self._round_trips

    @property
    def degraded(self) -> bool:
        """True while the breaker holds Redis off: decisions use this replica's view only."""
        return self._breaker.open

    async def _call(self, name: str, args: dict[str, Any]) -> Any:
        """One script, in one round trip, with the queued writes pipelined in front of it."""
        assert self._client is not None, "RedisStore.start() was not awaited"
        if not self._breaker.allow():
            raise BreakerOpen("state store breaker open")
        self._round_trips += 1
        try:
            result = await self._send(name, args)
        except (RedisError, OSError, asyncio.TimeoutError):
            self._breaker.failure()
            raise
        self._breaker.success()
        return result

    async def _send(self, name: str, args: dict[str, Any]) -> Any:
        assert self._client is not None
        if not self._queued:
            return await self._scripts[name](args=[self._prefix, json.dumps(args)])
        queued = self._take_queued()
        for attempt in (1, 2):
            # evalsha straight on the pipeline: redis-py's Script on a pipeline would first
            # ask SCRIPT EXISTS, one more round trip on every call
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._scripts["batch"].sha, 0, self._prefix, "{}", *queued)
            pipe.evalsha(self._scripts[name].sha, 0, self._prefix, json.dumps(args))
            try:
                return (await pipe.execute())[1]
            except NoScriptError:  # Redis restarted or was flushed: load them, once
                if attempt == 2:
                    raise
                await self._load_scripts()
            except BaseException:
                for i in range(0, len(queued), 2):  # not sent: they go with the next round trip
                    self._queued.setdefault(queued[i + 1], queued[i])
                raise
        raise AssertionError("unreachable")

    async def _load_scripts(self) -> None:
        assert self._client is not None
        for script in self._scripts.values():
            await self._client.script_load(script.script)

    def _take_queued(self) -> list[str]:
        flat = [part for booking_id, op in self._queued.items() for part in (op, booking_id)]
        self._queued = {}
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        return flat

    def _queue(self, booking_id: str, op: str) -> None:
        self._queued[booking_id] = op
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self._flush_s, self._flush_later)

    def _flush_later(self) -> None:
        self._flush_timer = None
        if self._queued:
            task = asyncio.get_running_loop().create_task(self._send_queued(), name="pd-router-state-flush")
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _send_queued(self) -> None:
        """The queued writes alone, in one round trip (a release, or the timer)."""
        assert self._client is not None, "RedisStore.start() was not awaited"
        if not self._queued:
            return
        if not self._breaker.allow():  # held off: the writes wait for Redis (or their leases expire)
            return
        queued = self._take_queued()
        self._round_trips += 1
        try:
            await self._scripts["batch"](args=[self._prefix, "{}", *queued])
            self._breaker.success()
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self._breaker.failure()
            self.errors += 1
            log.warning("state store batch of %d writes failed (leases will expire): %s", len(queued) // 2, exc)

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
        return Snapshot(snap.matched, loads, snap.confidence)

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
            if not isinstance(exc, BreakerOpen):  # the breaker logged its opening once
                log.warning("state store unreachable, deciding on the local view: %s", exc)
                if len(self._uncertain) < 100_000:  # bounded: beyond it, the leases clean up
                    self._uncertain.add(booking.id)
            return local, booking
        if self._uncertain:
            await self._settle()
        self._remote.update(shared.loads)
        for inst, depth in shared.matched.items():
            if depth:
                self._mirror.record_residency(inst, keys[:depth])
        own = self._mirror.snapshot_now((), instances)
        # Confidence (LRU position) comes from this replica's mirror as it stood before the
        # decision touched it; an instance the mirror knows nothing of counts 1.0.
        fresh = self._merged(Snapshot(shared.matched, own.loads, local.confidence), shared.loads, minus=booking)
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
        if booking.id in self._active and booking.id not in self._queued:
            self._queue(booking.id, "P")  # no round trip of its own: see the module docstring

    async def release(self, booking: Booking) -> None:
        await self._mirror.release(booking)
        if self._active.pop(booking.id, None) is not None:
            self._queued[booking.id] = "R"  # supersedes a queued prefill done of the same booking
            await self._send_queued()  # with every other write queued: one round trip

    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        await self._mirror.abandon(booking, held)
        undo = {i: [str(k) for k in booking.keys[held.get(i, 0):]] for i in booking.instances}
        if self._active.pop(booking.id, None) is not None:
            self._queued.pop(booking.id, None)  # the abandon drops the booking: nothing queued for it is left to do
            await self._best_effort("abandon", {"id": booking.id, "undo": undo})

    async def forget_instance(self, instance: str) -> None:
        await self._mirror.forget_instance(instance)
        await self._best_effort("forget", {"instance": instance})

    def set_capacity(self, instance: str, cap: int) -> None:
        self._caps[instance] = cap  # sent with every booking: the shared index evicts by it too
        self._mirror.set_capacity(instance, cap)

    async def drop_instance(self, instance: str) -> None:
        await self._mirror.drop_instance(instance)
        self._remote.pop(instance, None)
        self._caps.pop(instance, None)
        await self._best_effort("forget", {"instance": instance, "drop_load": True})

    async def _settle(self) -> None:
        """Drop the bookings a timed-out call may have made after all (idempotent: release of
        an unknown booking does nothing)."""
        ids, self._uncertain = self._uncertain, set()
        for booking_id in ids:
            if booking_id not in self._active:
                self._queued[booking_id] = "R"
        await self._send_queued()  # all of them in one batched round trip

    async def _best_effort(self, name: str, args: dict[str, Any]) -> None:
        # A failed release is not lost: the lease stops being refreshed and expires.
        try:
            await self._call(name, args)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self.errors += 1
            if not isinstance(exc, BreakerOpen):
                log.warning("state store %s failed (lease will expire): %s", name, exc)

    async def _refresh_loop(self) -> None:
        period = max(0.05, self._lease_ms / 3000)
        while True:
            await asyncio.sleep(period)
            await self.refresh_leases()

    async def refresh_leases(self) -> None:
        """Extend every live booking's lease (one round trip), sweeping expired ones."""
        await self._best_effort("refresh", {"ids": list(self._active), "lease_ms": self._lease_ms})
