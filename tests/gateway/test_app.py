"""End to end over real sockets: router + fake backends on loopback."""

import asyncio
import time
from collections import Counter
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from router.gateway.app import create_app
from router.config.model import load_config
from servers import FakeBackend, free_port, serve_app

TOKEN = "s3cret"
SHARED = "You are a meticulous assistant for the ACME support desk. " * 40  # ~2.3k chars


@contextmanager
def cluster(*backends, policy="ttft", extra_instances=(), **overrides):
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in backends]
        instances = [{"url": u, "name": b.name} for u, b in zip(urls, backends)] + list(extra_instances)
        config = load_config(overrides={
            "instances": instances,
            "policy": {"name": policy, "seed": 1},
            "server": {"admin_token": TOKEN},
            "health": {"interval_s": 60},
            **overrides,
        })
        app = create_app(config)
        router_url = stack.enter_context(serve_app(app))
        yield router_url, app


def completion(i, shared=SHARED, stream=False, **kw):
    return {"model": "m", "prompt": f"{shared} Question {i}: why is item {i * 7919} late?", "max_tokens": 8, "stream": stream, **kw}


def loads(url):
    """Requests booked per instance, read through the admin API."""
    r = httpx.get(f"{url}/debug/instances", headers={"authorization": f"Bearer {TOKEN}"})
    return {i["id"]: i["load"]["requests"] for i in r.json()["instances"]}


def test_repeated_prefix_sticks_to_one_backend():
    a, b = FakeBackend("a"), FakeBackend("b")
    with cluster(a, b) as (url, app):
        for i in range(12):
            r = httpx.post(f"{url}/v1/completions", json=completion(i))
            assert r.status_code == 200, r.text
    counts = Counter({"a": len(a.received), "b": len(b.received)})
    assert counts.most_common(1)[0][1] == 12, counts


def test_different_prefixes_spread():
    a, b = FakeBackend("a"), FakeBackend("b")
    with cluster(a, b) as (url, app):
        for i in range(40):
            httpx.post(f"{url}/v1/completions", json=completion(i, shared=f"tenant {i} " * 100))
    assert min(len(a.received), len(b.received)) >= 8


async def test_burst_with_one_shared_prefix_is_spread():
    # The first byte takes 2 s so that all 40 are in flight at once even on a slow host: when
    # the host is slow enough that the first answers come back before the last requests are
    # decided, the burst is a trickle, the holder's queue never builds, and keeping every
    # request at its home is then the right answer (a copy costs more than the short queue).
    a, b = FakeBackend("a", first_byte_s=2.0, chunk_s=0.05), FakeBackend("b", first_byte_s=2.0, chunk_s=0.05)
    with cluster(a, b) as (url, app):
        async with httpx.AsyncClient(timeout=30) as client:
            rs = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=completion(i, stream=True)) for i in range(40)))
        assert all(r.status_code == 200 for r in rs)
        assert loads(url) == {"a": 0, "b": 0}
    share = max(len(a.received), len(b.received)) / 40
    print(f"herding split: a={len(a.received)} b={len(b.received)}")
    assert share <= 0.75


def test_stream_is_relayed_incrementally():
    slow = FakeBackend("slow", chunk_s=0.6, chunks=3)
    with cluster(slow) as (url, app):
        started = time.perf_counter()
        with httpx.stream("POST", f"{url}/v1/completions", json=completion(1, stream=True), timeout=10) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            first = next(line for line in lines if line)
            first_at = time.perf_counter() - started
            rest = [line for line in lines if line]
        total = time.perf_counter() - started
    assert first.startswith("data: ") and rest[-1] == "data: [DONE]"
    assert total >= 1.2 and first_at < total / 2


