"""Prometheus metrics, on a registry owned by one app (no process-global state).

Per-engine series carry the label ``engine`` (the instance id). Not ``instance``: Prometheus
sets it on every scraped series to the scrape target and would rename ours to
``exported_instance``; nor ``endpoint``, which a Prometheus Operator ServiceMonitor sets to the
scraped port's name (also ``namespace``, ``service``, ``pod``, ``container``, ``job``). Under ``serve --workers N`` the samples live in prometheus_client's
multiprocess files and ``registry`` serves their sum (see router/core/exposition.py).

The request path records into plain numbers (router/core/plain_metrics.py): rendered by a
collector at scrape time, or copied into the multiprocess files (router/core/plain_export.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector

from router.core.exposition import BuildInfo, WorkerProcesses, multiprocess_dir
from router.core.plain_export import MultiprocessExport
from router.core.plain_metrics import AnyFamily, CounterChild, GaugeChild, HistogramChild, PlainCollector, PlainCounter, PlainGauge, PlainHistogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)

StoreCounters = Callable[[], dict[str, int]]
_STORE_COUNTERS = (
    ("round_trips", "Network round trips made by the state store"),
    ("corrections", "Decisions moved after the shared view disagreed with the local one"),
    ("revisions", "Decisions whose policy ran again on news a round trip brought (another replica's load, residency)"),
    ("errors", "State store calls that failed (decisions fell back to the local view)"),
)


class _StoreCounters:
    """Exports counters the state store keeps as plain attributes, read at scrape time."""

    def __init__(self, read: StoreCounters) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        values = self._read()
        for name, help_text in _STORE_COUNTERS:
            family = CounterMetricFamily(f"pd_router_state_{name}", help_text)
            family.add_metric([], values.get(name, 0))
            yield family
        degraded = GaugeMetricFamily("pd_router_state_degraded",
                                     "1 while the state store's breaker is open (routing on the local view)")
        degraded.add_metric([], values.get("degraded", 0))
        yield degraded


class EngineSeries:
    """One engine's series a request records into, looked up once per engine rather than per
    record (a lookup cost about what the record itself does): in flight, first byte, what its
    decision expected cached, and requests and latency by (model, outcome), bounded as those are.
    Each child is made when first read, as ``labels()`` would (a series shows once recorded)."""

    __slots__ = ("inflight", "ttfb", "cached_ratio", "predicted_cached", "routed_prompt", "_metrics", "_engine",
                 "_outcomes")
    inflight: GaugeChild
    ttfb: HistogramChild
    cached_ratio: HistogramChild
    predicted_cached: CounterChild
    routed_prompt: CounterChild

    def __init__(self, metrics: Metrics, engine: str) -> None:
        self._metrics, self._engine = metrics, engine
        self._outcomes: dict[tuple[str, str], tuple[CounterChild, HistogramChild]] = {}

    def __getattr__(self, name: str) -> Any:  # only for a slot not set yet
        if name not in _ENGINE_CHILDREN:
            raise AttributeError(name)
        child = getattr(self._metrics, name).labels(self._engine)
        setattr(self, name, child)
        return child

    def outcome(self, model: str, outcome: str) -> tuple[CounterChild, HistogramChild]:
        """The ``requests`` and ``latency`` children of (this engine, ``model``, ``outcome``)."""
        pair = self._outcomes.get((model, outcome))
        if pair is None:
            m = self._metrics
            pair = self._outcomes[(model, outcome)] = (m.requests.labels(self._engine, model, outcome),
                                                       m.latency.labels(self._engine, model, outcome))
        return pair


_ENGINE_CHILDREN = frozenset(("inflight", "ttfb", "cached_ratio", "predicted_cached", "routed_prompt"))


class Metrics:
    """Every metric the router records. ``registry`` is what /metrics serves.

    ``multiprocess_path`` defaults to the directory prometheus_client writes to in this process
    (None outside ``serve --workers N``)."""

    def __init__(self, store_counters: StoreCounters | None = None, multiprocess_path: str | None = None) -> None:
        self.multiprocess_path = multiprocess_path or multiprocess_dir()
        self.generation = 0  # bumped when an engine's series are dropped (for caches of label children)
        self._children: dict[tuple[str, ...], Any] = {}
        self._engines: dict[str, EngineSeries] = {}
        self.registry = CollectorRegistry()
        # In multiprocess mode the metric objects only feed the shared files; the served
        # registry reads those files (all workers) rather than this process's objects.
        r = CollectorRegistry() if self.multiprocess_path else self.registry
        self.requests = PlainCounter(
            "pd_router_requests", "Proxied requests by engine, served model and outcome",
            ["engine", "model", "outcome"])
        self.latency = PlainHistogram(
            "pd_router_request_duration_seconds",
            "Whole request latency seen by the router",
            ["engine", "model", "outcome"],
            buckets=_LATENCY_BUCKETS)
        self.ttfb = PlainHistogram(
            "pd_router_time_to_first_byte_seconds",
            "Time from routing to the first response byte from the engine",
            ["engine"],
            buckets=_LATENCY_BUCKETS)
        self.decisions = PlainCounter(
            "pd_router_decisions", "Routing decisions by policy and deciding rule", ["policy", "reason"])
        self.cached_ratio = PlainHistogram(
            "pd_router_estimated_cached_prefix_ratio",
            "Estimated share of the prompt already cached on the engine that prefills it",
            ["engine"],
            buckets=(0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0))
        # Token-weighted, so increase(predicted) / increase(prompt) is the hit ratio the router
        # expects, to compare with pd_router_engine_prefix_cache_hit_ratio (what the engine measured).
        self.predicted_cached = PlainCounter(
            "pd_router_predicted_cached_tokens", "Prompt tokens the router expected the prefilling engine to have "
            "cached (matched blocks x residency confidence)", ["engine"])
        self.routed_prompt = PlainCounter(
            "pd_router_routed_prompt_tokens", "Prompt tokens routed to the engine that prefills them (router's count)",
            ["engine"])
        self.inflight = PlainGauge("pd_router_inflight_requests", "Requests in flight per engine", ["engine"],
                              multiprocess_mode="livesum")
        # Set by whichever worker answers a scrape, from its own health view: the latest wins.
        self.healthy = PlainGauge("pd_router_instance_healthy", "1 if the engine is considered healthy", ["engine"],
                             multiprocess_mode="livemostrecent")
        self.retries = PlainCounter(
            "pd_router_retries", "Attempts moved to another engine before the first byte", ["engine", "reason"])
        self.rejected = PlainCounter("pd_router_rejected", "Requests refused by the router itself", ["status"])
        self.api_key_requests = PlainCounter("pd_router_api_key_requests", "Inference requests by API key (its configured name)",
                                        ["key"])
        self.continuations = PlainCounter("pd_router_continuations", "Streams broken after their first token and continued "
                                     "elsewhere, by result (ok, failed, impossible, exhausted)", ["result"])
        self.standby_warms = PlainCounter("pd_router_standby_warms", "Warms of long streams' backup decode instances "
                                     "(kv_store.standby), by result (started, rearmed, ok, failed, timeout, "
                                     "cancelled, busy, no_backup)", ["result"])
        self.ejections = PlainCounter("pd_router_outlier_ejections", "Instances ejected by passive outlier detection",
                                 ["engine"])
        self.store_latency = PlainHistogram(
            "pd_router_state_store_seconds", "Latency of state store operations", ["op"], buckets=_FAST_BUCKETS)
        self.modes = PlainCounter(
            "pd_router_route_modes", "Decisions by route: colocated, disaggregated or decode_only", ["mode"])
        self.estimate_ratio = PlainHistogram(
            "pd_router_ttft_estimate_ratio",
            "Measured / estimated TTFT (streaming requests; prefill leg for vLLM PD)",
            ["mode"],
            buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4, 8))
        self.calibration = PlainGauge(
            "pd_router_calibration_factor", "Measured slowdown applied to an engine's prefill rate", ["engine"],
            multiprocess_mode="livemostrecent")
        self.token_ratio = PlainGauge(
            "pd_router_engine_token_ratio", "Engine tokens per router-estimated token, learned from answers' usage "
            "and the engines' prompt counts (character keys; set once measured)", ["engine"],
            multiprocess_mode="livemostrecent")
        self.token_windows = PlainCounter(
            "pd_router_token_ratio_windows", "Scrape windows of answers without usage set against the engine's own "
            "prompt count, by result: learned, or dropped (requests the router did not send, another model, a "
            "request that ended badly)", ["engine", "result"])
        self.pd_failures = PlainCounter(
            "pd_router_pd_failures", "Prefill legs that failed and what the router did about it", ["engine", "action"])
        self._store_read = store_counters
        self._store_exported: dict[str, int] = {}
        self._store_counters: dict[str, Counter] = {}
        self._export: MultiprocessExport | None = None
        families = self.families()
        if self.multiprocess_path:
            self._export = MultiprocessExport(families, r)
            self.registry.register(BuildInfo())
            MultiProcessCollector(self.registry, path=self.multiprocess_path)  # type: ignore[no-untyped-call]  # untyped upstream
            self.registry.register(WorkerProcesses(self.multiprocess_path))
            if store_counters is not None:
                self._store_counters = {
                    name: Counter(f"pd_router_state_{name}", help_text, registry=r) for name, help_text in _STORE_COUNTERS
                }
        else:
            self.registry.register(PlainCollector(families))
            self.registry.register(BuildInfo())
            ProcessCollector(registry=self.registry)
            if store_counters is not None:
                self.registry.register(_StoreCounters(store_counters))

    def families(self) -> tuple[AnyFamily, ...]:
        """Every metric this class records, in the order /metrics shows them."""
        return (self.requests, self.latency, self.ttfb, self.decisions, self.cached_ratio, self.predicted_cached,
                self.routed_prompt, self.inflight, self.healthy, self.retries, self.rejected, self.api_key_requests,
                self.continuations, self.standby_warms, self.ejections, self.store_latency, self.modes,
                self.estimate_ratio, self.calibration, self.token_ratio, self.token_windows, self.pd_failures)

    def forget_engine(self, engine: str) -> None:
        """Drop the series of an engine that left the pool (discovery, admin API), so that its
        last health and load values are not reported forever. In multiprocess mode the values
        already written to the shared files stay until the workers restart (so what this worker
        recorded since its last copy is copied first)."""
        if self._export is not None:
            self._export.export()
        self.generation += 1  # whoever caches label children drops them
        self._children.clear()
        self._engines.clear()
        for metric in self.per_engine():
            metric.remove_by_labels({"engine": engine})

    def per_engine(self) -> tuple[AnyFamily, ...]:
        """The metrics labelled by ``engine`` (a test checks that none is missing)."""
        return (self.requests, self.latency, self.ttfb, self.cached_ratio, self.predicted_cached, self.routed_prompt,
                self.inflight, self.healthy, self.retries, self.ejections, self.calibration, self.token_ratio,
                self.token_windows, self.pd_failures)

    def exposition(self) -> bytes:
        """What /metrics serves (in multiprocess mode, this worker's samples copied out first)."""
        self.export()
        return generate_latest(self.registry)

    def child(self, name: str, *labels: str) -> Any:
        """``getattr(self, name).labels(*labels)``, kept: ``labels()`` was ~3% of a request's CPU.

        Bounded as the series themselves are (engines x outcomes, policies x reasons); dropped
        with an engine's series by :meth:`forget_engine`."""
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self, name).labels(*labels)
        return child

    def engine(self, engine: str) -> EngineSeries:
        """The series of ``engine`` a request records into (dropped by :meth:`forget_engine`)."""
        series = self._engines.get(engine)
        if series is None:
            series = self._engines[engine] = EngineSeries(self, engine)
        return series

    def decided(self, policy: str, reason: str, mode: str) -> tuple[HistogramChild, CounterChild, CounterChild]:
        """The decision's ``store_latency`` ("decide"), ``decisions`` and ``modes`` children."""
        key = ("\0decided", policy, reason, mode)  # no metric is named so: apart from child()'s keys
        series: tuple[HistogramChild, CounterChild, CounterChild] | None = self._children.get(key)
        if series is None:
            series = self._children[key] = (self.store_latency.labels("decide"), self.decisions.labels(policy, reason),
                                            self.modes.labels(mode))
        return series

    def export(self) -> None:
        """Multiprocess mode: add what this worker recorded since the last call to the shared files.

        The metrics and the store keep plain numbers that only this process can read at scrape
        time, so each worker copies them out (``export_forever``) for any worker's scrape to sum."""
        if self._export is not None:
            self._export.export()
        if self._store_read is None or not self._store_counters:
            return
        current = self._store_read()
        for name, counter in self._store_counters.items():
            delta = current.get(name, 0) - self._store_exported.get(name, 0)
            if delta > 0:
                counter.inc(delta)
                self._store_exported[name] = current.get(name, 0)

    async def export_forever(self, interval_s: float = 1.0) -> None:
        """Run ``export`` every ``interval_s`` until cancelled (and once more then)."""
        if self._export is None:
            return
        try:
            while True:
                self.export()
                await asyncio.sleep(interval_s)
        finally:
            self.export()
