"""Prometheus view of ingestion: read from plain counters at scrape time.

The hot path only bumps integer attributes (a labelled Prometheus counter costs about a
microsecond per call, too much at 100k events/s); this collector sums them per instance
when ``/metrics`` is scraped."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from router.kvevents.ingest import KVEventIngest
from router.kvevents.sidecar import SidecarIngest
from router.state.precise_store import PreciseStore
from router.state.shared_mirror import segment_bytes

_BLOCK_OPS = ("stored_blocks", "removed_blocks", "orphans", "refused", "unknown_removals")
_STREAM = ("gaps", "restarts", "malformed", "duplicates", "replays", "replays_failed", "resyncs", "dropped_pending")


class KVEventsCollector:
    def __init__(self, ingest: KVEventIngest, store: PreciseStore) -> None:
        self._ingest = ingest
        self._store = store

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily("pd_router_kv_events", "KV events applied, by instance", labels=["engine"])
        batches = CounterMetricFamily("pd_router_kv_event_batches", "KV-event batches received", labels=["engine"])
        blocks = CounterMetricFamily("pd_router_kv_event_blocks", "Engine blocks in KV events by outcome",
                                     labels=["engine", "op"])
        stream = CounterMetricFamily("pd_router_kv_event_stream", "Sequence and resync happenings of KV-event streams",
                                     labels=["engine", "kind"])
        sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for source in self._ingest.sources:
            acc = sums[source.spec.instance]
            acc["events"] += source.writer.counters.events
            acc["batches"] += source.counters.batches
            for op in _BLOCK_OPS:
                acc[op] += getattr(source.writer.counters, op)
            for kind in _STREAM:
                acc[kind] += getattr(source.counters, kind)
        for inst, acc in sums.items():
            events.add_metric([inst], acc["events"])
            batches.add_metric([inst], acc["batches"])
            for op in _BLOCK_OPS:
                blocks.add_metric([inst, op.removesuffix("_blocks")], acc[op])
            for kind in _STREAM:
                stream.add_metric([inst, kind], acc[kind])
        yield from (events, batches, blocks, stream)

        residency = self._ingest.residency
        fresh = GaugeMetricFamily("pd_router_kv_residency_fresh",
                                  "1 when an instance's residency comes from its KV events, 0 when it falls back to "
                                  "routing history", labels=["engine"])
        held = GaugeMetricFamily("pd_router_kv_residency_blocks", "Engine blocks the KV events say an instance holds",
                                 labels=["engine"])
        overflow = CounterMetricFamily("pd_router_kv_residency_overflow",
                                       "Engine blocks forgotten because an instance's table was full", labels=["engine"])
        for inst in residency.instances():
            tables = residency.tables(inst).values()
            fresh.add_metric([inst], 1 if residency.is_fresh(inst) else 0)
            held.add_metric([inst], sum(len(t) for t in tables))
            overflow.add_metric([inst], sum(t.overflow for t in tables))
        lookups = CounterMetricFamily("pd_router_kv_residency_lookups",
                                      "Candidate residency lookups by where the answer came from", labels=["source"])
        lookups.add_metric(["events"], self._store.precise_lookups)
        lookups.add_metric(["history"], self._store.fallback_lookups)
        errors = CounterMetricFamily("pd_router_kv_event_receive_errors", "KV-event messages that could not be handled")
        errors.add_metric([], self._ingest.receive_errors)
        yield from (fresh, held, overflow, lookups, errors)
        if isinstance(self._ingest, SidecarIngest):
            restarts = CounterMetricFamily("pd_router_kv_sidecar_restarts",
                                           "Times the KV-event sidecar process died and was started again")
            restarts.add_metric([], self._ingest.restarts)
            yield restarts
            if self._ingest.mirror == "shared":
                shared = GaugeMetricFamily("pd_router_kv_shared_table_bytes",
                                           "Shared memory of an instance's tables, mapped by the router and its sidecar "
                                           "(present once, counted in both processes' RSS)", labels=["engine"])
                for inst in residency.instances():
                    shared.add_metric([inst], segment_bytes(residency.tables(inst).values()))
                yield shared
