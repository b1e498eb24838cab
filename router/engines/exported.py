"""The router's /metrics view of what the engines said: built at scrape time from the book.

Engine counters are re-exported as gauges ("as last read"): an engine restart resets
them, which a Prometheus counter must never do.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from router.engines.book import EngineBook


class EngineCollector(Collector):
    def __init__(self, book: EngineBook) -> None:
        self._book = book

    def collect(self) -> Iterator[Metric]:
        reported = GaugeMetricFamily("pd_router_engine_requests", "Requests the engine last reported, by state",
                                     labels=["engine", "state"])
        usage = GaugeMetricFamily("pd_router_engine_kv_usage", "KV cache usage the engine last reported (0-1)",
                                  labels=["engine"])
        external = GaugeMetricFamily("pd_router_engine_external_load",
                                     "Load on the engine beyond what routers booked (requests, prefill_tokens, kv_tokens)",
                                     labels=["engine", "kind"])
        queried = GaugeMetricFamily("pd_router_engine_prefix_cache_queried_tokens",
                                    "Prompt tokens the engine looked up in its prefix cache (its counter, as last read)",
                                    labels=["engine"])
        hits = GaugeMetricFamily("pd_router_engine_prefix_cache_hit_tokens",
                                 "Prompt tokens the engine served from its prefix cache (its counter, as last read)",
                                 labels=["engine"])
        hit_ratio = GaugeMetricFamily("pd_router_engine_prefix_cache_hit_ratio",
                                      "The engine's prefix-cache hit ratio (hit / queried tokens, from its counters' "
                                      "deltas) since the router started reading it; compare with "
                                      "pd_router_predicted_cached_tokens / pd_router_routed_prompt_tokens",
                                      labels=["engine"])
        capacity = GaugeMetricFamily("pd_router_engine_cache_capacity_tokens", "KV cache capacity the engine reported",
                                     labels=["engine"])
        prefill = GaugeMetricFamily("pd_router_engine_prefill_tokens_per_s",
                                    "The engine's own prefill rate: KV tokens computed per second of prefill, from its "
                                    "histograms over the last measured window (router/engines/prefill_rate.py)",
                                    labels=["engine"])
        decode_step = GaugeMetricFamily("pd_router_engine_decode_step_seconds",
                                        "The engine's decode step as the router prices waits for KV room: its own mean "
                                        "inter-token latency, smoothed over windows (router/engines/decode_step.py)",
                                        labels=["engine"])
        errors = CounterMetricFamily("pd_router_engine_scrape_errors", "Failed reads of an engine's /metrics",
                                     labels=["engine"])
        for instance, entry in self._book.items():
            errors.add_metric([instance], entry.scrape_errors)
            if entry.hit_ratio is not None:
                hit_ratio.add_metric([instance], entry.hit_ratio)
            if entry.prefill is not None:
                prefill.add_metric([instance], entry.prefill.tokens_per_s)
            if entry.decode_step_s is not None:
                decode_step.add_metric([instance], entry.decode_step_s)
            if entry.facts.capacity_tokens is not None:
                capacity.add_metric([instance], entry.facts.capacity_tokens)
            r = entry.reading
            if r is None:
                continue
            for state, value in (("running", r.running), ("waiting", r.waiting)):
                if value is not None:
                    reported.add_metric([instance, state], value)
            if r.kv_usage is not None:
                usage.add_metric([instance], r.kv_usage)
            queried_tokens = r.queried_tokens if r.queried_tokens is not None else r.prompt_tokens
            if queried_tokens is not None:
                queried.add_metric([instance], queried_tokens)
            if r.hit_tokens is not None:
                hits.add_metric([instance], r.hit_tokens)
            ext = entry.external
            for kind, value in (("requests", ext.requests), ("prefill_tokens", ext.prefill_tokens),
                                ("kv_tokens", ext.kv_tokens)):
                external.add_metric([instance, kind], value)
        yield from (reported, usage, external, queried, hits, hit_ratio, capacity, prefill, decode_step, errors)
