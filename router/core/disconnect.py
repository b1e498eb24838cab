"""A client's disconnect as a callback, set up by the HTTP server in the request's scope.

Why: "a gone client cancels its request upstream" used to cost a watcher task per request
(and a second one per stream), each parked on ASGI ``receive()`` until it was cancelled:
created, started, cancelled, finalised — ~4% of the CPU of a request. The router's own
server protocol (router/gateway/connections.py) knows when a connection is lost; it puts a
:class:`Disconnect` in the scope and fires it then. Code that finds none (another server, an
in-process test transport) watches ``receive()`` as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

SCOPE_KEY = "pd_router.disconnect"  # an ASGI scope extension key
log = logging.getLogger(__name__)


class Disconnect:
    """Callbacks to run once, when the client's connection is lost before the answer ended."""

    __slots__ = ("_callbacks", "fired")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.fired = False

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(callback)
        except ValueError:
            pass

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one broken callback must not keep the others from running
                log.exception("disconnect callback failed")


def disconnect_of(scope: MutableMapping[str, Any]) -> Disconnect | None:
    """The request's disconnect signal, when its server provides one."""
    signal = scope.get(SCOPE_KEY)
    return signal if isinstance(signal, Disconnect) else None


def on_disconnect(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                  callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` if the client goes away; returns the function that stops watching.

    Through the scope's :class:`Disconnect` when the server set one (no task), else by a
    task reading ``receive()`` until ``http.disconnect``."""
    signal = disconnect_of(scope)
    if signal is not None:
        if signal.fired:  # gone already: as a watcher would, at the next suspension
            return asyncio.get_running_loop().call_soon(callback).cancel
        signal.add(callback)
        return lambda: signal.discard(callback)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        callback()

    watcher = asyncio.get_running_loop().create_task(watch())

    def stop() -> None:
        watcher.cancel()

    return stop
