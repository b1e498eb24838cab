"""The blocks pinned by requests in flight on one instance: booked KV as a union.

An engine shares a cached block between every running request whose prompt starts with
it, and frees it only when the last of them ends. So the KV booked on an instance is the
union of the blocks of its requests in flight (a tenant's prefix counted once, however many
of its requests run) plus what each request holds alone (its prompt's tail beyond the
block keys and its output). Booking the KV a request adds (prompt - cached + output) loses
a shared prefix from the booked KV as soon as the request that brought it ends, while its
sharers still pin it; booking every request's whole prompt counts the prefix once per
request in flight. Both lie about the room an engine has.

A ``PinCounts`` counts, per block key, the bookings in flight on one instance that hold
it. It is bounded by ``cap`` distinct keys (the instance's residency capacity in blocks:
an engine cannot keep more blocks for running requests than its cache holds). A booking
pins its prompt's leading keys; at the cap it pins no further key (the first key that
would be new stops it), and the rest of its prompt is booked as its own KV, counted per
request and released with it: the cap costs accuracy, never a leak. A release unpins
exactly the keys its booking pinned, and never takes a count below zero (a key no longer
counted, because the table was dropped with its instance, is skipped).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class PinCounts:
    __slots__ = ("_counts", "cap")

    def __init__(self, cap: int) -> None:
        self._counts: Counter[int] = Counter()
        self.cap = cap

    def __len__(self) -> int:
        return len(self._counts)

    def count(self, key: int) -> int:
        """Bookings in flight holding ``key`` (0 when none)."""
        return self._counts.get(key, 0)

    def pin(self, keys: Sequence[int]) -> tuple[int, int]:
        """Count one more holder of the leading ``keys``; returns (keys pinned, how many of
        them were pinned by no one before). Fewer than ``len(keys)`` only at the cap."""
        counts = self._counts
        before = len(counts)
        if before + len(keys) <= self.cap:  # the common case: Counter.update counts in C
            counts.update(keys)
            return len(keys), len(counts) - before
        new = 0
        for n, key in enumerate(keys):
            held = counts.get(key)
            if held is None:
                if len(counts) >= self.cap:
                    return n, new
                counts[key] = 1
                new += 1
            else:
                counts[key] = held + 1
        return len(keys), new

    def unpin(self, keys: Sequence[int]) -> int:
        """One holder fewer of each of ``keys`` (those a booking pinned); returns how many
        of them no booking holds any more."""
        counts = self._counts
        freed = 0
        for key in keys:
            held = counts.get(key)
            if held is None:  # not counted here (dropped with the instance): nothing to take back
                continue
            if held <= 1:
                del counts[key]
                freed += 1
            else:
                counts[key] = held - 1
        return freed
