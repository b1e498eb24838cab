"""Prometheus metrics, on a registry owned by one app (no process-global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class _StoreCounters:
    """Exports counters the state store keeps as plain attributes."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        values = self._read()
        for name, help_text in (
            ("round_trips", "Network round trips made by the state store"),
            ("corrections", "Decisions moved after the shared view disagreed with the local one"),
            ("errors", "State store calls that failed (decisions fell back to the local view)"),
        ):
            family = CounterMetricFamily(f"pd_router_state_{name}", help_text)
            family.add_metric([], values.get(name, 0))
            yield family


class Metrics:
    def __init__(self, store_counters: Callable[[], dict[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "pd_router_requests", "Proxied requests by instance and outcome", ["instance", "outcome"], registry=r
        )
        self.latency = Histogram(
            "pd_router_request_duration_seconds",
            "Whole request latency seen by the router",
            ["instance", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "pd_router_time_to_first_byte_seconds",
            "Time from routing to the first response byte from the instance",
            ["instance"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "pd_router_decisions", "Routing decisions by policy and deciding rule", ["policy", "reason"], registry=r
        )
        self.cached_ratio = Histogram(
            "pd_router_estimated_cached_prefix_ratio",
            "Estimated share of the prompt already cached on the chosen instance",
            buckets=(0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=r,
        )
        self.inflight = Gauge("pd_router_inflight_requests", "Requests in flight per instance", ["instance"], registry=r)
        self.healthy = Gauge("pd_router_instance_healthy", "1 if the instance is considered healthy", ["instance"], registry=r)
        self.retries = Counter(
            "pd_router_retries", "Attempts moved to another instance before the first byte", ["instance", "reason"], registry=r
        )
        self.rejected = Counter("pd_router_rejected", "Requests refused by the router itself", ["status"], registry=r)
        self.store_latency = Histogram(
            "pd_router_state_store_seconds", "Latency of state store operations", ["op"], buckets=_FAST_BUCKETS, registry=r
        )
        self.modes = Counter(
            "pd_router_route_modes", "Decisions by route: colocated, disaggregated or decode_only", ["mode"], registry=r
        )
        self.estimate_ratio = Histogram(
            "pd_router_ttft_estimate_ratio",
            "Measured / estimated TTFT (streaming requests; prefill leg for vLLM PD)",
            ["mode"],
            buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4, 8),
            registry=r,
        )
        self.calibration = Gauge(
            "pd_router_calibration_factor", "Measured slowdown applied to an instance's prefill rate", ["instance"], registry=r
        )
        self.pd_failures = Counter(
            "pd_router_pd_failures", "Prefill legs that failed and what the router did about it", ["instance", "action"], registry=r
        )
        if store_counters is not None:
            r.register(_StoreCounters(store_counters))
