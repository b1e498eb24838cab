"""Through the router with emulated engines: what the engines report changes what it answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from router.config.model import load_config
from router.gateway.app import create_app
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import EmulatorHandle, start_in_thread
from servers import free_port, serve_app

TOKEN = "t"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@contextmanager
def routed(*emulators: EmulatorConfig, **overrides: object) -> Iterator[tuple[str, list[EmulatorHandle]]]:
    with ExitStack() as stack:
        handles = [stack.enter_context(start_in_thread(c)) for c in emulators]
        config = load_config(overrides={
            "instances": [{"url": h.url, "name": f"e{i}"} for i, h in enumerate(handles)],
            "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, "policy": {"seed": 1}, **overrides})
        yield stack.enter_context(serve_app(create_app(config))), handles


def generations(handle: EmulatorHandle) -> int:
    return httpx.get(f"{handle.url}/emulator/stats").json()["http"]["generation_requests"]


BASE = EmulatorConfig(model="tiny", time_scale=0.01, block_size=32, cache_tokens=8192, max_model_len=2048)


def test_unknown_model_and_overlong_prompts_are_answered_by_the_router_at_once() -> None:
    with routed(BASE, BASE.replace(engine_id="e1")) as (url, handles):
        r = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["code"] == "model_not_found"
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [5] * 2048, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert sum(generations(h) for h in handles) == 0  # nothing was sent
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_rejected_total{status="404"} 2.0' in metrics
        assert 'pd_router_rejected_total{status="400"} 2.0' in metrics
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [5] * 2000, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert sum(generations(h) for h in handles) == 1


def test_debug_and_metrics_show_what_the_engines_said() -> None:
    with routed(BASE) as (url, _):
        doc = httpx.get(f"{url}/debug/instances", headers=AUTH).json()["instances"][0]
        assert doc["compat"]["block_size"] == 32  # config left it at its default: the engine's
        engine = doc["engine"]
        assert engine["models"] == {"tiny": 2048}
        assert (engine["block_size"], engine["capacity_tokens"], engine["kv_dtype"]) == (32, 8192, "auto")
        httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hello " * 200, "max_tokens": 2})
        time.sleep(0.1)
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_engine_cache_capacity_tokens{engine="e0"} 8192.0' in metrics
        assert 'pd_router_engine_kv_usage{engine="e0"}' in metrics


def test_facts_are_read_when_an_instance_comes_back() -> None:
    port = free_port()
    config = load_config(overrides={
        "instances": [{"url": f"http://127.0.0.1:{port}", "name": "late"}], "server": {"admin_token": TOKEN},
        "health": {"interval_s": 0.1, "failures_to_unhealthy": 1}, "engines": {"facts_interval_s": 3600}})
    with serve_app(create_app(config)) as url:
        assert httpx.get(f"{url}/debug/instances", headers=AUTH).json()["instances"][0]["engine"]["models"] is None
        with start_in_thread(BASE, port=port):
            deadline = time.monotonic() + 10
            # the models come from /v1/models when the instance is back, its block size from the
            # next metrics poll (vLLM's cache_config_info): wait for both
            while None in ((doc := httpx.get(f"{url}/debug/instances", headers=AUTH).json()["instances"][0])["engine"]["models"],
                           doc["engine"]["block_size"]):
                assert time.monotonic() < deadline, doc
                time.sleep(0.05)
            assert doc["engine"]["models"] == {"tiny": 2048} and doc["compat"]["block_size"] == 32


PROMPT = "Tenant 7 system prompt: answer support questions about invoices and orders. " * 12


def test_a_busy_engine_is_avoided_when_its_load_came_from_elsewhere() -> None:
    slow = EmulatorConfig(model="tiny", time_scale=0.3, max_num_seqs=1, block_size=16, cache_tokens=65536)
    # a reading counts for 30 s, not 3 polls (0.3 s): on a loaded host the router's poll can lag the
    # decision by more than that, which dropped the queue the engine had reported and sent the
    # request to the cached (busy) engine
    engines = {"metrics_interval_s": 0.1, "stale_after_s": 30, "timeout_s": 30}
    with routed(slow, slow.replace(engine_id="e1"), engines=engines) as (url, handles):
        first = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1}, timeout=60)
        assert first.status_code == 200
        cached_on = 0 if generations(handles[0]) == 1 else 1
        busy = handles[cached_on]

        def bypass(i: int, max_tokens: int = 40) -> None:  # straight to the engine, not through the router
            httpx.post(f"{busy.url}/v1/completions", timeout=120,
                       json={"model": "tiny", "prompt": f"other tenant {i} " * 150, "max_tokens": max_tokens})

        def running() -> int:
            return int(httpx.get(f"{busy.url}/emulator/stats").json()["requests"]["running"])

        def slowdown(factor: float) -> None:
            assert httpx.post(f"{busy.url}/emulator/faults", json={"slowdown": factor}).status_code == 200

        # The queue is made by construction and lasts until the decision is made: the engine's one
        # slot is held by a request whose steps take 100 x longer (~30 s) while 11 more arrive,
        # and the steps are sped up again only afterwards. (12 requests sent at once were seen to
        # drain as they arrived, or while the test process stalled on a loaded host.)
        bypass(99)  # finished first: the engine's counters give the mean prompt queued ones are priced at
        slowdown(100)
        blocker = threading.Thread(target=bypass, args=(100,), daemon=True)
        blocker.start()
        deadline = time.monotonic() + 20
        while running() < 1:
            assert time.monotonic() < deadline and blocker.is_alive(), "the blocker never ran"
            time.sleep(0.01)
        threads = [threading.Thread(target=bypass, args=(i,), daemon=True) for i in range(11)]
        for t in threads:
            t.start()
        threads.append(blocker)
        deadline = time.monotonic() + 20
        pattern = f'pd_router_engine_external_load{{engine="e{cached_on}",kind="prefill_tokens"}}'
        while True:
            metrics = httpx.get(f"{url}/metrics").text
            line = next((ln for ln in metrics.splitlines() if ln.startswith(pattern)), None)
            if line is not None and float(line.split()[-1]) > 2000:
                break
            assert time.monotonic() < deadline, line
            time.sleep(0.05)
        before = [generations(h) for h in handles]
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": PROMPT + " again", "max_tokens": 1},
                       timeout=60)
        assert r.status_code == 200
        after = [generations(h) for h in handles]
        assert after[1 - cached_on] == before[1 - cached_on] + 1, (before, after)  # the idle one, cache or not
        slowdown(1)
        for t in threads:
            t.join(timeout=120)


# -- token mode: the exact count and the keys are the request path's own ---------------------------
TOKEN_MODE = {"hashing": {"mode": "tokens", "tokens": {"source": "engine", "block_size": 32}}}


def test_in_token_mode_the_exact_token_count_refuses_what_the_character_bound_let_through(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from router.tools.tiny_model import write_model

    tokenizer = write_model(tmp_path) / "tokenizer.json"
    prompt = "7, " * 1100  # 3,300 characters: at most 32 bytes a token bounds it at 104 tokens
    counted = len(Tokenizer.from_file(str(tokenizer)).encode(prompt).ids)
    assert counted >= 2048
    file_mode = {"hashing": {"mode": "tokens", "tokens": {"source": "file", "path": str(tokenizer), "block_size": 32}}}
    with routed(BASE, **file_mode) as (url, handles):
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert r.json()["error"]["param"] == "prompt" and f"has {counted} tokens" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/debug/route", headers=AUTH, json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert generations(handles[0]) == 0  # refused before it was sent
        fits = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "7, " * 300, "max_tokens": 2})
        assert fits.status_code == 200, fits.text
        assert generations(handles[0]) == 1
    with routed(BASE, **TOKEN_MODE) as (url, handles):  # the engine's /tokenize counts it, as vLLM's does
        counted = httpx.post(f"{handles[0].url}/tokenize", json={"model": "tiny", "prompt": prompt}).json()["count"]
        assert counted >= 2048
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and f"has {counted} tokens" in r.json()["error"]["message"], r.text
        assert generations(handles[0]) == 0


def test_debug_route_in_token_mode_computes_the_keys_the_request_path_routed_on() -> None:
    prompt = "Shared handbook of the parcel desk, chapter one. " * 30
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    with routed(BASE, BASE.replace(engine_id="e1"), **TOKEN_MODE) as (url, handles):
        counted = httpx.post(f"{handles[0].url}/tokenize", json={"model": "tiny", "prompt": prompt}).json()["count"]
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
        served = next(f"e{i}" for i, h in enumerate(handles) if generations(h))
        plan = httpx.post(f"{url}/debug/route", headers=AUTH, json=body).json()
    assert (plan["request"]["keys"], plan["request"]["prompt_tokens"]) == ("tokens", counted)
    assert plan["request"]["blocks"] == counted // 32
    matched = {c["id"]: c["matched_blocks"] for c in plan["candidates"]}
    assert matched[served] == counted // 32 and plan["chosen"]["instance"] == served  # the routed keys, met again
