"""Counters, gauges and histograms kept as plain numbers, rendered by a collector at scrape time.

Part of the core layer (router/core). A request records ~11 samples; through prometheus_client
each one takes a lock and goes through its value class (8% of a request's instructions). Here a
record is one attribute update on a child with slots, and :class:`PlainCollector` turns the
numbers into the same families prometheus_client would have produced: names, labels, types,
buckets, ``_created`` samples and the order of series (first recorded first). Under
``serve --workers N`` the numbers are copied into prometheus_client's multiprocess files by
router/core/plain_export.py.

Single-threaded by design: every record happens on the event loop that also serves /metrics.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, Literal, TypeVar

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

INF = float("inf")
MultiprocessMode = Literal["all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent",
                           "livemostrecent"]


def created_series() -> bool:
    """Whether ``_created`` samples are exported (prometheus_client's own switch, same variable)."""
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class CounterChild:
    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    """``sets`` counts ``set`` calls: a "most recent" gauge is copied out when it was set again."""

    __slots__ = ("value", "sets")

    def __init__(self) -> None:
        self.value = 0.0
        self.sets = 0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)
        self.sets += 1


class HistogramChild:
    """``counts[i]`` is the number of observations in bucket i alone (not cumulative)."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount == amount:  # NaN falls in no bucket (prometheus_client: amount <= bound is never true)
            self.counts[bisect_left(self.bounds, amount)] += 1.0


C = TypeVar("C", CounterChild, GaugeChild, HistogramChild)


class PlainFamily(Generic[C]):
    """A metric and its labelled children, in the order they were first recorded."""

    type = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.children: dict[tuple[str, ...], C] = {}

    def _new(self) -> C:
        raise NotImplementedError

    def labels(self, *values: object) -> C:
        key = tuple(map(str, values))
        child = self.children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(key)}")
            child = self.children[key] = self._new()
        return child

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        """Drop every series whose labels include ``labels`` (prometheus_client's rule)."""
        unknown = set(labels) - set(self.labelnames)
        if unknown:
            raise ValueError(f"{self.name}: unknown label names {sorted(unknown)}")
        where = {self.labelnames.index(k): str(v) for k, v in labels.items()}
        for key in [k for k in self.children if all(k[i] == v for i, v in where.items())]:
            del self.children[key]

    def collect(self, created: bool) -> Metric:
        metric = Metric(self.name, self.documentation, self.type)
        for key, child in list(self.children.items()):
            self._samples(metric, dict(zip(self.labelnames, key)), child, created)
        return metric

    def _samples(self, metric: Metric, labels: dict[str, str], child: C, created: bool) -> None:
        raise NotImplementedError


class PlainCounter(PlainFamily[CounterChild]):
    type = "counter"

    def _new(self) -> CounterChild:
        return CounterChild()

    def _samples(self, metric: Metric, labels: dict[str, str], child: CounterChild, created: bool) -> None:
        metric.add_sample(self.name + "_total", labels, child.value)
        if created:
            metric.add_sample(self.name + "_created", labels, child.created)


class PlainGauge(PlainFamily[GaugeChild]):
    """``multiprocess_mode`` says how workers' values combine (prometheus_client's modes)."""

    type = "gauge"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 multiprocess_mode: MultiprocessMode = "all") -> None:
        super().__init__(name, documentation, labelnames)
        self.multiprocess_mode = multiprocess_mode

    def _new(self) -> GaugeChild:
        return GaugeChild()

    def _samples(self, metric: Metric, labels: dict[str, str], child: GaugeChild, created: bool) -> None:
        metric.add_sample(self.name, labels, child.value)


class PlainHistogram(PlainFamily[HistogramChild]):
    type = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 buckets: Iterable[float] = ()) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or not bounds:
            raise ValueError(f"{self.name}: buckets must be sorted and not empty")
        if bounds[-1] != INF:
            bounds.append(INF)
        self.bounds = tuple(bounds)
        self.le: tuple[str, ...] = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]  # untyped upstream

    def _new(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _samples(self, metric: Metric, labels: dict[str, str], child: HistogramChild, created: bool) -> None:
        acc = 0.0
        for le, count in zip(self.le, child.counts):
            acc += count
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
        metric.add_sample(self.name + "_count", labels, acc)
        if self.bounds[0] >= 0:
            metric.add_sample(self.name + "_sum", labels, child.sum)
        if created:
            metric.add_sample(self.name + "_created", labels, child.created)


AnyFamily = PlainCounter | PlainGauge | PlainHistogram


class PlainCollector:
    """The families, rendered in the order given (a registry keeps collectors in register order)."""

    def __init__(self, families: Sequence[AnyFamily]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        created = created_series()
        for family in self.families:
            yield family.collect(created)
