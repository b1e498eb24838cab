"""Small pure helpers of the Redis store: stored loads, merged views, ops per shard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.state.base import Booking, Leg, Load
from router.state.redis_layout import Layout, Op

_IDLE = Load()


def parse_load(packed: str, memo: dict[str, Load] | None = None) -> Load:
    """A stored "requests:prefill:kv:transfers:transfer_bytes" ('' is idle). ``memo``: the
    caller's bounded cache (the same few values come back on every answer)."""
    if not packed:
        return _IDLE
    if memo is None:
        return _parse(packed)
    load = memo.get(packed)
    if load is None:
        if len(memo) > 4096:
            memo.clear()
        load = memo[packed] = _parse(packed)
    return load


def _parse(packed: str) -> Load:
    try:
        return Load(*(max(0, int(part)) for part in packed.split(":")))
    except (ValueError, TypeError):  # written by something else: counts as idle, as in the scripts
        return _IDLE


def merged(own: Load, other: Load) -> Load:
    """Field-wise max: a lower bound of the truth that sees both views."""
    return Load(max(own.requests, other.requests), max(own.prefill_tokens, other.prefill_tokens),
                max(own.kv_tokens, other.kv_tokens), max(own.transfers, other.transfers),
                max(own.transfer_bytes, other.transfer_bytes))


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


def merged_loads(own: Mapping[str, Load], remote: Mapping[str, Load], minus: Booking | None = None,
                 minus_kv: Mapping[str, int] | None = None) -> dict[str, Load]:
    """Per instance, the field-wise max of this replica's own bookings and the shared view.

    Own bookings reach Redis one round trip late, the shared view lacks those still in
    flight; the max is a lower bound of the truth that sees both. ``minus``: a booking of
    this replica's own that the shared view does not hold yet, taken out of ``own``;
    ``minus_kv``: the KV it added per instance, where that is not its legs' ``kv_tokens``
    (a leg that pins blocks adds those no other booking held: MemoryStore.booked_kv)."""
    legs = {leg.instance: leg for leg in minus.legs} if minus is not None else {}
    kvs = minus_kv or {}
    loads = {}
    for inst, mine in own.items():
        leg = legs.get(inst)
        if leg is not None:
            mine = Load(max(0, mine.requests - 1), max(0, mine.prefill_tokens - leg.prefill_tokens),
                        max(0, mine.kv_tokens - kvs.get(inst, leg.kv_tokens)), max(0, mine.transfers - leg.transfers),
                        max(0, mine.transfer_bytes - leg.transfer_bytes))
        other = remote.get(inst, _IDLE)
        loads[inst] = mine if other is _IDLE or other == mine else merged(mine, other)
    return loads


def book_reply(op: Op, reply: Any, loads: dict[str, Load], memo: dict[str, Load]) -> list[tuple[str, str]]:
    """Read one book op's reply: the loads it read and its shard's least-loaded go into
    ``loads``; returns (instance, residency member) of each entry capacity evicted."""
    read = op.args[4:4 + int(op.args[3])]
    for inst, packed in zip(read, reply[0]):
        loads[str(inst)] = parse_load(packed, memo)
    low = reply[1]
    for j in range(0, len(low), 2):
        loads.setdefault(low[j], parse_load(low[j + 1], memo))
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
