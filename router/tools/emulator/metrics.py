"""Prometheus metrics with the real engines' names, in a per-app registry.

vLLM's are checked against vLLM 0.32's own output (tests/fixtures/vllm-0.32-metrics.txt):
the same names, an ``engine`` label beside ``model_name``, counters with ``_total``,
``vllm:cache_config_info`` with its geometry labels; the older ``vllm:gpu_*`` names are
gone there, so they are gone here.

Why per-app: several emulators run inside one test process; a global
registry would mix their numbers (and refuse duplicate names). Gauges and
counters are computed from the engine when scraped, so the hot path pays
nothing; only latency histograms are observed per request.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from router.tools.emulator.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineCollector(Collector):
    """Reads gauges and counters straight from the engine at scrape time."""

    def __init__(self, flavor: str, model: str, engine: Engine,
                 cache_labels: dict[str, str], time_scale: float = 1.0) -> None:
        self._flavor = flavor
        self._model = model
        self._engine = engine
        self._cache_labels = cache_labels
        self._time_scale = time_scale

    def collect(self) -> Iterator[Metric]:
        if self._flavor == "vllm":
            yield from self._vllm()
        else:
            yield from self._sglang()
        yield self._itl()

    def _itl(self) -> HistogramMetricFamily:
        """Inter-token latency from the engine's step counters (one observation per token after
        a request's first, each the step that made it): only ``+Inf`` of the buckets, as the
        sum and count are what a reader of the mean needs, and a per-token observe would cost
        the engine loop."""
        c = self._engine.counters
        names, values = self._labels()
        family = HistogramMetricFamily(f"{'vllm' if self._flavor == 'vllm' else 'sglang'}:inter_token_latency_seconds",
                                       "Time between a request's consecutive tokens (model seconds x time scale).",
                                       labels=names)
        family.add_metric(values, [("+Inf", float(c.itl_tokens))], c.itl_seconds * self._time_scale)
        return family

    def _labels(self) -> tuple[list[str], list[str]]:
        if self._flavor == "vllm":  # one series per data-parallel engine; the emulator is engine 0
            return ["engine", "model_name"], ["0", self._model]
        return ["model_name"], [self._model]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        names, values = self._labels()
        family = GaugeMetricFamily(name, doc, labels=names)
        family.add_metric(values, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        names, values = self._labels()
        family = CounterMetricFamily(name, doc, labels=names)
        family.add_metric(values, value)
        return family

    def _vllm(self) -> Iterator[Metric]:
        e = self._engine
        c = e.counters
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch.",
                          e.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                          e.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).",
                          e.kv.usage)
        yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the "
                            "prefix cache.", c.prompt_tokens)
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens served by the prefix "
                            "cache.", c.cached_tokens)
        yield self._counter("vllm:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Tokens generated.", c.generated_tokens)
        yield self._counter("vllm:num_preemptions", "Preemptions (never: KV is reserved).", 0)
        success = CounterMetricFamily("vllm:request_success", "Finished requests.",
                                      labels=["engine", "finished_reason", "model_name"])
        success.add_metric(["0", "length", self._model], c.requests_finished)
        yield success
        block, blocks = int(self._cache_labels["block_size"]), int(self._cache_labels["num_gpu_blocks"])
        labels = {"engine": "0", "kv_cache_size_tokens": str(block * blocks), "num_cpu_blocks": "None",
                  "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "xxhash",
                  **self._cache_labels}
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=sorted(labels))
        info.add_metric([labels[k] for k in sorted(labels)], 1.0)
        yield info

    def _sglang(self) -> Iterator[Metric]:
        e = self._engine
        c = e.counters
        hit_rate = c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
        used = e.kv.used_blocks * e.kv.block_size
        yield self._gauge("sglang:num_running_reqs", "Running requests.", e.num_running)
        yield self._gauge("sglang:num_queue_reqs", "Queued requests.", e.num_waiting)
        yield self._gauge("sglang:num_used_tokens", "KV tokens in use.", used)
        yield self._gauge("sglang:token_usage", "KV token usage (1 = 100%).", e.kv.usage)
        yield self._gauge("sglang:cache_hit_rate", "Prefix cache hit rate (tokens).",
                          hit_rate)
        yield self._counter("sglang:prompt_tokens", "Prompt tokens processed.",
                            c.prompt_tokens)
        yield self._counter("sglang:generation_tokens", "Tokens generated.",
                            c.generated_tokens)
        yield self._counter("sglang:cached_tokens", "Prompt tokens served from cache.",
                            c.cached_tokens)
        yield self._counter("sglang:num_requests", "Finished requests.", c.requests_finished)
        yield self._gauge("sglang:max_total_num_tokens", "KV cache capacity in tokens.",
                          e.kv.num_blocks * e.kv.block_size)
        info = InfoMetricFamily("sglang:cache_config", "KV cache configuration.")
        info.add_metric([], {"page_size": str(e.kv.block_size), "num_pages": str(e.kv.num_blocks),
                             "kv_cache_dtype": self._cache_labels.get("cache_dtype", "auto")})
        yield info


class EngineMetrics:
    """The registry of one emulator app plus its latency histograms."""

    def __init__(self, flavor: str, model: str, engine: Engine,
                 cache_labels: dict[str, str], time_scale: float = 1.0) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(flavor, model, engine, cache_labels, time_scale))
        prefix = "vllm" if flavor == "vllm" else "sglang"
        names, values = (["engine", "model_name"], ["0", model]) if flavor == "vllm" else (["model_name"], [model])
        self._ttft = Histogram(f"{prefix}:time_to_first_token_seconds",
                               "Time to first token (wall seconds at this server).",
                               labelnames=names, buckets=_TTFT_BUCKETS,
                               registry=self.registry).labels(*values)
        self._e2e = Histogram(f"{prefix}:e2e_request_latency_seconds",
                              "Request latency (wall seconds at this server).",
                              labelnames=names, buckets=_E2E_BUCKETS,
                              registry=self.registry).labels(*values)

        self._flavor = flavor
        self._queue = Histogram(f"{prefix}:{'request_queue_time_seconds' if flavor == 'vllm' else 'queue_time_seconds'}",
                                "Time waiting to be scheduled (model seconds x time scale).",
                                labelnames=names, buckets=_PHASE_BUCKETS, registry=self.registry).labels(*values)
        if flavor == "vllm":  # vLLM observes these when a request finishes, from the same request's stats
            self._prefill = Histogram("vllm:request_prefill_time_seconds",
                                      "Time from first scheduled to first token (model seconds x time scale).",
                                      labelnames=names, buckets=_PHASE_BUCKETS, registry=self.registry).labels(*values)
            self._computed = Histogram("vllm:request_prefill_kv_computed_tokens",
                                       "KV tokens computed during prefill (cached, transferred and loaded excluded).",
                                       labelnames=names, buckets=_TOKEN_BUCKETS, registry=self.registry).labels(*values)
            self._prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                     labelnames=names, buckets=_TOKEN_BUCKETS, registry=self.registry).labels(*values)

    def observe_queue(self, seconds: float) -> None:
        self._queue.observe(seconds)

    def observe_prefill(self, seconds: float, computed_tokens: int, prompt_tokens: int) -> None:
        """A finished request's prefill phase and prompt (vLLM only: SGLang exports no such histograms)."""
        if self._flavor == "vllm":
            self._prefill.observe(seconds)
            self._computed.observe(computed_tokens)
            self._prompt.observe(prompt_tokens)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_e2e(self, seconds: float) -> None:
        self._e2e.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
