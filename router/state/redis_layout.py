"""Where the Redis store keeps what, so that a Redis Cluster shards it.

A Cluster runs a script only on keys of one hash slot, and spreads slots over nodes. The
state falls into two kinds of shard, each a hash tag of its own (lua/ops.lua lists the keys):

- **Residency shards** ``{P:r<n>}``, n = the prompt's first block key mod ``residency_shards``.
  Block keys are chained (a key determines its whole prefix), so every block of a prompt
  lives in its first block's shard: one decision's look-up and its records are one slot.
  Different prompts spread over the shards; prompts that share a first block (one system
  prompt) share a shard, which is exactly the data one decision needs together.
- **Instance shards** ``{P:i<n>}``, n = xxh64(instance) mod ``instance_shards``: booked load,
  the load-key sorted set that candidate pruning reads, bookings (each shard keeps its own
  legs of a booking), leases, and each instance's LRU of residency entries (capacity is
  per instance, so its eviction order must live with the instance, not the prompt), and the
  blocks pinned by each instance's bookings in flight (its booked KV is their union: pins.py).

A decision therefore touches a bounded number of slots: one residency shard, plus the
instance shards of its candidates (at most ``instance_shards``; with candidate pruning a
few dozen instances, typically all of them). The store sends all of them in one round
trip: one script call to a standalone Redis (which never checks slots), one call per slot
pipelined to a Cluster (redis-py sends each node its calls concurrently). Capacity
eviction pops entries from the instance's LRU; taking them out of their residency shard
(another slot) is queued and rides with the next round trip, like the first byte's write.
Every key a script touches is declared in its KEYS (a Cluster requirement).

Why not one shard per instance: a decision reads the load of every candidate and the
residency of every holder of the first block, so it would touch an unbounded number of
slots. Why not all loads in one slot: every request of every replica would then meet on
one Cluster node.
"""

from __future__ import annotations

from collections.abc import Sequence
import struct
from dataclasses import dataclass, field

import xxhash

from router.state.base import Leg

Arg = str | int | float
_NAMES_MAX = 65_536  # block names remembered (~100 bytes each)
_HEX = "{:016x}"  # block keys are 64-bit: fixed width, so a script can index them
# A field of each shard's loads hash that names no instance (lua/ops.lua: its long value keeps
# the hash out of Redis's ziplist encoding); a reader of the whole hash skips it.
LOADS_PAD = "\x1epad"


@dataclass(frozen=True)
class Op:
    """One operation of lua/ops.lua on the keys of one shard (``tag``: its hash tag)."""

    code: str
    tag: str
    keys: Sequence[str]
    args: Sequence[Arg] = field(default=())


