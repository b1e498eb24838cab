"""Through the router with an emulated engine whose tokenizer is denser than the router's
4-characters-per-token estimate: the engine's prompt counts teach the router how many engine
tokens its estimate is, and the engine's cache is re-expressed in the router's tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from router.config.model import RouterConfig, load_config
from router.gateway.app import create_app
from router.request.prompt import parse_body
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from router.tools.emulator.tokenizer import Tokenizer
from servers import serve_app

TOKEN = "t"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ENGINE = EmulatorConfig(model="tiny", time_scale=0.01, block_size=32, cache_tokens=8192, max_model_len=4096)
WORDS = ["données", "état", "réseau", "mémoire", "clé", "été", "première", "élève"]  # the engine's tokenizer falls back to bytes


def prompt(i: int) -> str:
    return f"Question {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(60))


@contextmanager
def routed(**overrides: object) -> Iterator[tuple[str, RouterConfig, object]]:
    with start_in_thread(ENGINE) as engine:
        config = load_config(overrides={"instances": [{"url": engine.url, "name": "e0"}], "server": {"admin_token": TOKEN},
                                        "health": {"interval_s": 60}, **overrides})
        app = create_app(config)
        with serve_app(app) as url:
            yield url, config, app


def instance(url: str) -> dict:
    return httpx.get(f"{url}/debug/instances", headers=AUTH).json()["instances"][0]


def test_the_engines_prompt_counts_convert_its_cache_into_the_routers_tokens() -> None:
    tokenizer = Tokenizer()
    with routed() as (url, config, app):
        assert (instance(url)["token_ratio"], instance(url)["cache_tokens"]) == (1.0, 8192)
        estimated = reported = 0
        for i in range(20):
            body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 2}
            if i % 4 == 3:  # a stream that asks for usage: its last event carries the count
                body |= {"stream": True, "stream_options": {"include_usage": True}}
                with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
                    assert r.status_code == 200 and b"".join(r.iter_raw()).endswith(b"data: [DONE]\n\n")
            else:
                r = httpx.post(f"{url}/v1/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode(prompt(i)))
            estimated += parse_body(json.dumps(body).encode(), "completions", 4.0).prompt_tokens
            reported += len(tokenizer.encode(prompt(i)))
        truth = reported / estimated
        assert truth > 1.5  # the engine's tokenizer is denser than 4 characters a token here
        doc = instance(url)
        assert abs(doc["token_ratio"] / truth - 1) < 0.02, (doc["token_ratio"], truth)
        assert doc["cache_tokens"] == round(8192 / doc["token_ratio"])  # the cache in the router's tokens
        hook = app.state.service.token_ratio
        assert hook.ratios["tiny"].answers == 20  # every answer counted, the streams' too
        # residency holds as many keys as the cache holds of the router's blocks
        assert app.state.store._caps["e0"] == config.residency_cap(app.state.pool.get("e0").config, doc["cache_tokens"])
        assert app.state.store._caps["e0"] < config.residency_cap(app.state.pool.get("e0").config)
        metrics = httpx.get(f"{url}/metrics").text
        assert f'pd_router_engine_token_ratio{{engine="e0"}} {doc["token_ratio"]}' in metrics
        # a stream that does not ask for usage carries no count (the engine's own counts teach it: the tests below); nor does an engine's error answer
        with httpx.stream("POST", f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt(99), "max_tokens": 2,
                                                                  "stream": True}) as r:
            r.read()
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt(98), "max_tokens": 2, "n": 0})
        assert r.status_code == 400
        assert hook.ratios["tiny"].answers == 20
        # turned off while running: the next answer puts the estimate back as exact
        patch = httpx.patch(f"{url}/admin/config", headers={**AUTH, "content-type": "application/merge-patch+json"},
                            json={"engines": {"learn_token_ratio": False}})
        assert patch.status_code == 200, patch.text
        assert httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt(0), "max_tokens": 2}).status_code == 200
        assert (instance(url)["token_ratio"], instance(url)["cache_tokens"]) == (1.0, 8192)
        assert app.state.store._caps["e0"] == config.residency_cap(app.state.pool.get("e0").config)


def test_off_or_with_token_keys_the_estimate_is_taken_as_exact() -> None:
    with routed(engines={"learn_token_ratio": False}) as (url, _, app):
        for i in range(20):
            assert httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt(i), "max_tokens": 2}).status_code == 200
        assert (instance(url)["token_ratio"], instance(url)["cache_tokens"]) == (1.0, 8192)
        assert app.state.service.token_ratio.ratios == {}
    with routed() as (url, _, app):  # token-id prompts are counted exactly: nothing to learn from them
        for i in range(20):
            assert httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [7 + i] * 300, "max_tokens": 2}).status_code == 200
        assert app.state.service.token_ratio.ratios == {}


def stream_without_usage(url: str, i: int) -> None:
    body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        raw = b"".join(r.iter_raw())
    assert r.status_code == 200 and b'"prompt_tokens"' not in raw and raw.endswith(b"data: [DONE]\n\n")


def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_streams_without_usage_teach_the_ratio_through_the_engines_own_counts() -> None:
    """A front-end that only streams and never asks for usage: the engine's count of the prompts
    it finished, a scrape window at a time, is set against the router's estimates of them."""
    tokenizer = Tokenizer()
    with routed(engines={"metrics_interval_s": 0.1}) as (url, _, app):
        hook = app.state.service.token_ratio
        estimated = reported = 0
        for i in range(48):
            stream_without_usage(url, i)
            body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 2, "stream": True}
            estimated += parse_body(json.dumps(body).encode(), "completions", 4.0).prompt_tokens
            reported += len(tokenizer.encode(prompt(i)))
        wait_for(lambda: "tiny" in hook.ratios and hook.ratios["tiny"].answers >= 32)  # the last window may stay open
        truth = reported / estimated
        assert truth > 1.5
        doc = instance(url)
        assert abs(doc["token_ratio"] / truth - 1) < 0.05, (doc["token_ratio"], truth)
        assert doc["cache_tokens"] == round(8192 / doc["token_ratio"])
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_token_ratio_windows_total{engine="e0",result="learned"}' in metrics


def test_requests_that_reach_the_engine_around_the_router_teach_nothing() -> None:
    """Someone else's requests are in the engine's count, not in the router's estimates: every
    window they fall in is dropped rather than read as a denser tokenizer."""
    with routed(engines={"metrics_interval_s": 0.1}) as (url, config, app):
        hook = app.state.service.token_ratio
        engine = config.instances[0].url
        for i in range(48):
            stream_without_usage(url, i)
            if i % 2:  # straight to the engine, as another router would send it
                assert httpx.post(f"{engine}/v1/completions", json={"model": "tiny", "prompt": prompt(100 + i),
                                                                    "max_tokens": 2}).status_code == 200
                time.sleep(0.05)
        wait_for(lambda: hook.windows.dropped >= 3)
        assert "tiny" not in hook.ratios or hook.ratios["tiny"].answers == 0
        assert instance(url)["token_ratio"] == 1.0
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_token_ratio_windows_total{engine="e0",result="dropped"}' in metrics
        assert 'result="learned"' not in metrics


def test_windows_of_instances_that_left_are_forgotten() -> None:
    from router.engines.readings import EngineReading

    with routed() as (_, _, app):
        hook = app.state.service.token_ratio
        for i in range(40):  # instances scraped once and gone (discovery churn)
            hook.scraped(f"gone-{i}", EngineReading(answered_prompt_tokens=10.0, answered_requests=1.0))
        assert len(hook.windows) <= len(app.state.pool) + 17
