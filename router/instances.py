"""The instances the router knows (from config only: it never contacts anything else)
and their health, kept by active checks and by failures seen while proxying."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from router.config import HealthConfig, InstanceConfig, RouterConfig
from router.policy.base import Candidate

log = logging.getLogger(__name__)


@dataclass
class Instance:
    config: InstanceConfig
    candidate: Candidate
    healthy: bool = True
    failures: int = 0
    successes: int = 0

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def url(self) -> str:
        return self.config.url


class InstancePool:
    def __init__(self, config: RouterConfig) -> None:
        self._health = config.health
        self._instances = {
            ic.id: Instance(ic, Candidate(ic.id, ic.cache_tokens, ic.prefill_tokens_per_s)) for ic in config.instances
        }

    def __iter__(self):
        return iter(self._instances.values())

    def get(self, instance_id: str) -> Instance:
        return self._instances[instance_id]

    def healthy(self, roles: Iterable[str], exclude: Iterable[str] = ()) -> list[Instance]:
        roles, skip = set(roles), set(exclude)
        return [i for i in self._instances.values() if i.healthy and i.config.role in roles and i.id not in skip]

    def any_healthy(self) -> bool:
        return any(i.healthy for i in self._instances.values())

    def caps(self, block_tokens: int) -> dict[str, int]:
        return {i.id: max(1, i.config.cache_tokens // block_tokens) for i in self._instances.values()}

    # -- health bookkeeping ----------------------------------------------------------------
    def record_success(self, instance_id: str) -> None:
        inst = self._instances[instance_id]
        inst.failures = 0
        inst.successes += 1
        if not inst.healthy and inst.successes >= self._health.successes_to_healthy:
            inst.healthy = True
            log.info("instance %s is healthy again", inst.id)

    def record_failure(self, instance_id: str, *, fatal: bool = False) -> None:
        """A failed check or request; ``fatal`` (connection refused) marks it down at once."""
        inst = self._instances[instance_id]
        inst.successes = 0
        inst.failures += 1
        if inst.healthy and (fatal or inst.failures >= self._health.failures_to_unhealthy):
            inst.healthy = False
            log.warning("instance %s marked unhealthy after %d failure(s)", inst.id, inst.failures)


class HealthChecker:
    """Polls ``GET /health`` on every instance; runs as one background task."""

    def __init__(self, pool: InstancePool, client: httpx.AsyncClient, config: HealthConfig) -> None:
        self._pool = pool
        self._client = client
        self._config = config

    async def check(self, inst: Instance) -> None:
        try:
            resp = await self._client.get(f"{inst.url}/health", timeout=self._config.timeout_s)
            ok = resp.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._pool.record_success(inst.id)
        else:
            self._pool.record_failure(inst.id)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(i) for i in self._pool))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            await self.check_all()
