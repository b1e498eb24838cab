"""Filters drop candidates before scoring; a filter that would drop all keeps all."""

from __future__ import annotations

from collections.abc import Sequence

from router.scheduling.framework import RouteRequest, View


class BoundedLoadFilter:
    """Consistent-hashing-with-bounded-loads guard: skip an instance whose in-flight
    requests would exceed ``factor`` x the mean (and ``slack`` above it). However good the
    cache saving looks, no instance takes much more than its share, which caps the damage
    when the TTFT model's rates are wrong for the hardware at hand."""

    name = "bounded_load"

    def __init__(self, factor: float, slack: int) -> None:
        self._factor = factor
        self._slack = slack

    def keep(self, req: RouteRequest, views: Sequence[View]) -> list[View]:
        total = sum(v.load.requests for v in views) + 1  # count this request too
        mean = total / len(views)
        bound = max(self._factor * mean, mean + self._slack)
        return [v for v in views if v.load.requests + 1 <= bound]
