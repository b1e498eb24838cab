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
    __slots__ = ("_nodes", "cap")

    def __init__(self, cap: int) -> None:
        # key -> [pinned chains ending here, children in the union]
        self._nodes: dict[int, list[int]] = {}
        self.cap = cap

    def __len__(self) -> int:
        return len(self._nodes)

    def _held_prefix(self, keys: Sequence[int]) -> int:
        """How many leading ``keys`` are in the union (a prefix of them, the union being
        prefix-closed)."""
        nodes = self._nodes
        if not keys or keys[0] not in nodes:
            return 0
        if keys[-1] in nodes:
            return len(keys)
        return bisect_left(keys, True, key=lambda k: k not in nodes)

    def pin(self, keys: Sequence[int]) -> tuple[int, int]:
        """One more holder of the leading ``keys``; returns (keys pinned, how many of them
        were pinned by no one before). Fewer than ``len(keys)`` only at the cap."""
        nodes = self._nodes
        held = self._held_prefix(keys)
        n = min(len(keys), held + max(self.cap - len(nodes), 0))
        if n == 0:
            return 0, 0
        if n > held:
            if held:
                nodes[keys[held - 1]][1] += 1
            for j in range(held, n - 1):
                nodes[keys[j]] = [0, 1]
            nodes[keys[n - 1]] = [0, 0]
        nodes[keys[n - 1]][0] += 1
        return n, n - held

    def unpin(self, keys: Sequence[int]) -> int:
        """One holder fewer of the chain ``keys`` (exactly what a booking pinned); returns
        how many of them no booking holds any more."""
        nodes = self._nodes
        j = len(keys) - 1
        end = nodes.get(keys[j]) if j >= 0 else None
        if end is None or end[0] <= 0:  # not pinned here (a repeated release): nothing to take back
            return 0
        end[0] -= 1
        freed = 0
        while j >= 0:
            node = nodes.get(keys[j])
            if node is None or node[0] or node[1]:
                break
            del nodes[keys[j]]
            freed += 1
            j -= 1
            if j >= 0 and (parent := nodes.get(keys[j])) is not None:
                parent[1] -= 1
        return freed
