"""What one attempt of a request comes to, and what the earlier attempts ruled out.

An attempt is either :class:`Served` (an answer for the client: relayed, or an engine's error
passed back) or :class:`Retry` (move elsewhere); a failure nothing else can fix is raised as
a RouterError. Typed so the retry loop reads what happened rather than decoding a ``None``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
from starlette.responses import Response

from router.core.errors import RouterError, UpstreamFailure, UpstreamTimeout
from router.core.instances import Instance


@dataclass(frozen=True, slots=True)
class Served:
    response: Response


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again without ``exclude``. ``failure`` is what the client gets if no other attempt
    can be made (None: "no healthy instance"); ``local_only`` restricts the next attempts to
    instances that prefill themselves; ``prefill`` marks a failed prefill leg."""

    reason: str
    exclude: str
    failure: RouterError | None = None
    prefill: bool = False
    local_only: bool = False


AttemptOutcome = Served | Retry


@dataclass
class Tried:
    """What the attempts of one request so far ruled out."""

    exclude: set[str] = field(default_factory=set)
    candidates: int = 0  # instances able to answer in the last round
    prefill_failures: int = 0
    local_only: bool = False
    last: Retry | None = None
    disconnected: bool = False  # the client went away: the attempt in flight is cancelled

    def record(self, retry: Retry) -> None:
        self.exclude.add(retry.exclude)
        self.prefill_failures += retry.prefill
        self.local_only = self.local_only or retry.local_only
        self.last = retry

    def give_up(self, otherwise: RouterError) -> RouterError:
        """The error to answer once no attempt is left: the last failure's, else ``otherwise``."""
        if self.last is not None and self.last.failure is not None:
            return self.last.failure
        return otherwise


def transport_failure(instance: str, exc: httpx.TransportError) -> RouterError | None:
    """What the client gets for ``exc`` if no other instance can take over (None: no capacity)."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return None  # never reached the instance: nothing healthy left, not an engine failure
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"instance {instance} did not answer in time")
    return UpstreamFailure(f"instance {instance} failed before answering ({type(exc).__name__})")


class give_up_when_down:  # noqa: N801  (used as a function: ``with give_up_when_down(inst, deadline):``)
    """While the block waits on ``inst``, the active checks taking it out end the wait at once,
    as a timeout: a hung engine's JSON answer (whose headers come with its last byte) is then
    retried elsewhere instead of waiting out ``proxy.request_timeout_s``. A class rather than a
    ``@contextmanager`` generator: it is on every request's path (~1% of its CPU as a generator).

    With ``deadline`` (a block that has a timeout anyway: a stream's first byte), giving up
    moves it to now. Without one, giving up cancels the task and the block raises
    TimeoutError, as an ``asyncio.timeout(None)`` around it would (the same cancel/uncancel
    rule: a cancellation from elsewhere stays a cancellation), without a Timeout object and
    its loop look-ups on every JSON request."""

    __slots__ = ("_inst", "_deadline", "_task", "_cancelling", "_fired")

    def __init__(self, inst: Instance, deadline: asyncio.Timeout | None = None) -> None:
        self._inst, self._deadline = inst, deadline
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._fired = False

    def _give_up(self) -> None:
        if self._deadline is not None:
            self._deadline.reschedule(asyncio.get_running_loop().time())
        elif not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel()

    def __enter__(self) -> None:
        if self._deadline is None:
            self._task = task = asyncio.current_task()
            self._cancelling = task.cancelling() if task is not None else 0
        self._inst.on_down.add(self._give_up)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._inst.on_down.discard(self._give_up)
        if (self._fired and kind is asyncio.CancelledError and self._task is not None
                and self._task.uncancel() <= self._cancelling):
            raise TimeoutError from exc
