"""Run the end of a request's bookkeeping to completion: inline when it never suspends.

Why: the end of every request (release what it booked, metrics, the access log) must not
be cut short by a cancellation, so it ran under ``anyio.CancelScope(shield=True)`` —
about 5% of a request's CPU (the scope looks up the async library through sniffio and
the current task on every enter, exit and construction). With the in-memory store that
end never suspends at all, and a coroutine that does not suspend cannot be cancelled.
:func:`shielded` therefore runs the first step inline; only a coroutine that suspends
continues under the shielded scope, in the same task (so whatever it holds of the task —
a timeout, a cancel scope — stays valid).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """``await coro``, shielded from anyio cancel scopes once it suspends (as
    ``with anyio.CancelScope(shield=True): await coro``), at no cost when it never does."""
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except BaseException:
        coro.close()
        raise
    with anyio.CancelScope(shield=True):
        result: T = await _Rest(coro, pending)
    return result


class _Rest:
    """The remainder of a coroutine whose first step already ran: awaiting it is ``yield from``
    the coroutine, resumed where it suspended."""

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro, self._pending = coro, pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._pending
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown into the awaiting task (a cancellation): the coroutine's to handle
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value
