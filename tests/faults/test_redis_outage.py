"""Issue 10, finding 10: a hung Redis added redis_timeout_s to every request for the whole
outage. With the breaker: 0 failed requests, p50 during a freeze within 2x normal, degraded
mode flagged in /ready and /metrics, shared state back within 5 s of Redis's return."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import redis

from router.state.redis_layout import Layout

from faults.conftest import router  # type: ignore[import-not-found]
from servers import FakeBackend, free_port, redis_binary, serve_app

BODY = {"model": "m", "prompt": "shared state survives its store " * 10, "max_tokens": 4}


def start_redis(port: int) -> subprocess.Popen[bytes]:
    binary = redis_binary()
    assert binary, "no redis-server"
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tempfile.mkdtemp(prefix="pdr-outage-")], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)


@contextmanager
def redis_servers(port: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Redis servers started on ``port`` (the list grows on restarts); all killed at the end."""
    procs = [start_redis(port)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)


def timed(url: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        r = httpx.post(f"{url}/v1/completions", json={**BODY, "prompt": f"{i} {BODY['prompt']}"}, timeout=10)
        assert r.status_code == 200, r.text
        out.append(time.perf_counter() - started)
    return out


def shared_requests(port: int, prefix: str) -> int:
    """Requests other replicas would see booked on instance a (read straight from Redis)."""
    raw = redis.Redis(port=port, decode_responses=True).hget(Layout(prefix).loads_key("a"), "a")
    return int(raw.split(":")[0]) if raw else 0


def test_redis_frozen_then_killed_under_load():
    port = free_port()
    engine = FakeBackend("a", first_byte_s=0.05)
    state = {"backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0", "key_prefix": "outage",
             "redis_timeout_s": 0.2, "breaker_probe_s": 0.5}
    with redis_servers(port) as procs, serve_app(engine.app()) as backend, \
            router([{"url": backend, "name": "a"}], state=state) as (url, app):
        proc = procs[0]
        normal = statistics.median(timed(url, 20))
        store = app.state.store

        os.kill(proc.pid, signal.SIGSTOP)  # hung: every call would wait redis_timeout_s
        frozen = timed(url, 40)
        assert store.degraded
        assert httpx.get(f"{url}/ready").json()["details"] == {"state_store": "degraded"}
        assert "pd_router_state_degraded 1.0" in httpx.get(f"{url}/metrics").text
        assert statistics.median(frozen) <= 2 * normal, (normal, statistics.median(frozen))

        os.kill(proc.pid, signal.SIGCONT)
        back = time.monotonic()
        while store.degraded and time.monotonic() - back < 5:
            timed(url, 1)
        assert not store.degraded and time.monotonic() - back < 5
        assert "details" not in httpx.get(f"{url}/ready").json()

        assert_shared_again(url, port, engine)

        proc.kill()  # SIGKILL: connections refused at once
        proc.wait(timeout=10)
        killed = timed(url, 20)  # all answered (timed asserts 200), none waiting on a dead store: as fast as normal
        assert statistics.median(killed) <= 2 * normal, (normal, statistics.median(killed))
        assert store.degraded
        procs.append(start_redis(port))  # back, empty, on the same address
        back = time.monotonic()
        while store.degraded and time.monotonic() - back < 5:
            timed(url, 1)
        assert not store.degraded and time.monotonic() - back < 5
        assert_shared_again(url, port, engine)


def assert_shared_again(url: str, port: int, engine: FakeBackend) -> None:
    """A slow stream is booked in the shared view (what other replicas route on), then released."""
    engine.chunk_s = 0.5
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=10) as r:
            chunks = r.iter_raw()
            next(chunks)
            assert shared_requests(port, "outage") == 1
            for _ in chunks:
                pass
        assert shared_requests(port, "outage") == 0
    finally:
        engine.chunk_s = 0.0
