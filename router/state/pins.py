"""The blocks pinned by requests in flight on one instance: booked KV as a union.

An engine shares a cached block between every running request whose prompt starts with
it, and frees it only when the last of them ends. So the KV booked on an instance is the
union of the blocks of its requests in flight (a tenant's prefix counted once, however many
of its requests run) plus what each request holds alone (its prompt's tail beyond the
block keys and its output). Booking the KV a request adds (prompt - cached + output) loses
a shared prefix from the booked KV as soon as the request that brought it ends, while its
sharers still pin it; booking every request's whole prompt counts the prefix once per
request in flight. Both lie about the room an engine has.

A ``PinCounts`` keeps the union as the tree it is: block keys are chained, so every booking
holding a block holds the blocks before it, and the union is closed under prefixes. It holds
every ``PIN_STRIDE``-th key of a chain and its last one, each standing for the blocks since the
previous one (``PIN_STRIDE`` of them, or fewer for a chain's unaligned last key: the same weight
in every chain, a key's position being fixed by the chaining): a booking of a 512-block prompt
touches 64 keys, not 512, and the union is over-counted by at most ``PIN_STRIDE - 1`` blocks per
distinct chain end in flight (never under-counted). Each key in it stores how many bookings'
pinned chains end there and how many of its children are in the union; a key is held while
either is non-zero. So a booking touches only the keys it is the first to pin (found by
bisecting the prefix already in the union) and a release only the keys it frees, whereas
counting holders per block made every release walk the whole prompt (a 512-block prompt:
~250 us). It is bounded by ``cap`` blocks (the instance's residency capacity: an engine cannot
keep more blocks for running requests than its cache holds). A booking pins its prompt's
leading blocks; at the cap it pins no further key (the first that would not fit stops it), and
the rest of its prompt is booked as its own KV, counted per request and released with it: the
cap costs accuracy, never a leak. A release unpins exactly the chain its booking pinned and
never takes a count below zero. router/state/lua/pins.lua counts the same keys, with the same
stride, for the Redis store.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

PIN_STRIDE = 8  # router/state/lua/pins.lua has its own copy (a test checks they agree)


def pin_keys(keys: Sequence[int]) -> list[int]:
    """The keys of a chain that are pinned: every ``PIN_STRIDE``-th, and the last."""
    sampled = list(keys[PIN_STRIDE - 1::PIN_STRIDE])
    if len(keys) % PIN_STRIDE:
        sampled.append(keys[-1])
    return sampled


def covered(samples: int, blocks: int) -> int:
    """Blocks stood for by the first ``samples`` pinned keys of a ``blocks``-block chain."""
    return min(samples * PIN_STRIDE, blocks)


class PinCounts:
    __slots__ = ("_ends", "_kids", "_size", "cap")

    def __init__(self, cap: int) -> None:
        # a key is in the union while it is in either map: pinned chains ending at it, and
        # its children in the union (two maps, so a new chain's keys go in with one C call)
        self._ends: dict[int, int] = {}
        self._kids: dict[int, int] = {}
        self._size = 0  # blocks the union's keys stand for
        self.cap = cap

    def __len__(self) -> int:
        return self._size

    def _held_prefix(self, keys: Sequence[int]) -> int:
        """How many leading ``keys`` are in the union (a prefix of them, the union being
        prefix-closed)."""
        ends, kids = self._ends, self._kids
        if not keys or (keys[0] not in kids and keys[0] not in ends):
            return 0
        if keys[-1] in kids or keys[-1] in ends:
            return len(keys)
        return bisect_left(keys, True, key=lambda k: k not in kids and k not in ends)

    def pin(self, keys: Sequence[int]) -> tuple[int, int]:
        """One more holder of the leading blocks of the chain ``keys``; returns (blocks
        pinned, how many of them no one pinned before). Fewer than ``len(keys)`` only at the cap."""
        blocks = len(keys)
        chain = pin_keys(keys)
        held = self._held_prefix(chain)
        reach = covered(held, blocks) + max(self.cap - self._size, 0)
        m = len(chain) if reach >= blocks else max(held, reach // PIN_STRIDE)
        if m == 0:
            return 0, 0
        new = covered(m, blocks) - covered(held, blocks)
        if m > held:
            kids = self._kids
            if held:
                parent = chain[held - 1]
                kids[parent] = kids.get(parent, 0) + 1
            if m - 1 > held:
                kids.update(dict.fromkeys(chain[held:m - 1], 1))
            self._size += new
        last = chain[m - 1]
        self._ends[last] = self._ends.get(last, 0) + 1
        return covered(m, blocks), new

    def unpin(self, keys: Sequence[int]) -> int:
        """One holder fewer of the chain ``keys`` (exactly the blocks a booking pinned);
        returns how many of them no booking holds any more."""
        chain = pin_keys(keys)
        if not chain:
            return 0
        ends, kids = self._ends, self._kids
        j = len(chain) - 1
        last = chain[j]
        held = ends.get(last)
        if held is None:  # not pinned here (a repeated release): nothing to take back
            return 0
        if held > 1:
            ends[last] = held - 1
            return 0
        del ends[last]
        if last in kids:
            return 0
        while j > 0:
            parent = chain[j - 1]
            left = kids.get(parent, 0) - 1
            if left > 0:
                kids[parent] = left
                break
            kids.pop(parent, None)
            if parent in ends:
                break
            j -= 1
        freed = len(keys) - covered(j, len(keys))
        self._size -= freed
        return freed
