"""What one ``pd-router serve`` process adds around the app built by ``create_app``.

Kept out of ``create_app`` because it belongs to the server process, not to an app: the
request-id logging context, and (under ``--workers N``) copying the state store's counters
into the multiprocess metric files while the app runs.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI

from router.core.logs import ASGIApp, Receive, Scope, Send
from router.core.metrics import Metrics


def wrap(app: FastAPI) -> ASGIApp:
    metrics: Metrics = app.state.metrics

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        # The lifespan call lasts from startup to shutdown: the export runs alongside it.
        exporter = asyncio.create_task(metrics.export_forever(), name="pd-router-metrics-export")
        try:
            await app(scope, receive, send)
        finally:
            exporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await exporter

    return asgi
