"""A Redis store's round trips: the queued writes in front of each call, a breaker around it.

Why apart from redis_store.py: the store decides what to send and what the replies mean;
this decides how a call goes out and what a failure leaves behind. Writes that need no
answer wait in the queue (redis_queue.py) and ride with the next call; a failed call puts
them back and counts against the breaker, which, once open, holds Redis off so decisions
use the replica's own view without waiting on it; a best-effort call (a release, a lease
refresh) counts an error and lets the leases expire instead of raising.
"""

from __future__ import annotations

import logging
from typing import Any

from router.state.breaker import Breaker, BreakerOpen
from router.state.redis_calls import FAILURES, Runner
from router.state.redis_layout import Layout, Op
from router.state.redis_queue import WriteQueue

log = logging.getLogger(__name__)


class Link:
    def __init__(self, layout: Layout, request_tokens: float, flush_s: float, breaker: Breaker) -> None:
        self.writes = WriteQueue(layout, request_tokens, flush_s, self.send_queued)
        self.breaker = breaker
        self.runner: Runner | None = None  # set when the store starts
        self.round_trips = 0
        self.errors = 0  # failed calls (and decisions that fell back to the local view: the store counts those)

    async def call(self, ops: list[Op]) -> list[Any]:
        """``ops`` in one round trip, with the queued writes in front of them; their replies."""
        assert self.runner is not None, "RedisStore.start() was not awaited"
        if not self.breaker.allow():
            raise BreakerOpen("state store breaker open")
        queued, taken = self.writes.take()
        self.round_trips += 1
        try:
            replies = await self.runner.run(queued + ops)
        except BaseException as exc:
            self.writes.restore(taken)
            if isinstance(exc, FAILURES):
                self.breaker.failure()
            raise
        self.breaker.success()
        return replies[len(queued):]

    async def send_queued(self) -> None:
        """The queued writes alone, in one round trip (a release, or the timer)."""
        if not self.writes or not self.breaker.allow():  # held off: they wait (or their leases expire)
            return
        try:
            await self.call([])
        except FAILURES as exc:
            self.errors += 1
            log.warning("state store batch of writes failed (leases will expire): %s", exc)

    async def best_effort(self, what: str, ops: list[Op]) -> None:
        """``ops`` in one round trip, a failure logged and counted: a failed release is not
        lost, the lease stops being refreshed and expires."""
        try:
            await self.call(ops)
        except FAILURES as exc:
            self.errors += 1
            if not isinstance(exc, BreakerOpen):
                log.warning("state store %s failed (lease will expire): %s", what, exc)
