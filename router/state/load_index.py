"""Instances with booked load, kept in order of a request-independent load key.

Why: a decision that scores every instance grows with the cluster. Candidate pruning
(router/scheduling/prune.py) scores only the holders of the prompt's first block plus the
few least-loaded instances, and needs those without a scan: this index is updated on every
booking change (a bisect into a sorted list: O(log n) compares, one memmove), and read in
ascending key order. Idle instances are not in it: their key is 0, the least of all.
The order is built on its first read and kept from then on: a pool too small to prune (at
most twice the candidates kept) never reads it, and its decisions pay no bisect per booking
change.

The key, ``prefill_tokens + requests * request_tokens``, orders non-holders exactly as the
ttft scorer does for instances of one prefill rate: their estimates differ only by booked
prefill tokens / rate + decode interference x requests, and ``request_tokens`` is that
interference in tokens (interference seconds x rate).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from typing import Protocol


class Booked(Protocol):
    """What the index reads of a ``router.state.base.Load`` (a protocol: base imports this module)."""

    @property
    def requests(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def kv_tokens(self) -> int: ...
    @property
    def transfers(self) -> int: ...


class LoadIndex:
    def __init__(self, request_tokens: float = 16.0) -> None:
        self._request_tokens = request_tokens
        self._order: list[tuple[float, str]] | None = None  # (key, instance) ascending, once first read
        self._key: dict[str, float] = {}
        self._requests: dict[str, int] = {}
        self.total_requests = 0  # in flight over every instance in the index
        # Counts instances entering or leaving the index (not key changes): a reader that
        # derived something from the set of loaded instances (prune.py: "are they all in my
        # pool") keeps it while this is unchanged.
        self.membership = 0

    def update(self, instance: str, load: Booked | None) -> None:
        """``instance`` now carries ``load`` (None or idle: it leaves the index)."""
        old = self._key.pop(instance, None)
        order = self._order
        if old is not None:
            if order is not None:
                del order[bisect_left(order, (old, instance))]
            self.total_requests -= self._requests.pop(instance)
        if load is None or (load.requests == 0 and load.prefill_tokens == 0 and load.kv_tokens == 0 and load.transfers == 0):
            if old is not None:
                self.membership += 1
            return
        if old is None:
            self.membership += 1
        key = load.prefill_tokens + load.requests * self._request_tokens
        self._key[instance] = key
        self._requests[instance] = load.requests
        self.total_requests += load.requests
        if order is not None:
            insort(order, (key, instance))

    def ascending(self) -> Iterator[str]:
        """Loaded instances, least key first."""
        order = self._order
        if order is None:  # the first read: from here on every update keeps it sorted
            order = self._order = sorted([(key, instance) for instance, key in self._key.items()])
        return (instance for _, instance in order)

    @property
    def loaded(self) -> Mapping[str, float]:
        """Instance -> key, for every instance with booked load."""
        return self._key

    def requests(self, instance: str) -> int:
        return self._requests.get(instance, 0)
