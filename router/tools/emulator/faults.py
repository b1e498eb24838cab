"""Fault injection: make an engine fail in ways a router must survive.

Why: failover, retries and health checking can only be tested if an engine
can be told to misbehave on demand, identically from a flag at start-up and
from ``POST /emulator/faults`` at runtime. Every mode is visible to a client:

* ``error_rate``: that fraction of generation requests gets HTTP 503.
* ``stall_rate`` / ``stall_seconds``: the request is accepted, then nothing is
  sent for N seconds (forever if N <= 0) before it is served normally.
* ``die_after_tokens``: the connection is dropped after N tokens (mid-stream,
  or mid-body for non-streaming requests).
* ``crash_on_request``: the whole process exits on the next request.
* ``slowdown``: every engine step takes that many times longer.
* ``unhealthy``: /health answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys
from collections.abc import Awaitable, Callable

from router.tools.emulator.config import FaultConfig

CRASH_EXIT_CODE = 17

log = logging.getLogger(__name__)


class ConnectionDropped(Exception):
    """Raised inside a response body to make the server abort the connection."""


class FaultInjector:
    """Current fault settings plus a seeded RNG for the probabilistic ones."""

    def __init__(self, config: FaultConfig, seed: int,
                 on_change: Callable[[FaultConfig], None] | None = None) -> None:
        config.validate()
        self._config = config
        self._rng = random.Random(seed)
        self._on_change = on_change

    @property
    def config(self) -> FaultConfig:
        return self._config

    def update(self, changes: dict[str, object]) -> FaultConfig:
        """Apply a partial update (ValueError on bad input); returns the result."""
        self._config = self._config.updated(changes)
        if self._on_change is not None:
            self._on_change(self._config)
        log.warning("faults now %s", self._config)
        return self._config

    def reset(self) -> FaultConfig:
        self._config = FaultConfig()
        if self._on_change is not None:
            self._on_change(self._config)
        return self._config

    def crash_if_armed(self) -> None:
        if self._config.crash_on_request:
            sys.stderr.write("emulator: crash fault triggered, exiting\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)

    def should_error(self) -> bool:
        rate = self._config.error_rate
        return rate > 0 and self._rng.random() < rate

    def stall_duration(self) -> float | None:
        """Seconds to stall this request (inf = forever) or None."""
        cfg = self._config
        if cfg.stall_rate <= 0 or self._rng.random() >= cfg.stall_rate:
            return None
        return cfg.stall_seconds if cfg.stall_seconds > 0 else float("inf")

    def drop_after(self) -> int:
        """Tokens to deliver before dropping the connection (-1 = never)."""
        return self._config.die_after_tokens


async def stall(seconds: float, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
    """Sleep ``seconds`` (inf = until the client goes away)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        remaining = end - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(remaining, 0.25))
        if await is_disconnected():
            return


class DroppedConnectionLogFilter(logging.Filter):
    """Keep the server log quiet about connections we dropped on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return not isinstance(exc, ConnectionDropped)


def install_log_filter() -> None:
    """Attach the filter to uvicorn's error logger once (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DroppedConnectionLogFilter) for f in logger.filters):
        logger.addFilter(DroppedConnectionLogFilter())
