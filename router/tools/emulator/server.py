"""ASGI app factory for one emulated engine.

Why plain Starlette: the emulator's hot path is streaming tokens, and it
needs no request models or OpenAPI docs; FastAPI would only add per-request
overhead. The app owns an EmulatorRuntime (``app.state.runtime``) whose
engine driver and PD listeners start and stop with the app's lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from router.tools.emulator import api_admin, api_metrics, api_openai
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.runtime import EmulatorRuntime


def build_app(config: EmulatorConfig) -> Starlette:
    """An app serving ``config``'s flavour and role; the engine starts on startup."""
    runtime = EmulatorRuntime(config)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = Starlette(
        routes=api_openai.routes() + api_metrics.routes(config.flavor) + api_admin.routes(),
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    return app
