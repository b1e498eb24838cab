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
holding a block holds the blocks before it, and the union is closed under prefixes. Each key
in it stores how many bookings' pinned chains end there and how many of its children are in
the union; a block is held while either is non-zero. So a booking touches only the blocks it
is the first to pin (found by bisecting the prefix already in the union) and a release only
the blocks it frees, whereas counting holders per block made every release walk the whole
prompt (a 512-block prompt: ~250 us). It is bounded by ``cap`` distinct keys (the instance's
residency capacity in blocks: an engine cannot keep more blocks for running requests than
its cache holds). A booking pins its prompt's leading keys; at the cap it pins no further
key (the first key that would be new stops it), and the rest of its prompt is booked as its
own KV, counted per request and released with it: the cap costs accuracy, never a leak. A
release unpins exactly the chain its booking pinned and never takes a count below zero.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class PinCounts:
    __slots__ = ("_ends", "_kids", "_size", "cap")

    def __init__(self, cap: int) -> None:
        # a key is in the union while it is in either map: pinned chains ending at it, and
        # its children in the union (two maps, so a new chain's blocks go in with one C call)
        self._ends: dict[int, int] = {}
        self._kids: dict[int, int] = {}
        self._size = 0
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
        """One more holder of the leading ``keys``; returns (keys pinned, how many of them
        were pinned by no one before). Fewer than ``len(keys)`` only at the cap."""
        held = self._held_prefix(keys)
        n = min(len(keys), held + max(self.cap - self._size, 0))
        if n == 0:
            return 0, 0
        if n > held:
            kids = self._kids
            if held:
                parent = keys[held - 1]
                kids[parent] = kids.get(parent, 0) + 1
            if n - 1 > held:
                kids.update(dict.fromkeys(keys[held:n - 1], 1))
            self._size += n - held
        last = keys[n - 1]
        self._ends[last] = self._ends.get(last, 0) + 1
        return n, n - held

    def unpin(self, keys: Sequence[int]) -> int:
        """One holder fewer of the chain ``keys`` (exactly what a booking pinned); returns
        how many of them no booking holds any more."""
        if not keys:
            return 0
        ends, kids = self._ends, self._kids
        j = len(keys) - 1
        last = keys[j]
        held = ends.get(last)
        if held is None:  # not pinned here (a repeated release): nothing to take back
            return 0
        if held > 1:
            ends[last] = held - 1
            return 0
        del ends[last]
        if last in kids:
            return 0
        freed = 1
        while j > 0:
            j -= 1
            parent = keys[j]
            left = kids.get(parent, 0) - 1
            if left > 0:
                kids[parent] = left
                break
            kids.pop(parent, None)
            if parent in ends:
                break
            freed += 1
        self._size -= freed
        return freed
