"""/metrics text -> EngineReading, on real vLLM 0.32 output and on the other names engines use."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.engines.readings import parse_metrics

REAL = (Path(__file__).parents[1] / "fixtures" / "vllm-0.32-metrics.txt").read_text()


def test_real_vllm_032_output() -> None:
    r = parse_metrics(REAL)
    assert (r.running, r.waiting, r.kv_usage) == (0.0, 0.0, 0.0)
    assert r.block_size == 128 and r.capacity_tokens == 64 * 128 and r.kv_dtype == "auto"
    assert r.queried_tokens == 18776 and r.hit_tokens == 8448  # the engine's own prefix-cache counters
    assert r.prompt_tokens == 18776 and r.finished == 20  # summed over finished_reason


OLD_VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 40.0
"""


def test_older_vllm_names() -> None:
    r = parse_metrics(OLD_VLLM)
    assert (r.running, r.waiting, r.requests, r.kv_usage) == (3, 2, 5, 0.25)
    assert (r.queried_tokens, r.hit_tokens) == (100, 40)
    assert r.block_size is None and r.capacity_tokens is None


DATA_PARALLEL = """\
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.1
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="1",num_gpu_blocks="100"} 1.0
"""


def test_data_parallel_ranks_are_summed_and_usage_averaged() -> None:
    r = parse_metrics(DATA_PARALLEL)  # untyped samples (no TYPE lines) parse too
    assert r.running == 4 and r.waiting is None and r.requests == 4
    assert r.kv_usage == pytest.approx(0.3)
    assert (r.block_size, r.capacity_tokens, r.kv_dtype) == (16, 3200, "fp8")


SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 4.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.75
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 500000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m"} 10.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 30.0
"""


def test_sglang_names() -> None:
    r = parse_metrics(SGLANG)
    assert (r.running, r.waiting, r.kv_usage, r.capacity_tokens) == (7, 4, 0.75, 500000)
    assert (r.hit_tokens, r.prompt_tokens, r.queried_tokens) == (10, 30, None)


def test_sglang_cache_config_labels() -> None:
    r = parse_metrics('sglang:cache_config_info{page_size="64",num_pages="10"} 1.0\n')
    assert (r.block_size, r.capacity_tokens) == (64, 640)


def test_label_values_with_escapes_and_unrelated_families() -> None:
    text = ('other_metric{a="x"} 1\n'
            'vllm:num_requests_waiting{model_name="a \\"quoted\\" }, name"} 9\n')
    assert parse_metrics(text).waiting == 9


def test_nothing_known_is_all_none() -> None:
    r = parse_metrics("# HELP up whatever\nup 1\n")
    assert r.requests is None and r.kv_usage is None and r.block_size is None


def test_malformed_text_raises() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{model_name=} nope\n")


def test_prefill_and_ttft_histogram_sums_of_real_vllm_032() -> None:
    r = parse_metrics(REAL)
    assert (r.prefill_requests, r.ttft_requests) == (20, 20)
    assert r.computed_tokens == 10328 == 18776 - 8448  # computed = prompt - prefix-cache hits
    assert r.prefill_s is not None and r.ttft_s is not None and r.queue_s is not None
    assert 0 < r.queue_s < r.prefill_s < r.ttft_s


def test_sglang_ttft_and_queue_histograms() -> None:
    text = """\
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 3.0
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{le="+Inf",model_name="m"} 3.0
sglang:queue_time_seconds_sum{model_name="m"} 0.25
sglang:queue_time_seconds_count{model_name="m"} 3.0
"""
    r = parse_metrics(text)
    assert (r.ttft_s, r.ttft_requests, r.queue_s) == (1.5, 3.0, 0.25)
    assert r.prefill_s is None and r.computed_tokens is None


def test_inter_token_latency_of_real_vllm_032() -> None:
    r = parse_metrics(REAL)
    assert r.itl_tokens == 2738 == 2758 - 20  # every generated token but each request's first
    assert r.itl_s is not None and 0 < r.itl_s / r.itl_tokens < 0.1


def test_inter_token_latency_takes_one_names_sum_and_count_together() -> None:
    text = """\
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 9.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 90.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 2.0
sglang:time_per_output_token_seconds_sum{model_name="m"} 1.0
sglang:time_per_output_token_seconds_count{model_name="m"} 50.0
"""
    r = parse_metrics(text)
    # the new vLLM name has no count here: its sum is not paired with the old name's count
    assert (r.itl_s, r.itl_tokens) == (9.0, 90.0)
    assert (parse_metrics(text.replace("vllm:time_per", "x:y")).itl_s,
            parse_metrics(text.replace("vllm:time_per", "x:y")).itl_tokens) == (1.0, 50.0)
    assert parse_metrics("vllm:num_requests_running 1\n").itl_s is None


def test_the_prompts_of_finished_requests_as_each_engine_counts_them() -> None:
    r = parse_metrics(REAL)  # vLLM 0.32: the request_prompt_tokens histogram, observed as each request ends
    assert (r.answered_prompt_tokens, r.answered_requests) == (18776, 20) == (r.prompt_tokens, r.finished)
    # SGLang counts prompt tokens and requests together at each request's end; one without the other is no pair
    text = 'sglang:prompt_tokens_total{model_name="m"} 300.0\nsglang:num_requests_total{model_name="m"} 3.0\n'
    assert (parse_metrics(text).answered_prompt_tokens, parse_metrics(text).answered_requests) == (300, 3)
    assert parse_metrics(SGLANG).answered_requests is None  # its prompt counter alone
