"""Overload admission: at most ``limit`` requests in flight, a bounded queue behind them, 429 beyond.

Why: past its engines' capacity a router that takes everything only moves the queue into
its own memory and every client's latency; a bounded wait absorbs bursts, and a prompt 429
with ``Retry-After`` lets clients (and load balancers) back off or go elsewhere. FIFO: a
released slot goes to the longest waiter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.core.errors import Overloaded


class Overload:
    """``acquire`` before a request is served, ``release`` once its answer was sent (a stream: relayed to its end)."""

    def __init__(self, limit: int | None, queue: int, wait_s: float, retry_after_s: float) -> None:
        self.limit, self.queue, self.wait_s, self.retry_after_s = limit, queue, wait_s, retry_after_s
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.refused = 0

    async def acquire(self) -> None:
        """Take one of the ``limit`` slots (wait for one in the queue); Overloaded when none frees up.
        Every acquire is matched by one :meth:`release`."""
        if self.limit is None:
            return
        if self.active >= self.limit or self._waiters:
            await self._wait()
        else:
            self.active += 1

    def release(self) -> None:
        if self.limit is not None:
            self._release()

    async def _wait(self) -> None:
        if len(self._waiters) >= self.queue:
            self.refused += 1
            raise Overloaded(f"the router is at its limit of {self.limit} requests and {self.queue} waiting",
                             retry_after_s=self.retry_after_s)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.wait_s)  # a slot handed over just in time still counts
        except TimeoutError:
            self._drop(waiter)
            self.refused += 1
            raise Overloaded(f"no slot freed up within {self.wait_s:g}s", retry_after_s=self.retry_after_s) from None
        except asyncio.CancelledError:  # the client went away while waiting
            if waiter.done() and not waiter.cancelled():
                self._release()  # it had been handed a slot: pass it on
            else:
                self._drop(waiter)
            raise

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: active stays the same
                return
        self.active -= 1


class HeldResponse(Response):
    """Sends ``inner``, then gives its admission slot back, however the sending ends."""

    def __init__(self, inner: Response, admission: Overload) -> None:
        self._inner, self._admission = inner, admission
        self.status_code, self.background = inner.status_code, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            self._admission.release()
