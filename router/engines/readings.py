"""One engine's ``/metrics`` text -> an EngineReading: load, prefix-cache counters, cache geometry.

Why a real Prometheus parser: engines label their series (``engine`` per data-parallel
rank, ``model_name``, ``finished_reason``), counters carry ``_total`` and ``_created``,
and label values may hold escaped quotes; regexes get these wrong. The text is first cut
down to the lines of the families read here (an engine's /metrics is mostly histogram
buckets the router never uses), then parsed with ``prometheus_client.parser``.

Names: vLLM (current and the older ``gpu_`` names of <= 0.10) and SGLang. Gauges of
several data-parallel ranks are summed (requests) or averaged (usage).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Series = list[tuple[dict[str, str], float]]

# sample name -> role; the first name present wins for each role.
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
            "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
         "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits",
         "sglang:cached_tokens_total", "sglang:cached_tokens")
_PROMPT = ("vllm:prompt_tokens_total", "vllm:prompt_tokens", "sglang:prompt_tokens_total", "sglang:prompt_tokens")
_FINISHED = ("vllm:request_success_total", "vllm:request_success", "sglang:num_requests_total", "sglang:num_requests")
_CACHE_INFO = ("vllm:cache_config_info", "sglang:cache_config_info")
_SGLANG_CAPACITY = ("sglang:max_total_num_tokens",)
# Histogram sums and counts (vLLM observes the prefill ones when a request finishes; TTFT and
# queue time are observed at the first token / at scheduling). Only ``_sum``/``_count`` are read:
# their TYPE lines are cut with the buckets, so each parses as an untyped sample of its own name.
_PREFILL_S = ("vllm:request_prefill_time_seconds_sum",)
_PREFILL_N = ("vllm:request_prefill_time_seconds_count",)
_COMPUTED = ("vllm:request_prefill_kv_computed_tokens_sum",)
_TTFT_S = ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum")
_TTFT_N = ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count")
_QUEUE_S = ("vllm:request_queue_time_seconds_sum", "sglang:queue_time_seconds_sum")
# Inter-token latency, observed per generated token after the first (vLLM >= 0.11 and newer
# SGLang name it ``inter_token_latency``; the older ``time_per_output_token`` is the same series).
_ITL_S = ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum",
          "sglang:inter_token_latency_seconds_sum", "sglang:time_per_output_token_seconds_sum")
_ITL_N = ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
          "sglang:inter_token_latency_seconds_count", "sglang:time_per_output_token_seconds_count")
# The prompt tokens of finished requests, with how many finished: counted when each request ends (vLLM's
# request_prompt_tokens histogram; SGLang's prompt and request counters, incremented together at the end).
_ANSWERED_S = ("vllm:request_prompt_tokens_sum", "sglang:prompt_tokens_total", "sglang:prompt_tokens")
_ANSWERED_N = ("vllm:request_prompt_tokens_count", "sglang:num_requests_total", "sglang:num_requests")
_TIMING = _PREFILL_S + _PREFILL_N + _COMPUTED + _TTFT_S + _TTFT_N + _QUEUE_S + _ITL_S + _ITL_N + _ANSWERED_S + _ANSWERED_N
_WANTED = (_RUNNING + _WAITING + _USAGE + _QUERIES + _HITS + _PROMPT + _FINISHED + _CACHE_INFO + _SGLANG_CAPACITY
           + _TIMING)
_NAMES = frozenset(_WANTED)
_PREFIXES = tuple(sorted({n.removesuffix("_total") for n in _WANTED}))


@dataclass(frozen=True)
class EngineReading:
    """What one scrape said; None where the engine exports no such series."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1, KV blocks held by running requests
    prompt_tokens: float | None = None  # counter: prompt tokens seen
    queried_tokens: float | None = None  # counter: prompt tokens looked up in the prefix cache
    hit_tokens: float | None = None  # counter: of those, served from the prefix cache
    finished: float | None = None  # counter: requests finished
    block_size: int | None = None
    capacity_tokens: int | None = None  # KV cache capacity in tokens
    kv_dtype: str | None = None
    # counters from histograms (sums over ranks): prefill phase (first scheduled -> first token)
    prefill_s: float | None = None  # seconds, summed over finished requests
    prefill_requests: float | None = None  # finished requests those seconds cover
    computed_tokens: float | None = None  # KV tokens those requests computed (cache hits excluded)
    ttft_s: float | None = None  # the engine's own time to first token, summed
    ttft_requests: float | None = None
    queue_s: float | None = None  # time waiting to be scheduled, summed
    itl_s: float | None = None  # seconds between a request's consecutive tokens, summed over tokens
    itl_tokens: float | None = None  # generated tokens (after each request's first) those seconds cover
    answered_prompt_tokens: float | None = None  # prompt tokens of the requests finished, counted at their end
    answered_requests: float | None = None  # ... and how many finished

    @property
    def requests(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


def _relevant(text: str) -> str:
    """Only the sample, TYPE and HELP lines of the families read here."""
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2].startswith(_PREFIXES):
                keep.append(line)
        elif line.startswith(_PREFIXES):
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


