"""What one ``pd-router serve`` process adds around the app built by ``create_app``.

Kept out of ``create_app`` because it belongs to the server process, not to an app: the
request-id logging context, (under ``--workers N``) copying the state store's counters
into the multiprocess metric files while the app runs, and the heap left to the cyclic
garbage collector.

Why freeze the heap once started: every object alive then (modules, FastAPI and pydantic
models, the config, the pool) stays for the process's life, yet each full collection walked
all of them again — ~100 ms a time, and with the young collections 11-15% of the router's
CPU under load (gc.callbacks around a plain and a streaming c=16 run). ``gc.freeze()``
after startup leaves them out of every later collection; what requests allocate is
collected as before.

And why a larger young generation (:data:`YOUNG_THRESHOLD` net allocations between young
collections instead of CPython's 700): a request allocates hundreds of container objects that
almost all die with it, yet each young collection walks those of every request in flight; at
700 one ran every few requests. 10,000 cut the router's CPU per request by 2-10% side by side
(session 9, docs/benchmarks.md) and holds at most that many objects' worth of cyclic garbage
(a few MB) a little longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI

from router.core.logs import ASGIApp, Receive, Scope, Send
from router.core.metrics import Metrics


YOUNG_THRESHOLD = 10_000  # net allocations between young collections (CPython's default: 700)


def freeze_heap() -> None:
    """What is alive now is left out of later collections (collected once first, so that
    startup's own garbage is not kept forever), and the young generation made larger."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def wrap(app: FastAPI) -> ASGIApp:
    metrics: Metrics = app.state.metrics

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        # The lifespan call lasts from startup to shutdown: the export runs alongside it.
        exporter = asyncio.create_task(metrics.export_forever(), name="pd-router-metrics-export")

        async def started(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                freeze_heap()
            await send(message)

        try:
            await app(scope, receive, started)
        finally:
            exporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await exporter

    return asgi
