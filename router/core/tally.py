"""Counter and histogram samples added up in place, written to prometheus_client when read.

Why: a request records ~5 counter increments and ~4 histogram observations (decision,
time to first byte, latency, cached share). prometheus_client makes each a chain of
Python calls with a lock, and a histogram observation walks its buckets in a Python loop:
~5% of a small request's CPU (py-spy, docs/benchmarks.md). A tally adds the amount to a
float (a histogram: one ``bisect`` for the bucket) and the real child gets the sums when the
registry is collected (/metrics, ``get_sample_value``), so what a scrape reads is exact.

Single-process only: under ``serve --workers N`` the samples must reach the shared files
without waiting for this process's scrape, so :class:`router.core.metrics.Metrics` hands out
prometheus_client's children there. Writers and the flush share one lock (a test may read
the registry from another thread while the loop records).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric


class CounterTally:
    """``inc`` of a Counter child, summed until :meth:`flush`."""

    __slots__ = ("_child", "_pending", "_lock")

    def __init__(self, child: Any, lock: threading.Lock) -> None:
        self._child, self._pending, self._lock = child, 0.0, lock

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self._pending += amount

    def flush(self) -> None:
        pending, self._pending = self._pending, 0.0
        if pending:
            self._child.inc(pending)


class HistogramTally:
    """``observe`` of a Histogram child: per-bucket counts and the sum, until :meth:`flush`.

    Uses the child's ``_upper_bounds``, ``_buckets`` and ``_sum`` (prometheus_client's own
    fields; tests/core/test_tally.py compares the exposition with direct observations)."""

    __slots__ = ("_child", "_bounds", "_counts", "_sum", "_dirty", "_lock")

    def __init__(self, child: Any, lock: threading.Lock) -> None:
        self._child, self._lock = child, lock
        self._bounds: list[float] = list(child._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._dirty = False

    def observe(self, amount: float) -> None:
        # NaN falls in no bucket (as in prometheus_client, where no ``amount <= bound`` holds)
        bucket = bisect.bisect_left(self._bounds, amount) if amount == amount else -1
        with self._lock:
            self._sum += amount
            self._dirty = True
            if bucket >= 0:
                self._counts[bucket] += 1

    def flush(self) -> None:
        if not self._dirty:
            return
        counts, total = self._counts, self._sum
        self._counts, self._sum, self._dirty = [0] * len(counts), 0.0, False
        child = self._child
        child._sum.inc(total)
        for bucket, count in zip(child._buckets, counts):
            if count:
                bucket.inc(count)


Tally = CounterTally | HistogramTally


class FlushBeforeCollect:
    """A collector registered ahead of the metrics: collecting the registry flushes the tallies
    first. ``lock`` is the one every tally of ``tallies`` is given (``flush`` holds it)."""

    def __init__(self, tallies: Callable[[], Iterable[Tally]]) -> None:
        self._tallies = tallies
        self.lock = threading.Lock()

    def flush(self) -> None:
        with self.lock:
            for tally in self._tallies():
                tally.flush()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.flush()
        return iter(())
