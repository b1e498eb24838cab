"""Shared state in Redis (standalone or Cluster), for several router replicas.

Key layout and sharding: redis_layout.py (a decision touches one residency shard and the
instance shards of its candidates, all in one round trip); the operations: lua/ops.lua.

At most two round trips per request, whatever its kind: the decision, and the release.
The first byte's write (prefill done) needs no answer, so it waits in a queue and rides
along with this replica's next round trip (any request's decision or release, or a timer
``flush_s`` later), in front of it, so reads still see every earlier write; a release that
finds it still queued supersedes it. Residency entries that capacity eviction took off an
instance's LRU are queued the same way (their blocks live in another shard): redis_queue.py.

One round trip per routing decision: the policy chooses on this replica's local mirror
(a MemoryStore fed by every answer Redis gives), then the ops look up the authoritative
view and book the choice. If the authoritative view would not have accepted the choice
(another replica booked the same instance, or holds the prefix elsewhere), a second call
moves the booking; that correction is counted. Redis keeps each replica's share of every
instance's load with the total (one value: lua/ops.lua add_load), so a replica reads the
other replicas' load exactly and adds its own (which it knows first): the policy is asked
again only when the round trip brought news from elsewhere (residency, or another
replica's load on a candidate), never for this replica's own bookings and releases made
while the call was out, which the decisions that made them had already seen. Candidate
pruning (load_index,
first_block_holders) reads the mirror and a load index over the shared loads this replica
has seen: every answer carries each queried shard's least-loaded instances and every holder
of the prompt's first block, and a holder that pruning left out is offered to the policy
before it revises (``widen``).

Booked load carries a lease that this replica refreshes while the request lives, so a
crashed replica's load disappears within ``lease_s``. If Redis cannot be reached the
decision falls back to the local mirror (counted), so an outage degrades routing quality
instead of failing requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from router.state.base import Booking, Chooser, Load, Snapshot, StateStore
from router.state.breaker import Breaker, BreakerOpen
from router.state.load_index import LoadIndex
from router.state.memory import MemoryStore
from router.state.redis_calls import FAILURES, LinearPackConnection, Runner, cluster_client
from router.state.redis_layout import Layout, Op
from router.state.redis_link import Link
from router.state.redis_views import IDLE, book_reply, combined, drop_ops, merged_loads, refresh_ops, shard_reads

log = logging.getLogger(__name__)

_IDLE = IDLE  # the views' own: idle is compared by identity


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
        cluster: bool = False,
        residency_shards: int = 16,
        instance_shards: int = 4,
        request_tokens: float = 16.0,
        report_least_loaded: int = 4,
        declare_keys: bool | None = None,
    ) -> None:
        self._url = url
        self._cluster = cluster
        self._declare = cluster if declare_keys is None else declare_keys  # every key in KEYS? (Layout.lookup)
        self._layout = Layout(key_prefix, residency_shards, instance_shards)
        self._link = Link(self._layout, request_tokens, flush_s, Breaker(breaker_failures, breaker_probe_s))
        self._writes = self._link.writes
        self._caps = dict(caps)
        self._default_cap = default_cap
        self._lease_ms = int(lease_s * 1000)
        self._ttl_ms = int(residency_ttl_s * 1000)
        self._timeout_s = timeout_s
        self._request_tokens = request_tokens
        self._low = report_least_loaded
        self._mirror = MemoryStore(caps, residency_ttl_s, default_cap, request_tokens=request_tokens)
        self._index = LoadIndex(request_tokens)  # over own plus the other replicas' loads
        self.replica = secrets.token_hex(6)  # this store's share of each load in Redis is filed under it
        self._client: aioredis.Redis | aioredis.RedisCluster | None = None
        self._active: dict[str, Booking] = {}  # booked in Redis, lease refreshed by us
        self._remote: dict[str, Load] = {}  # the other replicas' load on each instance, as last read (its KV unused)
        self._shared_kv: dict[str, int] = {}  # each instance's booked KV in Redis, every replica's (redis_views.combined)
        self._parsed: dict[str, tuple[Load, int]] = {}  # stored load text -> (others' load, KV) (bounded: shared_of)
        self._refresher: asyncio.Task[None] | None = None
        # Bookings whose route call timed out: a hung Redis may still run it once it wakes up,
        # which would leave phantom load until the lease ran out. Dropped once Redis answers again.
        self._uncertain: dict[str, Booking] = {}
        self.corrections = 0
        self.revisions = 0  # decisions whose policy ran again on news the round trip brought

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        opts: dict[str, Any] = {"socket_timeout": self._timeout_s, "socket_connect_timeout": self._timeout_s,
                                "decode_responses": True, "connection_class": LinearPackConnection}
        if self._cluster:
            self._client = cluster_client(self._url, **opts)
        else:
            self._client = aioredis.from_url(self._url, **opts)
        runner = self._link.runner = Runner(self._client, self._cluster, timeout_s=self._timeout_s)
        with contextlib.suppress(*FAILURES):  # else loaded on first use
            await runner.load()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="pd-router-lease-refresh")

    async def close(self) -> None:
        self._writes.cancel_timer()
        if self._writes and self._link.runner is not None:
            await self._link.send_queued()
        await self._writes.wait()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._link.runner is not None:
            await self._link.runner.close()
        if self._client is not None:
            await self._client.aclose()

    @property
    def round_trips(self) -> int:
        return self._link.round_trips

    @property
    def errors(self) -> int:
        """Failed calls: decisions that fell back to the local view, and best-effort writes."""
        return self._link.errors

    @property
    def degraded(self) -> bool:
        """True while the breaker holds Redis off: decisions use this replica's view only."""
        return self._link.breaker.open

    @property
    def slot_retries(self) -> int:
        """Cluster calls sent a second time because their slot was moving (resharding)."""
        return self._link.runner.slot_retries if self._link.runner is not None else 0

    @property
    def residency_skipped(self) -> int:
        """Residency calls given up on while their slot moved (decided on this replica's view)."""
        return self._link.runner.residency_skipped if self._link.runner is not None else 0

    @property
    def layout(self) -> Layout:
        return self._layout

    # -- reads ---------------------------------------------------------------------------
    def _read_ops(self, keys: Sequence[int], instances: Sequence[str], booking: Booking | None,
                  record: bool) -> list[Op]:
        """The look-up (and with ``booking``, the booking) of one decision: one residency
        shard, and each instance shard that holds a candidate or a leg."""
        lay = self._layout
        ops: list[Op] = []
        book_keys = booking.keys if booking is not None and record else ()
        recorders = booking.instances if booking is not None else ()
        hex_keys, declare = lay.hex_blocks(book_keys) if book_keys else "", self._declare
        if keys:
            same = book_keys is keys or tuple(book_keys) == tuple(keys)
            ops.append(lay.lookup(keys, recorders if book_keys and same else (), self._ttl_ms,
                                  hex_keys if same else "", declare))
            if book_keys and not same:
                ops.append(lay.lookup(book_keys, recorders, self._ttl_ms, hex_keys, declare))
        elif book_keys:
            ops.append(lay.lookup(book_keys, recorders, self._ttl_ms, hex_keys, declare))
        if book_keys and not self._cluster and ops[-1].args[1] == hex_keys:
            hex_keys = "="  # one call to a standalone Redis: the bookings name the look-up's keys (lua/ops.lua)
        # the least loaded of each shard feed pruning's index; a decision over the whole pool reads every load anyway
        low = self._low if booking is not None and len(instances) < len(self._caps) else 0
        for tag, (read, legs) in shard_reads(lay, instances, booking).items():
            caps = [self._caps.get(leg.instance, self._default_cap) for leg in legs]
            ops.append(lay.book(tag, booking.id if booking else "", self._lease_ms, self._request_tokens, read,
                                low, legs, caps, book_keys, hex_keys, self.replica))
        return ops

    def _absorb(self, ops: list[Op], replies: list[Any], keys: Sequence[int],
                known: Mapping[str, int] | None = None) -> tuple[dict[str, int] | None, dict[str, Load]]:
        """Holders' depths (None when the look-up was skipped while its slot moved:
        redis_calls.py) and the other replicas' loads from the replies; learn from them
        (mirror, shared view, load index) and queue the residency entries evicted by
        capacity. ``known``: depths the mirror already had (those need no recording again)."""
        depth: dict[str, int] | None = {}
        loads: dict[str, Load] = {}
        kv: dict[str, int] = {}
        first_lookup = True
        for op, reply in zip(ops, replies):
            if op.code == "L":
                if first_lookup:
                    depth = None if reply is None else {str(reply[j]): int(reply[j + 1]) for j in range(0, len(reply), 2)}
                    first_lookup = False
            elif op.code == "B":
                for instance, member in book_reply(op, reply, loads, kv, self._parsed, self.replica):
                    shard, key = self._layout.parse_member(member)
                    self._writes.unhold(shard, [(key, instance)])
        remote, shared_kv = self._remote, self._shared_kv
        changed = [inst for inst, load in loads.items()
                   if remote.get(inst) is not load or shared_kv.get(inst) != kv[inst]]
        remote.update(loads)
        shared_kv.update(kv)
        self._reindex(changed)
        known = known or {}
        for inst, d in (depth or {}).items():
            if d > known.get(inst, 0):
                self._mirror.record_residency(inst, keys[:d])
        return depth, loads

    async def snapshot(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        ops = self._read_ops(keys, instances, None, record=False)
        depth, loads = self._absorb(ops, await self._link.call(ops), keys)
        if depth is None:  # the residency shard is moving: this replica's own view of it
            depth = self._mirror.snapshot_now(keys, instances).matched
        own, kv = self._mirror.load_of, self._shared_kv
        return Snapshot({i: depth.get(i, 0) for i in instances},
                        {i: combined(own(i), loads[i], kv.get(i, 0)) if i in loads else own(i) for i in instances})

    # -- candidate pruning -----------------------------------------------------------------
    def load_index(self) -> LoadIndex:
        return self._index

    def first_block_holders(self, key: int) -> Collection[str]:
        return self._mirror.first_block_holders(key)

    def _reindex(self, instances: Collection[str]) -> None:
        for inst in instances:
            self._index.update(inst, combined(self._mirror.load_of(inst), self._remote.get(inst, _IDLE),
                                              self._shared_kv.get(inst, 0)))

    # -- the decision --------------------------------------------------------------------
    async def decide(self, keys: Sequence[int], instances: Sequence[str], choose: Chooser) -> tuple[Snapshot, Booking]:
        local = self._merged_view(self._mirror.snapshot_now(keys, instances))
        remote = self._remote
        seen = [remote.get(i, _IDLE) for i in instances]  # the other replicas' loads chosen on
        booking = choose(local)
        self._mirror.book(booking)  # concurrent decisions in this replica see it at once
        self._reindex(booking.instances)
        ops = self._read_ops(keys, instances, booking, record=True)
        try:
            replies = await self._link.call(ops)
        except FAILURES as exc:
            self._link.errors += 1
            if not isinstance(exc, BreakerOpen):  # the breaker logged its opening once
                log.warning("state store unreachable, deciding on the local view: %s", exc)
                if len(self._uncertain) < 100_000:  # bounded: beyond it, the leases clean up
                    self._uncertain[booking.id] = booking
            return local, booking
        if self._uncertain:
            await self._settle()
        depth, _ = self._absorb(ops, replies, keys, local.matched)
        if depth is None:  # the residency shard is moving: what this replica knows of it
            depth = {i: d for i, d in local.matched.items() if d}
        considered = list(instances)
        known = set(considered)
        missed = [i for i in depth if i not in known]
        widen = getattr(choose, "widen", None)  # RequestChooser.widen: holders the pruning left out
        if missed and widen is not None:
            considered += widen(missed)
        matched = {i: depth.get(i, 0) for i in considered}
        if matched == local.matched and all(remote.get(i, _IDLE) is s for i, s in zip(instances, seen)):
            # No news from elsewhere: what changed since the choice is this replica's own
            # bookings and releases, made by decisions that saw this one's.
            return self._keep(booking, local)
        self.revisions += 1
        own = self._mirror.snapshot_now((), considered)
        # Confidence (LRU position) comes from this replica's mirror as it stood before the
        # decision touched it; an instance the mirror knows nothing of counts 1.0.
        fresh = self._merged_view(Snapshot(matched, own.loads, local.confidence, local.room), minus=booking)
        revised = choose.revise(fresh, booking)
        if revised is not None:
            booking = await self._move(booking, revised, matched, local.matched)
        return self._keep(booking, fresh)

    def _keep(self, booking: Booking, snap: Snapshot) -> tuple[Snapshot, Booking]:
        self._active[booking.id] = booking
        return snap, booking

    def _merged_view(self, snap: Snapshot, minus: Booking | None = None) -> Snapshot:
        """Per instance, this replica's own bookings plus the other replicas' (redis_views.
        merged_loads); confidence (LRU position) and cache room stay this replica's mirror's."""
        kv = self._mirror.booked_kv(minus) if minus is not None else None
        return Snapshot(snap.matched, merged_loads(snap.loads, self._remote, self._shared_kv, minus, kv), snap.confidence,
                        snap.room)

    async def _move(self, booking: Booking, revised: Booking, shared: dict[str, int], local: dict[str, int]) -> Booking:
        """Re-book ``revised`` instead of ``booking``; take back the prefix blocks that the
        first choice recorded on instances that did not hold them before."""
        self.corrections += 1
        ops = drop_ops(self._layout, self._request_tokens, booking, shared) + self._read_ops(revised.keys, (), revised, record=True)
        try:
            replies = await self._link.call(ops)
        except FAILURES as exc:
            self._link.errors += 1
            log.warning("could not move booking %s: %s", booking.id, exc)
            return booking
        self._absorb(ops, replies, revised.keys)
        await self._mirror.release(booking)
        for inst in booking.instances:
            held = max(shared.get(inst, 0), local.get(inst, 0))
            self._mirror.unrecord_residency(inst, booking.keys[held:])
        self._mirror.book(revised)
        self._reindex({*booking.instances, *revised.instances})
        return revised

    # -- the request's end -----------------------------------------------------------------
    async def prefill_leg_done(self, booking: Booking) -> None:
        await self._mirror.prefill_leg_done(booking)
        self._reindex(booking.instances)
        if booking.id in self._active and booking.id not in self._writes:
            self._writes.put(booking, "L")  # rides with the next call, as a prefill done does

    async def prefill_done(self, booking: Booking) -> None:
        await self._mirror.prefill_done(booking)
        self._reindex(booking.instances)
        if booking.id in self._active and self._writes.op(booking.id) in (None, "L"):
            # no round trip of its own (see the module docstring); it supersedes an unsent leg
            # done, as "P" releases the whole leg
            self._writes.put(booking, "P")

    async def release(self, booking: Booking) -> None:
        await self._mirror.release(booking)
        self._reindex(booking.instances)
        if self._active.pop(booking.id, None) is not None:
            self._writes.put(booking, "R", arm=False)  # supersedes a queued prefill done of the same booking
            await self._link.send_queued()  # with every other write queued: one round trip

    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        await self._mirror.abandon(booking, held)
        self._reindex(booking.instances)
        if self._active.pop(booking.id, None) is not None:
            self._writes.discard(booking.id)  # the abandon drops the booking: nothing queued for it is left to do
            await self._link.best_effort("abandon", drop_ops(self._layout, self._request_tokens, booking, held))

    async def forget_instance(self, instance: str) -> None:
        await self._mirror.forget_instance(instance)
        ops = self._layout.forget_marks(instance, self._ttl_ms) + [self._layout.forget(instance, drop_load=False)]
        await self._link.best_effort("forget", ops)

    def set_capacity(self, instance: str, cap: int) -> None:
        self._caps[instance] = cap  # sent with every booking: the shared LRU evicts by it too
        self._mirror.set_capacity(instance, cap)

    async def drop_instance(self, instance: str) -> None:
        await self._mirror.drop_instance(instance)
        self._remote.pop(instance, None)
        self._shared_kv.pop(instance, None)
        self._index.update(instance, None)
        self._caps.pop(instance, None)
        ops = self._layout.forget_marks(instance, self._ttl_ms) + [self._layout.forget(instance, drop_load=True)]
        await self._link.best_effort("forget", ops)

    async def _settle(self) -> None:
        """Drop the bookings a timed-out call may have made after all (idempotent: release of
        an unknown booking does nothing)."""
        uncertain, self._uncertain = self._uncertain, {}
        for booking_id, booking in uncertain.items():
            if booking_id not in self._active:
                self._writes.put(booking, "R", arm=False)
        await self._link.send_queued()  # all of them in one batched round trip

    async def _refresh_loop(self) -> None:
        period = max(0.05, self._lease_ms / 3000)
        while True:
            await asyncio.sleep(period)
            await self.refresh_leases()

    async def refresh_leases(self) -> None:
        """Extend every live booking's lease (one round trip), sweeping expired ones."""
        await self._link.best_effort("refresh", refresh_ops(self._layout, self._active, self._lease_ms, self._request_tokens))
