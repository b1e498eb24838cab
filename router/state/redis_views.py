"""Small pure helpers of the Redis store: stored loads, merged views, ops per shard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.state.base import Booking, Leg, Load
from router.state.redis_layout import Layout, Op

IDLE = _IDLE = Load()  # the one idle load of the Redis store's views: tested by identity (others)


def parse_load(packed: str) -> Load:
    """A stored "requests:prefill:kv:transfers:transfer_bytes" ('' is idle; the replicas'
    shares after it, if any, left out: split_load). Callers on the hot path memoize whole
    values (shared_of)."""
    if not packed:
        return _IDLE
    try:
        return Load(*(max(0, int(part)) for part in packed.split("|", 1)[0].split(":")))
    except (ValueError, TypeError):  # written by something else: counts as idle, as in the scripts
        return _IDLE


def combined(own: Load, other: Load, shared_kv: int) -> Load:
    """This replica's load plus the other replicas' (``other``: their share, KV left out),
    KV the larger of its own and the shared total ``shared_kv`` (the union of every replica's
    pinned blocks, which does not add up per replica; lua/ops.lua). Own's queue head is kept:
    only this replica tracks one. ``own`` itself when the others add nothing."""
    if other is _IDLE and shared_kv <= own.kv_tokens:
        return own
    return Load.booked(own.requests + other.requests, own.prefill_tokens + other.prefill_tokens,
                       max(own.kv_tokens, shared_kv), own.transfers + other.transfers,
                       own.transfer_bytes + other.transfer_bytes).with_head(own.prefill_started_s, own.prefill_head_tokens)


def split_load(packed: str, replica: str) -> tuple[Load, Load]:
    """(total, ``replica``'s share) of a stored value "<total>|<replica>=<share>|..." (lua/ops.lua add_load)."""
    bar = packed.find("|")
    if bar < 0:
        return parse_load(packed), _IDLE
    total = parse_load(packed[:bar])
    key = f"|{replica}="
    at = packed.find(key, bar)
    if at < 0:
        return total, _IDLE
    end = packed.find("|", at + 1)
    return total, parse_load(packed[at + len(key):end] if end >= 0 else packed[at + len(key):])


def others(total: Load, mine: Load) -> Load:
    """The stored total less this replica's stored share: the other replicas' load, KV left
    out (the shares carry none) unless this replica has no share there. Idle is ``_IDLE``
    itself, so callers test it by identity."""
    if total is _IDLE or mine is _IDLE:
        return total
    r, p = max(0, total.requests - mine.requests), max(0, total.prefill_tokens - mine.prefill_tokens)
    t, b = max(0, total.transfers - mine.transfers), max(0, total.transfer_bytes - mine.transfer_bytes)
    if not (r or p or t or b):
        return _IDLE
    return Load.booked(r, p, 0, t, b)


def shared_of(packed: str, replica: str, memo: dict[str, tuple[Load, int]]) -> tuple[Load, int]:
    """(the other replicas' load, every replica's booked KV) of a stored value. ``memo``: the
    caller's bounded cache: the same few values come back on every answer, and the same value
    gives the same object, so an unchanged view compares by identity."""
    hit = memo.get(packed)
    if hit is None:
        if len(memo) > 4096:
            memo.clear()
        total, mine = split_load(packed, replica)
        hit = memo[packed] = (others(total, mine), total.kv_tokens)
    return hit


def shard_reads(layout: Layout, instances: Sequence[str], booking: Booking | None) -> dict[str, tuple[list[str], list[Leg]]]:
    """Instance shard tag -> (instances whose load to read there, the booking's legs there)."""
    shards: dict[str, tuple[list[str], list[Leg]]] = {}
    for inst in instances:
        tag = layout.instance_tag(inst)
        entry = shards.get(tag)
        if entry is None:
            entry = shards[tag] = ([], [])
        entry[0].append(inst)
    if booking is not None:
        for leg in booking.legs:
            tag = layout.instance_tag(leg.instance)
            entry = shards.get(tag)
            if entry is None:
                entry = shards[tag] = ([], [])
            entry[1].append(leg)
    return shards


def merged_loads(own: Mapping[str, Load], remote: Mapping[str, Load], shared_kv: Mapping[str, int],
                 minus: Booking | None = None, minus_kv: Mapping[str, int] | None = None) -> dict[str, Load]:
    """Per instance, this replica's own bookings plus the other replicas' (``remote``), KV
    the larger of its own and the shared total (``shared_kv``: combined says why).

    Redis keeps each replica's share of an instance's load with the total (lua/ops.lua), so
    a replica reads the others' load exactly and adds its own, which it knows before Redis
    does (its queued writes, its bookings in flight). ``minus``: a booking of this replica's
    own taken out of ``own``; ``minus_kv``: the KV it added per instance, where that is not
    its legs' ``kv_tokens`` (a leg that pins blocks adds those no other booking held:
    MemoryStore.booked_kv)."""
    legs = {leg.instance: leg for leg in minus.legs} if minus is not None else {}
    kvs = minus_kv or {}
    loads = {}
    for inst, mine in own.items():
        leg = legs.get(inst)
        if leg is not None:
            mine = Load(max(0, mine.requests - 1), max(0, mine.prefill_tokens - leg.prefill_tokens),
                        max(0, mine.kv_tokens - kvs.get(inst, leg.kv_tokens)), max(0, mine.transfers - leg.transfers),
                        max(0, mine.transfer_bytes - leg.transfer_bytes))
        loads[inst] = combined(mine, remote.get(inst, _IDLE), shared_kv.get(inst, 0))
    return loads


def book_reply(op: Op, reply: Any, loads: dict[str, Load], kv: dict[str, int],
               memo: dict[str, tuple[Load, int]], replica: str) -> list[tuple[str, str]]:
    """Read one book op's reply: the other replicas' share of the loads it read and of its
    shard's least loaded go into ``loads`` (the total less ``replica``'s share: shared_of),
    their booked KV into ``kv``; returns (instance, residency member) of each entry capacity evicted."""
    read = op.args[4:4 + int(op.args[3])]
    for inst, packed in zip(read, reply[0]):
        loads[str(inst)], kv[str(inst)] = shared_of(packed, replica, memo)
    low = reply[1]
    for j in range(0, len(low), 2):
        if low[j] not in loads:
            loads[low[j]], kv[low[j]] = shared_of(low[j + 1], replica, memo)
    evicted = reply[2]
    return [(evicted[j], evicted[j + 1]) for j in range(0, len(evicted), 2)]


def drop_ops(layout: Layout, request_tokens: float, booking: Booking, held: Mapping[str, int]) -> list[Op]:
    """Release ``booking`` and take back its blocks beyond what each instance ``held``."""
    ops = [layout.writes(tag, request_tokens, [("R", booking.id)])
           for tag in dict.fromkeys(layout.instance_tag(i) for i in booking.instances)]
    if booking.keys:
        shard = layout.residency_shard(booking.keys[0])
        for inst in dict.fromkeys(booking.instances):
            undo = booking.keys[held.get(inst, 0):]
            if undo:
                ops.append(layout.unhold(shard, [(layout.block_id(k), inst) for k in undo]))
                ops.append(layout.unremember(inst, layout.members(booking.keys)[len(booking.keys) - len(undo):]))
    return ops


def refresh_ops(layout: Layout, active: Mapping[str, Booking], lease_ms: int, request_tokens: float) -> list[Op]:
    """Extend the leases of ``active`` bookings, one op per instance shard (every shard, so each is swept)."""
    by_tag: dict[str, list[str]] = {tag: [] for tag in layout.instance_tags()}
    for booking_id, booking in active.items():
        for tag in dict.fromkeys(layout.instance_tag(i) for i in booking.instances):
            by_tag.setdefault(tag, []).append(booking_id)
    return [layout.refresh(tag, lease_ms, request_tokens, ids) for tag, ids in by_tag.items()]
