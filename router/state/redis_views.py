"""Small pure helpers of the Redis store: stored loads, merged views, ops per shard."""

from __future__ import annotations

from collections.abc import Sequence

from router.state.base import Booking, Leg, Load
from router.state.redis_layout import Layout

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
