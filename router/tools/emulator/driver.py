"""Asyncio driver: runs engine steps in (scaled) real time and fans out tokens.

Why a separate driver: the engine is a pure state machine; this loop is the
only place that knows about wall clocks. Each step sleeps
``duration * time_scale`` against an absolute deadline, so timer granularity
and CPU hiccups do not accumulate drift (when behind, steps run back to back
until caught up, with a bounded debt so a stall does not cause a burst).

Token delivery is a per-request buffer plus a future: a handler wakes once
and drains every token that arrived meanwhile, so under CPU pressure tokens
are batched into fewer writes instead of piling up scheduler wake-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from router.tools.emulator.engine import Engine
from router.tools.emulator.request import EngineRequest, EventKind, StepOutput

log = logging.getLogger(__name__)

_MAX_DEBT_S = 0.05
"""How far (wall seconds) the loop may fall behind before forgiving the debt."""


class RequestStream:
    """Tokens of one engine request, buffered until its handler drains them."""

    __slots__ = ("request", "arrival_wall", "first_token_wall", "done",
                 "_buffer", "_waiter")

    def __init__(self, request: EngineRequest, arrival_wall: float) -> None:
        self.request = request
        self.arrival_wall = arrival_wall
        self.first_token_wall: float | None = None
        self.done = False
        self._buffer: list[int] = []
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def push(self, token_id: int) -> None:
        self._buffer.append(token_id)
        if self._waiter is not None:
            self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    async def next_tokens(self) -> list[int]:
        """Wait for at least one new token (or the end); returns them all.

        An empty list means the request is finished.
        """
        while not self._buffer and not self.done:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            await waiter
        tokens, self._buffer = self._buffer, []
        return tokens


class EngineDriver:
    """Owns the step loop for one engine inside one event loop."""

    def __init__(self, engine: Engine, time_scale: float,
                 on_first_token: Callable[[RequestStream], None] | None = None,
                 on_finished: Callable[[RequestStream], None] | None = None,
                 on_load: Callable[[EngineRequest], None] | None = None) -> None:
        self.engine = engine
        self._on_load = on_load
        self.time_scale = time_scale
        self._on_first_token = on_first_token
        self._on_finished = on_finished
        self._streams: dict[str, RequestStream] = {}
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._model_time = 0.0
        self._mark_wall = 0.0
        """Wall time when the current step or idle period began."""
        self._busy = False
        self._idle = True
        self._step_duration = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._mark_wall = self._loop.time()
        self._task = self._loop.create_task(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for stream in self._streams.values():
            stream.finish()
        self._streams.clear()

    # -- API for handlers ------------------------------------------------------

    def model_now(self) -> float:
        """Current model time: step boundaries plus scaled wall time in between.

        Model time advances by exactly each step's modelled duration while the
        engine is busy and with scaled wall time while it is idle (until work
        arrives), so CPU lag does not leak in and engine-side TTFTs are the
        model's, not the host's.
        """
        loop = self._loop
        if loop is None or self.time_scale <= 0:
            return self._model_time
        if self._idle:
            return self._model_time + (loop.time() - self._mark_wall) / self.time_scale
        if self._busy:
            elapsed = (loop.time() - self._mark_wall) / self.time_scale
            return self._model_time + min(elapsed, self._step_duration)
        return self._model_time  # between two steps: frozen

    def wall_time(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def submit(self, request: EngineRequest) -> RequestStream:
        """Queue ``request`` in the engine; ValueError if it can never run.

        The idle clock stops before the arrival is stamped, so the request arrives at the
        very model time the engine's next step starts from: a host stall between the two
        (GIL, GC; a millisecond is 0.1 model seconds at time scale 0.01) must not show up
        as model queueing.
        """
        self._stop_idle_clock()
        try:
            self.engine.add_request(request, self.model_now())
        except BaseException:
            self.wake()  # nothing queued: the loop finds no work and restarts the idle clock
            raise
        stream = RequestStream(request, self.wall_time())
        self._streams[request.request_id] = stream
        self.wake()
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if self.engine.abort(request_id):
            self.wake()
        if stream is not None:
            stream.finish()

    def release_held(self, request_id: str) -> EngineRequest | None:
        request = self.engine.release_held(request_id)
        if request is not None:
            self.wake()
        return request

    def _stop_idle_clock(self) -> None:
        if self._idle and self._loop is not None:
            # Work arrived: stop the idle clock now. Until the loop gets round to the next
            # step (event-loop latency, CPU contention: a millisecond is 0.1 model seconds
            # at time scale 0.01) model time stands still, as it does between two steps.
            self._model_time = self.model_now()
            self._idle = False

    def wake(self) -> None:
        self._stop_idle_clock()
        waiter = self._wake
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the loop ----------------------------------------------------------------

    async def _sleep_until_woken(self) -> None:
        """Idle until a submit/abort/release; model time follows wall time."""
        assert self._loop is not None
        self._wake = self._loop.create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        deadline = loop.time()
        while True:
            now = self.model_now()
            out = engine.step(now) if engine.has_work() else None
            if out is not None and out.loads:
                for request in out.loads:  # store loads start with the step that admitted them
                    if self._on_load is not None:
                        self._on_load(request)
                    else:
                        engine.load_done(request.request_id)
            if out is None or out.idle:  # nothing to do, or all KV pinned by holds
                self._model_time, self._mark_wall = now, loop.time()
                self._idle = True
                await self._sleep_until_woken()
                self._model_time = self.model_now()
                self._idle = False
                deadline = loop.time()
                continue
            # The step "runs" for its modelled duration; its tokens appear at the end.
            self._model_time, self._mark_wall = now, loop.time()
            self._busy, self._step_duration = True, out.duration
            deadline += out.duration * self.time_scale
            delay = deadline - loop.time()
            if delay < -_MAX_DEBT_S:
                deadline = loop.time() - _MAX_DEBT_S
            await asyncio.sleep(delay if delay > 0 else 0)
            self._model_time = now + out.duration
            self._busy = False
            self._dispatch(out)

    def _dispatch(self, out: StepOutput) -> None:
        streams = self._streams
        first = EventKind.FIRST_TOKEN
        finished = EventKind.FINISHED
        for event in out.events:
            stream = streams.get(event.request_id)
            if stream is None:
                continue
            kind = event.kind
            if kind is finished:
                del streams[event.request_id]
                stream.finish()
                if self._on_finished is not None:
                    self._on_finished(stream)
                continue
            stream.push(event.token_id)
            if kind is first:
                stream.first_token_wall = self.wall_time()
                if self._on_first_token is not None:
                    self._on_first_token(stream)
