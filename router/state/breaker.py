"""A circuit breaker for the shared state store.

Why: every routing decision makes one Redis round trip. When Redis hangs (SIGSTOP, a network
partition), each of those waits the full ``redis_timeout_s`` before falling back to the local
view, which multiplied the latency of every request for the whole outage. After
``failures`` consecutive failures the breaker opens: calls fail at once (the store decides on
its local mirror: degraded mode) except one probe every ``probe_s``, whose success closes it
again, so shared state is back within about ``probe_s`` + one timeout of Redis's return.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class BreakerOpen(RedisError):
    """Raised instead of calling a store the breaker holds open (no waiting, no log line)."""


class Breaker:
    def __init__(self, failures: int = 3, probe_s: float = 0.5) -> None:
        self._threshold = failures
        self._probe_s = probe_s
        self._failures = 0
        self._opened_at: float | None = None  # monotonic; None = closed
        self._probing = False  # one probe at a time while open

    @property
    def open(self) -> bool:
        return self._opened_at is not None

    def allow(self) -> bool:
        """May a call go out now? While open: only one probe per ``probe_s``."""
        if self._opened_at is None:
            return True
        now = time.monotonic()
        if self._probing or now - self._opened_at < self._probe_s:
            return False
        self._probing, self._opened_at = True, now  # the next probe comes probe_s after this one
        return True

    def success(self) -> None:
        if self._opened_at is not None:
            log.warning("state store reachable again: shared state resumed")
        self._failures, self._opened_at, self._probing = 0, None, False

    def failure(self) -> None:
        self._probing = False
        self._failures += 1
        if self._opened_at is None and self._failures >= self._threshold:
            self._opened_at = time.monotonic()
            log.error("state store failed %d times in a row: degraded mode (local view), probing every %.1fs",
                      self._failures, self._probe_s)
