"""``serve --workers N``: a worker's plain metrics copied into prometheus_client's multiprocess files.

Part of the core layer (router/core). Each worker records into router/core/plain_metrics.py's
children like a single process does; :meth:`MultiprocessExport.export` (every second, and by
the worker answering a scrape just before it reads the files) adds what each counter, summed
gauge and histogram bucket gained since the last copy to this worker's files, and writes the
"most recent" gauges set since then. prometheus_client's ``MultiProcessCollector`` then sums every worker's files as before
(gauges by their ``multiprocess_mode``), so the exposition is the one prometheus_client's own
multiprocess metrics gave; another worker's samples are at most one export old.

Histogram buckets are written through ``values.ValueClass``, the value class prometheus_client's
own ``Histogram`` writes each bucket with (there is no public way to add n observations to a
bucket at once); the files' layout is prometheus_client's (one value per bucket, not cumulative).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, values

from router.core.plain_metrics import AnyFamily, CounterChild, GaugeChild, HistogramChild, PlainCounter, PlainGauge, PlainHistogram


Child = CounterChild | GaugeChild | HistogramChild


class _Copied:
    """One series and what of it the files already hold.

    A "most recent" gauge is written when it was set since the last copy (the file stamps it
    then: the worker that set it last wins); every other series adds its change, as the files'
    values grew under prometheus_client's own inc/dec/observe, also after ``forget_engine``."""

    __slots__ = ("child", "targets", "written", "most_recent")

    def __init__(self, child: Child, targets: list[Any], most_recent: bool) -> None:
        self.child, self.targets, self.most_recent = child, targets, most_recent
        self.written: list[float] | None = None

    def push(self) -> None:
        child = self.child
        if isinstance(child, GaugeChild) and self.most_recent:
            if self.written is None or self.written[0] != child.sets:
                self.targets[0].set(child.value)
            self.written = [child.sets]
            return
        now = [child.value] if not isinstance(child, HistogramChild) else [*child.counts, child.sum]
        before = self.written or [0.0] * len(now)
        for target, value, old in zip(self.targets, now, before):
            if value != old:
                target.inc(value - old)
        self.written = now


class MultiprocessExport:
    """Copies ``families`` into the multiprocess files; ``registry`` takes the mirror metrics
    (not the served registry: that one reads the files)."""

    def __init__(self, families: Sequence[AnyFamily], registry: CollectorRegistry) -> None:
        self._families = families
        self._mirrors: dict[str, Counter | Gauge] = {}
        for family in families:
            if isinstance(family, PlainCounter):
                self._mirrors[family.name] = Counter(family.name, family.documentation, family.labelnames,
                                                     registry=registry)
            elif isinstance(family, PlainGauge):
                self._mirrors[family.name] = Gauge(family.name, family.documentation, family.labelnames,
                                                   multiprocess_mode=family.multiprocess_mode, registry=registry)
        self._copied: dict[tuple[str, tuple[str, ...]], _Copied] = {}

    def _targets(self, family: AnyFamily, key: tuple[str, ...]) -> list[Any]:
        if not isinstance(family, PlainHistogram):
            return [self._mirrors[family.name].labels(*key)]
        name, doc, names = family.name, family.documentation, family.labelnames
        buckets = [values.ValueClass("histogram", name, name + "_bucket", (*names, "le"), (*key, le), doc)
                   for le in family.le]
        return [*buckets, values.ValueClass("histogram", name, name + "_sum", names, key, doc)]

    def export(self) -> None:
        """Write what changed since the last call. A series dropped by ``forget_engine`` keeps
        what the files hold (as prometheus_client's own multiprocess metrics do); recorded again,
        it adds to it."""
        copied: dict[tuple[str, tuple[str, ...]], _Copied] = {}
        for family in self._families:
            children: dict[tuple[str, ...], Child] = family.children  # type: ignore[assignment]  # a union of dicts
            for key, child in list(children.items()):
                entry = self._copied.get((family.name, key))
                if entry is None:
                    most_recent = "mostrecent" in getattr(family, "multiprocess_mode", "")
                    entry = _Copied(child, self._targets(family, key), most_recent)
                elif entry.child is not child:  # forgotten, then recorded again: starts from zero
                    entry.child, entry.written = child, None
                entry.push()
                copied[(family.name, key)] = entry
        self._copied = copied  # bounded by the live series
