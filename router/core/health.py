"""Active health checks: ``GET /health`` on every known instance, in one background task."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from router.config.model import HealthConfig
from router.core.instances import Instance, InstancePool


class HealthChecker:
    """Polls ``GET /health`` on every instance; runs as one background task.

    An instance that comes back after being down has most likely restarted with an empty
    cache, so ``on_recovered`` (the state store's forget_instance) drops its residency."""

    def __init__(
        self,
        pool: InstancePool,
        client: httpx.AsyncClient,
        config: HealthConfig,
        on_recovered: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._pool = pool
        self._client = client
        self._config = config
        self._on_recovered = on_recovered

    async def check(self, inst: Instance) -> None:
        try:
            resp = await self._client.get(f"{inst.url}/health", timeout=self._config.timeout_s)
            ok = resp.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            if self._pool.record_success(inst.id) and self._on_recovered is not None:
                await self._on_recovered(inst.id)
        else:
            self._pool.record_failure(inst.id)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(i) for i in self._pool))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            await self.check_all()
