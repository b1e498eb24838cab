"""Metric names routers scrape exist in each flavour and move with load."""

from __future__ import annotations

import re
import threading
import time

import httpx

from .conftest import StartFn

PROMPT = "metrics must move when the engine works " * 20


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} missing"
    return float(match.group(1))


def test_vllm_metrics_present_and_moving(start_emulator: StartFn,
                                         client: httpx.Client) -> None:
    emu = start_emulator(cache_tokens=16 * 1024)
    before = client.get(f"{emu.url}/metrics").text
    assert sample(before, "vllm:prefix_cache_queries_total") == 0
    for _ in range(2):
        client.post(f"{emu.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    after = client.get(f"{emu.url}/metrics").text
    queries = sample(after, "vllm:prefix_cache_queries_total")
    hits = sample(after, "vllm:prefix_cache_hits_total")
    assert queries > 0 and 0 < hits < queries
    assert sample(after, "vllm:time_to_first_token_seconds_count") == 2
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        assert sample(after, name) == 0
    info = re.search(r"^vllm:cache_config_info\{([^}]*)\} 1\.0$", after, re.M)
    assert info and 'block_size="16"' in info.group(1)
    assert 'num_gpu_blocks="1024"' in info.group(1)
    assert 'model_name="emulated-llama3-8b-h100"' in after


def test_vllm_gauges_while_busy(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(time_scale=0.2, max_num_seqs=2)
    threads = [threading.Thread(target=client.post, args=(f"{emu.url}/v1/completions",),
                                kwargs={"json": {"prompt": f"{i} {PROMPT}", "max_tokens": 40}})
               for i in range(4)]
    for t in threads:
        t.start()
    seen_running = seen_waiting = seen_usage = 0.0
    for _ in range(100):
        text = client.get(f"{emu.url}/metrics").text
        seen_running = max(seen_running, sample(text, "vllm:num_requests_running"))
        seen_waiting = max(seen_waiting, sample(text, "vllm:num_requests_waiting"))
        seen_usage = max(seen_usage, sample(text, "vllm:kv_cache_usage_perc"))
        if seen_running == 2 and seen_waiting >= 1:
            break
        threading.Event().wait(0.01)
    for t in threads:
        t.join()
    assert seen_running == 2 and seen_waiting >= 1 and seen_usage > 0


def test_sglang_endpoints_and_metrics(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(flavor="sglang")
    for _ in range(2):
        client.post(f"{emu.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    text = client.get(f"{emu.url}/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert sample(text, name) == 0
    assert 0 < sample(text, "sglang:cache_hit_rate") < 1
    assert "vllm:" not in text
    load = client.get(f"{emu.url}/get_load").json()
    assert isinstance(load, list) and isinstance(load[0]["num_tokens"], int)
    model_info = client.get(f"{emu.url}/model_info").json()
    server_info = client.get(f"{emu.url}/server_info").json()
    for doc in (model_info, server_info):
        assert "model_path" not in doc and "tokenizer_path" not in doc
    assert model_info["is_generation"] is True
    assert server_info["disaggregation_mode"] == "null"
    assert server_info["page_size"] == 16


def test_stats_endpoint_exact_counters(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    for _ in range(3):
        client.post(f"{emu.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    # The engine books a request finished when its step's events are processed, which on a
    # loaded machine can trail the response the client already has: wait for it (bounded).
    deadline = time.monotonic() + 5
    while (stats := client.get(f"{emu.url}/emulator/stats").json())["requests"]["finished"] < 3:
        assert time.monotonic() < deadline, stats["requests"]
        time.sleep(0.02)
    assert stats["requests"]["finished"] == 3
    prompt_len = stats["recent"][0]["prompt_tokens"]
    hit = (prompt_len - 1) // 16 * 16
    assert stats["tokens"]["prompt"] == 3 * prompt_len
    assert stats["tokens"]["cached"] == 2 * hit
    assert stats["prefix_hit_ratio"] == 2 * hit / (3 * prompt_len)
    assert [r["cached_tokens"] for r in stats["recent"]] == [0, hit, hit]
    assert stats["recent"][0]["ttft_model_s"] > stats["recent"][1]["ttft_model_s"]
    assert stats["engine_id"] == emu.engine_id