def test_client_disconnect_mid_stream_releases_load():
    slow = FakeBackend("slow", chunk_s=0.5, chunks=10)
    with cluster(slow) as (url, app):
        with httpx.stream("POST", f"{url}/v1/completions", json=completion(1, stream=True), timeout=10) as r:
            lines = r.iter_lines()  # keep a reference: a collected iterator closes the stream
            assert next(lines).startswith("data: ")
            assert loads(url)["slow"] == 1
        # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 5
        while loads(url)["slow"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loads(url)["slow"] == 0


@pytest.mark.parametrize(
    "path, content",
    [
        ("/v1/completions", b"{broken"),
        ("/v1/completions", b'{"prompt": "hi"}'),
        ("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": -5}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": "hi"}'),
        ("/v1/chat/completions", b'{"model": 1, "messages": [{"role": "user", "content": "x"}]}'),
    ],
)
def test_bad_input_is_rejected_before_forwarding(path, content):
    a = FakeBackend("a")
    with cluster(a) as (url, app):
        r = httpx.post(url + path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["message"] and err["type"] == "invalid_request_error" and err["code"]
        assert a.received == [] and loads(url) == {"a": 0}


def test_oversized_body_is_413_and_unknown_route_404():
    a = FakeBackend("a")
    with cluster(a, proxy={"max_body_bytes": 4096}) as (url, app):
        r = httpx.post(f"{url}/v1/completions", json=completion(1, shared="x" * 5000))
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        r = httpx.get(f"{url}/v2/nothing")
        assert r.status_code == 404 and "error" in r.json()
        assert a.received == []


def test_no_healthy_instance_is_503_with_retry_after():
    dead = {"url": f"http://127.0.0.1:{free_port()}", "name": "dead"}
    with cluster(extra_instances=[dead]) as (url, app):
        r = httpx.post(f"{url}/v1/completions", json=completion(1))
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["error"]["code"] == "no_healthy_instance"
        assert httpx.get(f"{url}/ready").status_code == 503
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/v1/models").status_code == 503


def test_dead_instance_is_skipped_and_models_survive_it():
    a = FakeBackend("a")
    port = free_port()
    dead = {"url": f"http://127.0.0.1:{port}", "name": "dead"}
    with cluster(a, extra_instances=[dead]) as (url, app):
        app.state.pool.get("dead").healthy = True  # pretend the start-up check missed it
        for i in range(6):
            assert httpx.post(f"{url}/v1/completions", json=completion(i, shared=f"p{i}" * 300)).status_code == 200
        assert len(a.received) == 6 and not app.state.pool.get("dead").healthy
        models = httpx.get(f"{url}/v1/models").json()
        assert {m["id"] for m in models["data"]} == {"model-a", "m", "shared"}


def test_upstream_errors_pass_through_and_503_is_retried_elsewhere():
    bad, good = FakeBackend("bad", status=400), FakeBackend("good")
    with cluster(bad) as (url, app):
        r = httpx.post(f"{url}/v1/completions", json=completion(1))
        assert r.status_code == 400 and r.json()["error"]["message"] == "bad says no"
        assert loads(url) == {"bad": 0}
    busy = FakeBackend("busy", status=503)
    with cluster(busy, good) as (url, app):
        for i in range(4):
            assert httpx.post(f"{url}/v1/completions", json=completion(i, shared=f"q{i}" * 300)).status_code == 200
        assert len(good.received) == 4
        assert loads(url) == {"busy": 0, "good": 0}


def test_metrics_and_admin_routes():
    a = FakeBackend("a")
    with cluster(a) as (url, app):
        httpx.post(f"{url}/v1/completions", json=completion(1, stream=True))
        text = httpx.get(f"{url}/metrics").text
        for name in ("pd_router_requests_total", "pd_router_request_duration_seconds", "pd_router_time_to_first_byte_seconds",
                     "pd_router_decisions_total", "pd_router_estimated_cached_prefix_ratio", "pd_router_inflight_requests",
                     "pd_router_state_store_seconds", "pd_router_instance_healthy"):
            assert name in text, name
        assert 'pd_router_requests_total{engine="a",model="",outcome="ok"} 1.0' in text
        assert httpx.get(f"{url}/debug/instances").status_code == 401
        r = httpx.get(f"{url}/debug/instances", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["instances"][0]["healthy"] is True


def test_forwarded_body_and_headers():
    a = FakeBackend("a")
    with cluster(a) as (url, app):
        body = completion(1) | {"temperature": 0.3, "custom_field": [1, 2]}
        r = httpx.post(f"{url}/v1/completions", json=body, headers={"x-request-id": "abc-123", "cookie": "secret"})
        assert r.headers["x-request-id"] == "abc-123"
    seen = a.received[0]
    assert seen["body"] == body and seen["headers"]["x-request-id"] == "abc-123" and "cookie" not in seen["headers"]
    assert seen["headers"]["accept-encoding"] == "identity"  # bytes are relayed as they come: no compression


def test_a_cookie_set_by_an_engine_is_never_replayed():
    a = FakeBackend("a", set_cookie="session=engine-a")
    with cluster(a) as (url, app):
        for i in range(2):
            r = httpx.post(f"{url}/v1/completions", json=completion(i, stream=i == 1))
            assert r.status_code == 200
    assert all("cookie" not in seen["headers"] for seen in a.received)
