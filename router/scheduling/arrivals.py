"""The arrival rate a policy sees: requests per second over its own recent decisions.

A plugin that prices what a route does to the requests arriving after it (placement.py's
copy externality) needs how many will arrive. The router's own decisions tell it: a
smoothed mean of the gaps between distinct requests, from each request's arrival time
(``RouteRequest.arrived_s``: monotonic live, the virtual time in a replay, so a replay is
as deterministic as before; a request without one, such as /debug/route's, is not an
arrival). With several router replicas each sees its own share of the arrivals, so the
rate is a lower bound there.
"""

from __future__ import annotations


class ArrivalRate:
    """Exponentially weighted mean gap between requests, per ``tick``. A request priced
    twice (a shared store's revise) ticks once; a gap is capped at ``max_gap_s`` so one
    idle hour does not take a hundred requests to forget."""

    def __init__(self, smoothing: float = 0.05, max_gap_s: float = 60.0) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError("smoothing must be in (0, 1]")
        self._smoothing = smoothing
        self._max_gap = max_gap_s
        self._last_at: float | None = None
        self._last_id: str | None = None
        self._gap: float | None = None

    def tick(self, request_id: str, now: float) -> None:
        """``request_id`` arrived at ``now`` (seconds on any one clock)."""
        if request_id == self._last_id:
            return
        self._last_id = request_id
        if self._last_at is not None:
            gap = min(self._max_gap, max(0.0, now - self._last_at))
            self._gap = gap if self._gap is None else self._gap + self._smoothing * (gap - self._gap)
        self._last_at = now

    def per_second(self) -> float:
        """Requests per second; 0 until two requests were seen (nothing known yet)."""
        gap = self._gap
        if gap is None:
            return 0.0
        return 1.0 / gap if gap > 1e-9 else 1e9
