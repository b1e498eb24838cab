"""The store tier's bookings in flight: loads moving, and where they land.

Why a module of its own: both are read on every decision with a store tier, and a scan of
every booking (up to ``capacity`` of them) on each would be per-request work that grows
with the traffic. Here each booking is touched twice, when it is booked and when it expires
(a heap by its end), and a decision reads aggregates: the backlog as two running sums, the
landings of only the instances it prices. Bounded: at ``capacity`` bookings the one ending
soonest goes first, which is the one that would expire next anyway.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping


class LoadBook:
    """Loads still moving, each draining evenly over its expected duration.

    The seconds of bytes they have left at ``now`` is sum(s * (end - now) / (end - start)),
    kept as two sums (sum(s * end / d) and sum(s / d), d = end - start) updated as loads are
    booked and expire; both reset when none is left, so float drift never outlives a quiet
    moment."""

    __slots__ = ("capacity", "_heap", "_seq", "_at_end", "_per_s")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._heap: list[tuple[float, int, float, float]] = []  # (end, seq, s * end / d, s / d)
        self._seq = 0
        self._at_end = 0.0
        self._per_s = 0.0

    def add(self, start: float, end: float, alone_s: float) -> None:
        """A load of ``alone_s`` seconds alone, moving from ``start`` to ``end``."""
        if end <= start:
            return  # ends as it starts: nothing left to share at any later time
        if len(self._heap) >= self.capacity:
            self._pop()
        d = end - start
        at_end, per_s = alone_s * end / d, alone_s / d
        self._seq += 1
        heapq.heappush(self._heap, (end, self._seq, at_end, per_s))
        self._at_end += at_end
        self._per_s += per_s

    def in_flight(self, now: float) -> tuple[int, float]:
        """Loads still moving at ``now``, and the seconds of bytes they have left."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            self._pop()
        if not heap:
            return 0, 0.0
        return len(heap), max(0.0, self._at_end - now * self._per_s)

    def _pop(self) -> None:
        _end, _seq, at_end, per_s = heapq.heappop(self._heap)
        if self._heap:
            self._at_end -= at_end
            self._per_s -= per_s
        else:
            self._at_end = self._per_s = 0.0


class LandingBook:
    """Per instance, when the loads booked there are expected ready for their last token."""

    __slots__ = ("capacity", "_heap", "_seq", "_by_instance")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._heap: list[tuple[float, int, str]] = []  # (ready at, seq, instance): expiry order
        self._seq = 0
        self._by_instance: dict[str, list[float]] = {}  # ready times, booking order

    def add(self, ready_at: float, instance: str) -> None:
        if len(self._heap) >= self.capacity:
            self._pop()
        self._seq += 1
        heapq.heappush(self._heap, (ready_at, self._seq, instance))
        self._by_instance.setdefault(instance, []).append(ready_at)

    def pending(self, now: float) -> Landings:
        """The landings after ``now``, read lazily per instance."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            self._pop()
        return Landings(self._by_instance, now)

    def __len__(self) -> int:
        return len(self._heap)

    def _pop(self) -> None:
        ready, _seq, instance = heapq.heappop(self._heap)
        times = self._by_instance[instance]
        if len(times) == 1:
            del self._by_instance[instance]
        else:
            times.remove(ready)


class Landings(Mapping[str, tuple[float, ...]]):
    """``{instance: seconds from now until each landing}``, for the instances with one
    pending; an instance's times are computed when it is read (a decision reads only its
    candidates'). A snapshot of ``now``: read it within the decision that made it."""

    __slots__ = ("_by_instance", "_now")

    def __init__(self, by_instance: Mapping[str, list[float]], now: float) -> None:
        self._by_instance = by_instance
        self._now = now

    def __getitem__(self, instance: str) -> tuple[float, ...]:
        now = self._now
        return tuple(t - now for t in self._by_instance[instance] if t > now)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_instance)

    def __len__(self) -> int:
        return len(self._by_instance)
