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
the keys of a chain at fixed positions (the grid) and its last one, each standing for the
blocks since the previous one (the same weight in every chain, a key's position being fixed by
the chaining). The grid is every ``PIN_STRIDE``-th block up to ``PIN_FINE``, then
``PIN_PER_OCTAVE`` keys per doubling of the position (block 256-512 every 16th, 512-1024 every
32nd, ...): a booking of a 512-block prompt touches 48 keys, not 512, a 2,048-block one 80,
not 256 (each of those cost the Redis store a field written at the booking and deleted at the
release: ~250 of the ~540 us redis-server spent per 128K-token decision and release). The
union is over-counted by less than one grid step per distinct chain end in flight, at most
1/16 of the blocks before it (never under-counted). Each key in it stores how many bookings'
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

# router/state/lua/pins.lua has its own copy of these three (a test checks they agree)
PIN_STRIDE = 8  # the grid's step up to PIN_FINE blocks
PIN_FINE = 256
PIN_PER_OCTAVE = 16  # grid keys per doubling of the position beyond PIN_FINE
_FINE_KEYS = PIN_FINE // PIN_STRIDE


def grid_count(blocks: int) -> int:
    """How many grid positions are at most ``blocks`` (1-based)."""
    if blocks <= PIN_FINE:
        return max(blocks, 0) // PIN_STRIDE
    count, lo = _FINE_KEYS, PIN_FINE
    while blocks >= 2 * lo:
        count += PIN_PER_OCTAVE
        lo *= 2
    return count + (blocks - lo) // (lo // PIN_PER_OCTAVE)


def grid_pos(t: int) -> int:
    """The ``t``-th grid position (1-based)."""
    if t <= _FINE_KEYS:
        return t * PIN_STRIDE
    t, lo = t - _FINE_KEYS, PIN_FINE
    while t > PIN_PER_OCTAVE:
        t -= PIN_PER_OCTAVE
        lo *= 2
    return lo + t * (lo // PIN_PER_OCTAVE)


def pin_keys(keys: Sequence[int]) -> list[int]:
    """The keys of a chain that are pinned: those at grid positions, and the last."""
    n = len(keys)
    sampled = list(keys[PIN_STRIDE - 1:PIN_FINE:PIN_STRIDE])
    lo = PIN_FINE
    while lo < n:  # each octave (lo, 2 lo] at its step
        step = lo // PIN_PER_OCTAVE
        sampled += keys[lo + step - 1:2 * lo:step]
        lo *= 2
    if n and grid_pos(len(sampled)) != n:  # the last block is off the grid
        sampled.append(keys[-1])
    return sampled


def covered(samples: int, blocks: int) -> int:
    """Blocks stood for by the first ``samples`` pinned keys of a ``blocks``-block chain."""
    return min(grid_pos(samples), blocks)


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
        m = len(chain) if reach >= blocks else max(held, grid_count(reach))
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