def samples(text: str) -> dict[str, Series]:
    """Sample name -> [(labels, value)] for the families read here. ValueError if malformed."""
    out: dict[str, Series] = defaultdict(list)
    for family in text_string_to_metric_families(_relevant(text)):
        for s in family.samples:
            if s.name in _NAMES:
                out[s.name].append((dict(s.labels), float(s.value)))
    return out


def _first(series: Mapping[str, Series], names: Iterable[str]) -> Series | None:
    for name in names:
        if name in series:
            return series[name]
    return None


def _sum(series: Mapping[str, Series], names: Iterable[str]) -> float | None:
    found = _first(series, names)
    return None if found is None else sum(v for _, v in found)


def _mean(series: Mapping[str, Series], names: Iterable[str]) -> float | None:
    found = _first(series, names)
    return None if not found else sum(v for _, v in found) / len(found)


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _geometry(series: Mapping[str, Series]) -> tuple[int | None, int | None, str | None]:
    """(block size, capacity tokens, KV dtype) from the cache info gauge (summed over ranks)."""
    block = capacity = None
    dtype: str | None = None
    for labels, _ in _first(series, _CACHE_INFO) or []:
        size = _int(labels.get("block_size") or labels.get("page_size"))
        blocks = _int(labels.get("num_gpu_blocks") or labels.get("num_pages"))
        block = size or block
        if size and blocks:
            capacity = (capacity or 0) + size * blocks
        dtype = labels.get("cache_dtype") or labels.get("kv_cache_dtype") or dtype
    if capacity is None:
        tokens = _sum(series, _SGLANG_CAPACITY)
        capacity = int(tokens) if tokens else None
    return block, capacity, dtype


def _pair(series: Mapping[str, Series], sums: tuple[str, ...], counts: tuple[str, ...]) -> tuple[float | None, float | None]:
    """A histogram's sum and count from the first name present in both (never a sum of one
    name with the count of another: an engine exporting both the old and the new name would
    pair two series that started counting at different times)."""
    for s_name, n_name in zip(sums, counts):
        if s_name in series and n_name in series:
            return sum(v for _, v in series[s_name]), sum(v for _, v in series[n_name])
    return None, None


def parse_metrics(text: str) -> EngineReading:
    """An EngineReading from a /metrics body; ValueError when it is not Prometheus text."""
    series = samples(text)
    block, capacity, dtype = _geometry(series)
    itl_s, itl_tokens = _pair(series, _ITL_S, _ITL_N)
    answered_tokens, answered = _pair(series, _ANSWERED_S, _ANSWERED_N)
    return EngineReading(
        running=_sum(series, _RUNNING),
        waiting=_sum(series, _WAITING),
        kv_usage=_mean(series, _USAGE),
        prompt_tokens=_sum(series, _PROMPT),
        queried_tokens=_sum(series, _QUERIES),
        hit_tokens=_sum(series, _HITS),
        finished=_sum(series, _FINISHED),
        block_size=block,
        capacity_tokens=capacity,
        kv_dtype=dtype,
        prefill_s=_sum(series, _PREFILL_S),
        prefill_requests=_sum(series, _PREFILL_N),
        computed_tokens=_sum(series, _COMPUTED),
        ttft_s=_sum(series, _TTFT_S),
        ttft_requests=_sum(series, _TTFT_N),
        queue_s=_sum(series, _QUEUE_S),
        itl_s=itl_s,
        itl_tokens=itl_tokens,
        answered_prompt_tokens=answered_tokens,
        answered_requests=answered,
    )
