"""The events around one proxied attempt, and the hooks that subscribe to them.

Why events: booking, residency, calibration, metrics and the access log each react to the same
few moments of an attempt. The service only says when they happen (it emits); what each
concern does about it lives in its own hook (router/request/hooks.py), and none knows another.

One attempt is one routed try of a request on one route (a retry is a new attempt):

  before_send  the route was booked; the attempt is about to go out
  first_byte   the answer's first byte arrived: prefill is over
  end          the answer was relayed to its end: ``ok``, ``upstream_error`` or ``client_disconnect``
  abandon      the attempt failed before an answer could be relayed (see :class:`Abandon`)

After ``before_send`` comes exactly one of ``end`` and ``abandon``, once; ``first_byte`` at
most once, before ``end``. Hooks run in the order given, each event to every hook: a hook
that raises is logged and skipped, so bookkeeping of one kind never breaks another, nor the
client's answer. ``abandon`` runs its hooks to the end even if the caller is cancelled;
``end`` relies on its emitter for that (the relay runs it in a shielded ``finally``, and adds
no task per request on the hot path).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from router.core.instances import Instance
from router.engines.token_ratio import reported_prompt_tokens
from router.scheduling.decide import Routed
from router.upstream.relay import Outcome

log = logging.getLogger(__name__)

AbandonKind = Literal["retry", "passed", "failed", "client_disconnect"]


@dataclass(slots=True, eq=False)
class Attempt:
    """What one attempt holds, filled in as it goes; hooks read it, the emitter writes it."""

    request_id: str
    routed: Routed  # the decision and what it booked
    instance: Instance  # the instance that answers (the decode leg of a disaggregated route)
    prefill: Instance | None = None  # the remote prefill leg, if any
    prefill_s: float | None = None  # how long the prefill leg took, when the router ran it on its own
    streaming: bool = False  # the answer is an event stream (known once its headers arrived)
    first_byte_s: float | None = None  # since the decision began, set just before first_byte runs
    duration_s: float | None = None  # since the decision began, set just before end/abandon run
    finished: bool = False  # end or abandon ran
    # the prompt's tokens as the router estimated them from its characters (None: counted
    # exactly, from token ids), and as the engine's answer reported them (usage.prompt_tokens)
    estimated_prompt_tokens: int | None = None
    reported_prompt_tokens: int | None = None
    model: str = ""  # the model the request named


@dataclass(frozen=True, slots=True)
class Abandon:
    """Why an attempt ended without an answer relayed.

    ``retry``: another attempt follows elsewhere; ``passed``: the engine's own error answer goes
    back to the client as it is (``reason`` is ``http_<status>``); ``failed``: the router answers
    with an error of its own; ``client_disconnect``: the client went away before the answer, the
    upstream request was cancelled. ``instance`` is the one at fault (the prefill leg's, for a prefill
    failure); ``reason`` is a short label (``ConnectError``, ``503``, ``prefill_failed``...)."""

    kind: AbandonKind
    reason: str
    instance: str


class Hook:
    """A subscriber. Override the events you need; the others are never called."""

    async def before_send(self, attempt: Attempt) -> None:
        return None

    async def first_byte(self, attempt: Attempt) -> None:
        return None

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        return None

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        return None


def _subscribed(hooks: Sequence[Hook], event: str) -> tuple[Callable[..., Awaitable[None]], ...]:
    base = getattr(Hook, event)
    return tuple(getattr(h, event) for h in hooks if getattr(type(h), event) is not base)


class Lifecycle:
    """An ordered list of hooks and the emitter of their events."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = tuple(hooks)
        self._before_send = _subscribed(self.hooks, "before_send")
        self._first_byte = _subscribed(self.hooks, "first_byte")
        self._end = _subscribed(self.hooks, "end")
        self._abandon = _subscribed(self.hooks, "abandon")

    async def before_send(self, attempt: Attempt) -> None:
        for hook in self._before_send:
            try:
                await hook(attempt)
            except Exception:
                log.exception("request %s: %s failed on before_send", attempt.request_id, _name(hook))

    async def first_byte(self, attempt: Attempt) -> None:
        if attempt.finished or attempt.first_byte_s is not None:
            return
        attempt.first_byte_s = time.perf_counter() - attempt.routed.started
        for hook in self._first_byte:
            try:
                await hook(attempt)
            except Exception:
                log.exception("request %s: %s failed on first_byte", attempt.request_id, _name(hook))

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        if attempt.finished:
            return
        attempt.finished = True
        attempt.duration_s = time.perf_counter() - attempt.routed.started
        for hook in self._end:
            try:
                await hook(attempt, outcome)
            except Exception:
                log.exception("request %s: %s failed on end", attempt.request_id, _name(hook))

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        """Runs the hooks to their end even if the caller is cancelled meanwhile (then re-raises)."""
        if attempt.finished:
            return
        attempt.finished = True
        attempt.duration_s = time.perf_counter() - attempt.routed.started
        # A task of its own survives the caller's cancellation: off the hot path, only failed attempts pay for it.
        inner = asyncio.get_running_loop().create_task(self._abandon_all(attempt, why))
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if not inner.done():
                await asyncio.wait({inner})
            raise

    async def _abandon_all(self, attempt: Attempt, why: Abandon) -> None:
        for hook in self._abandon:
            try:
                await hook(attempt, why)
            except Exception:
                log.exception("request %s: %s failed on abandon", attempt.request_id, _name(hook))

    def observer(self, attempt: Attempt) -> AttemptObserver:
        """What the relay reports ``first_byte`` and ``end`` to, for this attempt."""
        return AttemptObserver(self, attempt)


class AttemptObserver:
    """One attempt's events bound for the relay (router.upstream.relay.RelayObserver)."""

    __slots__ = ("_attempt", "_lifecycle")

    def __init__(self, lifecycle: Lifecycle, attempt: Attempt) -> None:
        self._lifecycle, self._attempt = lifecycle, attempt

    @property
    def attempt(self) -> Attempt:
        return self._attempt

    async def first_byte(self) -> None:
        await self._lifecycle.first_byte(self._attempt)

    async def end(self, outcome: Outcome, tail: tuple[bytes, ...] = ()) -> None:
        """``tail``: the last chunks relayed, joined only when they are read (a prompt whose
        token count was estimated, answered in full)."""
        attempt = self._attempt
        if tail and outcome == "ok" and attempt.estimated_prompt_tokens is not None:
            attempt.reported_prompt_tokens = reported_prompt_tokens(b"".join(tail))
        await self._lifecycle.end(attempt, outcome)


def _name(hook: Callable[..., object]) -> str:
    return getattr(hook, "__qualname__", repr(hook))
