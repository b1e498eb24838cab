"""Issue 10, finding 8: idle sockets that send nothing used to be held forever and, past the
file limit, denied service to every other client with nothing logged."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from router.config.model import load_config
from router.gateway.app import create_app
from router.gateway.connections import ConnectionLimits, GuardedProtocols, connection_cap
from servers import FakeBackend, free_port, serve_app


@contextmanager
def guarded_router(backend: str, limits: ConnectionLimits) -> Iterator[str]:
    app = create_app(load_config(overrides={"instances": [{"url": backend, "name": "a"}], "health": {"interval_s": 60}}))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="asyncio",
                            http=GuardedProtocols(limits), timeout_keep_alive=1)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


BODY = {"model": "m", "prompt": "hello", "max_tokens": 2}


def test_idle_and_slow_heads_are_cut_and_the_cap_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="router")
    with serve_app(FakeBackend("a").app()) as backend, \
            guarded_router(backend, ConnectionLimits(max_connections=20, header_timeout_s=0.5)) as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # the cap, all silent
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", port))
        assert closed_by_peer(extra, 2)  # beyond the cap: closed at once ...
        assert any("connection cap reached" in r.getMessage() for r in caplog.records)  # ... and said so
        assert all(closed_by_peer(s, 2) for s in idle)  # no request head within 0.5 s: closed
        slow = socket.create_connection(("127.0.0.1", port))
        for byte in b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n":  # a head that trickles in
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
        assert closed_by_peer(slow, 2)
        with httpx.Client() as client:  # everyone else is served as before
            assert client.post(f"{url}/v1/completions", json=BODY).status_code == 200
            time.sleep(1.5)  # idle keep-alive connection: closed by timeout_keep_alive, reopened by httpx
            assert client.post(f"{url}/v1/completions", json=BODY).status_code == 200
        huge = httpx.post(f"{url}/v1/completions", json=BODY, headers={"x-big": "a" * 100_000})
        assert huge.status_code == 431 and huge.json()["error"]["code"] == "headers_too_large"
        for s in [*idle, extra, slow]:
            s.close()


def _request(sock: socket.socket) -> bytes:
    body = b'{"model": "m", "prompt": "hello", "max_tokens": 2}'
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%b" % (len(body), body))
    sock.settimeout(5)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n", 1)[0]


def test_a_busy_kept_alive_connection_outlives_both_deadlines_and_each_wait_is_still_cut(caplog):
    """One timer per connection carries the head deadline and the keep-alive wait: requests
    coming faster than either keep the connection open well past both timeouts, an idle one
    is closed after keep-alive, a later request whose head stalls is closed by the head rule."""
    caplog.set_level(logging.INFO, logger="router")
    with serve_app(FakeBackend("a").app()) as backend, \
            guarded_router(backend, ConnectionLimits(max_connections=20, header_timeout_s=0.6)) as url:
        port = int(url.rsplit(":", 1)[1])
        busy = socket.create_connection(("127.0.0.1", port))
        until = time.monotonic() + 2.5  # > timeout_keep_alive (1 s) and > header_timeout_s
        while time.monotonic() < until:
            assert _request(busy) == b"HTTP/1.1 200 OK"
            time.sleep(0.25)
        started = time.monotonic()
        assert closed_by_peer(busy, 3)  # idle after its answer: cut by the keep-alive wait ...
        assert 0.5 < time.monotonic() - started < 2.5  # ... about 1 s later
        stalled = socket.create_connection(("127.0.0.1", port))
        assert _request(stalled) == b"HTTP/1.1 200 OK"
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\n")  # the next head begins, never ends
        assert closed_by_peer(stalled, 3)
        assert any("no complete request head" in r.getMessage() for r in caplog.records)
        busy.close()
        stalled.close()


def test_the_cap_stays_below_the_file_limit():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10**9, 1000) <= soft - 1000
    assert connection_cap(10, 1000) == min(10, max(1, soft - 1064))


@contextmanager
def guarded_app(backend: FakeBackend) -> Iterator[tuple[str, object]]:
    """The router app in front of ``backend``, served as ``serve`` serves it (GuardedProtocols)."""
    with serve_app(backend.app()) as backend_url:
        app = create_app(load_config(overrides={"instances": [{"url": backend_url, "name": "a"}],
                                                "health": {"interval_s": 60}}))
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="asyncio", lifespan="on",
                                http=GuardedProtocols(ConnectionLimits(100, 5.0)))  # type: ignore[arg-type]
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}", app
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def booked_requests(app) -> int:
    return app.state.store.snapshot_now([], ["a"]).loads["a"].requests


def released_within(app, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while booked_requests(app) and time.monotonic() < deadline:
        time.sleep(0.02)
    return booked_requests(app) == 0


def test_a_client_gone_before_its_json_answer_is_released_at_once_by_the_servers_signal(caplog):
    """The server's disconnect signal (router/core/disconnect.py), not a watcher task, cancels it."""
    caplog.set_level(logging.INFO, logger="router")
    with guarded_app(FakeBackend("a", first_byte_s=5)) as (url, app):
        try:
            httpx.post(f"{url}/v1/completions", json=BODY, timeout=0.5)
        except httpx.ReadTimeout:
            pass
        assert released_within(app, 2.0)
    assert any("client_disconnect before the answer" in r.getMessage() for r in caplog.records)


def test_a_client_gone_mid_stream_is_released_by_the_servers_signal():
    with guarded_app(FakeBackend("a", chunk_s=0.5, chunks=10)) as (url, app):
        with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=10) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert booked_requests(app) == 1
        assert released_within(app, 2.0)