class Layout:
    def __init__(self, key_prefix: str, residency_shards: int = 16, instance_shards: int = 4) -> None:
        self.prefix = key_prefix
        self.residency_shards = residency_shards
        self.instance_shards = instance_shards
        self._inst_tags: dict[str, str] = {}
        self._names: dict[str, dict[int, str]] = {}  # residency tag -> block key -> its residency key
        self._named = 0

    # -- names ---------------------------------------------------------------------------
    def residency_shard(self, first_key: int) -> int:
        return first_key % self.residency_shards

    def residency_tag(self, shard: int) -> str:
        return f"{{{self.prefix}:r{shard}}}"

    def instance_tag(self, instance: str) -> str:
        tag = self._inst_tags.get(instance)
        if tag is None:
            if len(self._inst_tags) > 100_000:  # bounded: instances come and go
                self._inst_tags.clear()
            shard = xxhash.xxh64_intdigest(instance.encode()) % self.instance_shards
            tag = self._inst_tags[instance] = f"{{{self.prefix}:i{shard}}}"
        return tag

    def instance_tags(self) -> list[str]:
        return [f"{{{self.prefix}:i{shard}}}" for shard in range(self.instance_shards)]

    def loads_key(self, instance: str) -> str:
        return self.instance_tag(instance) + ":loads"

    def lru_key(self, instance: str) -> str:
        return self.instance_tag(instance) + ":lru:" + instance

    def _shard_keys(self, tag: str) -> list[str]:
        return [tag + ":loads", tag + ":lz", tag + ":bk", tag + ":leases", tag + ":pin"]

    def members(self, keys: Sequence[int]) -> list[str]:
        """LRU members of a prompt's blocks: residency shard and block key (16 hex digits)."""
        if not keys:
            return []
        shard = self.residency_shard(keys[0])
        return [f"{shard}:{k:016x}" for k in keys]

    @staticmethod
    def hex_blocks(keys: Sequence[int]) -> str:
        """Block keys as one string of 16 hex digits each: packed big-endian and hexed in C
        (14 vs 195 us for 512 blocks by format per key); by format for a key outside 64 bits."""
        try:
            return struct.pack(f">{len(keys)}Q", *keys).hex()
        except struct.error:
            return "".join(map(_HEX.format, keys))

    @staticmethod
    def block_id(key: int) -> str:
        """A block key as the residency shards name it (16 hex digits)."""
        return _HEX.format(key)

    @staticmethod
    def parse_member(member: str) -> tuple[int, str]:
        """(residency shard, block key as the residency shard names it: 16 hex digits) of an LRU member."""
        shard, _, key = member.partition(":")
        return int(shard), key

    # -- residency shard ops -------------------------------------------------------------
    def lookup(self, keys: Sequence[int], record: Sequence[str], ttl_ms: int, hex_keys: str = "",
               declare: bool = True) -> Op:
        """Depth of every holder of ``keys[0]``, then record ``keys`` on ``record``. Without
        ``declare`` (a standalone Redis, which never checks a script's keys) the blocks' keys
        are not declared: the script names the few it touches from ``hex_keys``
        (``hex_blocks(keys)``), so a 512-block prompt sends one argument instead of 512 names
        (packing them was 28% of the router process's CPU per Redis decision in cProfile). A Cluster needs
        every key declared (and so does a key outside 64 bits, whose hex is not 16 digits)."""
        tag = self.residency_tag(self.residency_shard(keys[0]))
        if not declare:
            hex_keys = hex_keys or self.hex_blocks(keys)
            if len(hex_keys) == 16 * len(keys):
                return Op("L", tag, [tag + ":fg"], [ttl_ms, hex_keys, len(record), *record])
        return Op("L", tag, [tag + ":fg", *self._block_names(tag, keys)], [ttl_ms, "", len(record), *record])

    def _block_names(self, tag: str, keys: Sequence[int]) -> list[str]:
        """The residency keys of ``keys``' blocks in shard ``tag``, remembered (a hot prompt's
        hundreds of names are the same on every decision: a C-level look-up each instead of
        formatting and concatenating). Bounded: forgotten all at once past ``_NAMES_MAX``."""
        memo = self._names.get(tag)
        if memo is not None:
            try:
                return list(map(memo.__getitem__, keys))
            except KeyError:
                pass
        block = tag + ":b:"
        names = [block + _HEX.format(k) for k in keys]
        if self._named + len(names) > _NAMES_MAX:
            self._names.clear()
            self._named = 0
        memo = self._names.setdefault(tag, {})
        before = len(memo)
        memo.update(zip(keys, names))
        self._named += len(memo) - before
        return names

    def unhold(self, shard: int, pairs: Sequence[tuple[str, str]]) -> Op:
        """Take back residency entries (block key, instance) of one residency shard."""
        tag = self.residency_tag(shard)
        return Op("U", tag, [f"{tag}:b:{key}" for key, _ in pairs], [inst for _, inst in pairs])

    def forget_marks(self, instance: str, ttl_ms: int) -> list[Op]:
        tags = (self.residency_tag(s) for s in range(self.residency_shards))
        return [Op("G", tag, [tag + ":fg"], [instance, ttl_ms]) for tag in tags]

    # -- instance shard ops --------------------------------------------------------------
    def book(self, tag: str, booking_id: str, lease_ms: int, request_tokens: float, read: Sequence[str], low: int,
             legs: Sequence[Leg], caps: Sequence[int], keys: Sequence[int], hex_keys: str = "", replica: str = "") -> Op:
        """Read ``read``'s loads and the ``low`` least loaded of shard ``tag``; book ``legs`` (of this
        shard) and put the prompt's ``keys`` on their instances' LRUs (``hex_keys``: ``hex_blocks(keys)``,
        built once per decision; sent only to shards with legs). With ``replica`` (the router
        replica's id), the booking is counted in that replica's share too (lua/ops.lua add_load)."""
        args: list[Arg] = [booking_id, lease_ms, request_tokens, len(read), *read, low, len(legs)]
        for leg, cap in zip(legs, caps):
            args += [leg.instance, leg.prefill_tokens, leg.kv_tokens, leg.transfers, leg.transfer_bytes,
                     int(leg.transient), cap, leg.block_tokens]
        recorded = bool(keys and legs)
        args += [self.residency_shard(keys[0]) if recorded else -1,
                 (hex_keys or self.hex_blocks(keys)) if recorded else "", replica]
        names = self._shard_keys(tag) + [tag + ":seq"] + [self.lru_key(leg.instance) for leg in legs]
        return Op("B", tag, names, args)

    def writes(self, tag: str, request_tokens: float, pairs: Sequence[tuple[str, str]]) -> Op:
        """Batched (op, booking id) writes: 'P' prefill done, 'R' release."""
        return Op("W", tag, self._shard_keys(tag), [request_tokens, *(x for pair in pairs for x in pair)])

    def refresh(self, tag: str, lease_ms: int, request_tokens: float, ids: Sequence[str]) -> Op:
        return Op("T", tag, self._shard_keys(tag), [lease_ms, request_tokens, *ids])

    def unremember(self, instance: str, members: Sequence[str]) -> Op:
        return Op("Z", self.instance_tag(instance), [self.lru_key(instance)], list(members))

    def forget(self, instance: str, drop_load: bool) -> Op:
        tag = self.instance_tag(instance)
        return Op("F", tag, [self.lru_key(instance), tag + ":loads", tag + ":lz", tag + ":pin"], [instance, int(drop_load)])
