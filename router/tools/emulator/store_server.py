"""The shared KV store as a service, for an emulated cluster of HTTP engines.

Why a server of its own: emulated engines run in separate threads or processes, and a store
is shared by all of them (one Mooncake Store / LMCache server behind a cluster). Engines
started with ``--kv-store-url`` look up the leading blocks of each prompt here on arrival,
load the ones they lack once admitted (``POST /store/load`` returns when the bytes have
crossed the store's bandwidth, shared with every other load in flight: links.AsyncLink) and
write the blocks they compute. ``GET /store/stats`` counts lookups, hits, loads and writes.

``python -m router.tools.emulator.store_server --port P --capacity-tokens N --gbps G``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.tools.emulator.kvstore import KVStore
from router.tools.emulator.links import AsyncLink
from router.tools.process import bind_socket

MAX_HASHES = 1 << 20
"""Most block hashes one call may carry (16M tokens at 16 per block)."""


@dataclass(frozen=True)
class StoreConfig:
    capacity_tokens: int = 10_000_000
    block_size: int = 16
    gbps: float = 100.0
    """Read bandwidth, Gbit/s, shared by concurrent loads."""
    time_scale: float = 1.0
    """Wall seconds per model second, as the engines' (loads sleep scaled)."""

    def validate(self) -> None:
        if self.gbps <= 0 or self.time_scale < 0:
            raise ValueError("gbps must be > 0 and time_scale >= 0")
        KVStore(self.capacity_tokens, self.block_size)  # raises on a store too small


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}}, status_code=status)


async def _body(request: Request) -> dict[str, object]:
    try:
        doc = json.loads(await request.body())
    except ValueError:
        raise ValueError("body is not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("body must be a JSON object")
    return doc


def _hashes(doc: dict[str, object]) -> list[int]:
    raw = doc.get("hashes")
    if not isinstance(raw, list) or len(raw) > MAX_HASHES or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in raw):
        raise ValueError(f"hashes must be a list of at most {MAX_HASHES} integers")
    return raw


def _count(doc: dict[str, object], name: str) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    return value


def build_store_app(config: StoreConfig) -> Starlette:
    config.validate()
    store = KVStore(config.capacity_tokens, config.block_size)
    link_box: list[AsyncLink] = []  # made in the serving loop (AsyncLink's events bind to it)

    def link() -> AsyncLink:
        if not link_box:
            link_box.append(AsyncLink(config.gbps * 1e9 / 8, config.time_scale))
        return link_box[0]

    async def handle(request: Request, op: Callable[[dict[str, object]], object]) -> Response:
        try:
            result = op(await _body(request))
            if asyncio.iscoroutine(result):
                result = await result
        except ValueError as exc:
            return _error(str(exc))
        return JSONResponse(result)

    async def lookup(request: Request) -> Response:
        return await handle(request, lambda d: {"blocks": store.lookup(_hashes(d))})

    async def put(request: Request) -> Response:
        return await handle(request, lambda d: {"new": store.put(_hashes(d))})

    async def load(request: Request) -> Response:
        async def op(d: dict[str, object]) -> dict[str, object]:
            blocks, nbytes = _count(d, "blocks"), _count(d, "bytes")
            await link().send(nbytes)
            store.loaded(blocks, nbytes)
            return {"blocks": blocks}
        return await handle(request, op)

    async def stats(request: Request) -> Response:
        return JSONResponse({**store.stats(), "gbps": config.gbps,
                             "loads_in_flight": link_box[0].in_flight if link_box else 0})

    async def reset(request: Request) -> Response:
        return JSONResponse({"dropped": store.reset()})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(routes=[
        Route("/store/lookup", lookup, methods=["POST"]), Route("/store/put", put, methods=["POST"]),
        Route("/store/load", load, methods=["POST"]), Route("/store/stats", stats, methods=["GET"]),
        Route("/store/reset", reset, methods=["POST"]), Route("/health", health, methods=["GET"]),
    ])
    app.state.store = store
    return app


@dataclass
class StoreHandle:
    url: str
    store: KVStore
    _stop: Callable[[], None] = field(repr=False, default=lambda: None)

    def stop(self) -> None:
        self._stop()

    def __enter__(self) -> StoreHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def start_store_in_thread(config: StoreConfig, host: str = "127.0.0.1", port: int = 0,
                          ready_timeout: float = 15.0) -> StoreHandle:
    """Serve a store from a daemon thread with its own event loop (tests, benchmarks)."""
    app = build_store_app(config)
    sock = bind_socket(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           loop="none", timeout_graceful_shutdown=1))

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        finally:
            sock.close()

    thread = threading.Thread(target=run, name="kv-store", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the KV store failed to start")
        time.sleep(0.005)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return StoreHandle(f"http://{host}:{sock.getsockname()[1]}", app.state.store, stop)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m router.tools.emulator.store_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = StoreConfig()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--capacity-tokens", type=int, default=d.capacity_tokens)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--gbps", type=float, default=d.gbps)
    p.add_argument("--time-scale", type=float, default=d.time_scale)
    args = p.parse_args(argv)
    config = StoreConfig(args.capacity_tokens, args.block_size, args.gbps, args.time_scale)
    try:
        app = build_store_app(config)
        sock = bind_socket(args.host, args.port)
    except (ValueError, OSError) as exc:
        print(f"kv store: {exc}", file=sys.stderr)
        return 2
    print(f"kv store listening on http://{args.host}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
