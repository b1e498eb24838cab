"""Drive an Engine in virtual time (no sleeping, no asyncio).

Why: TTFT/queueing claims must be checkable deterministically, and the trace
replay needs the exact engine model without wall-clock noise. Arrivals that
fall inside a step join at the next step boundary, as on a real engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.tools.emulator.engine import Engine
from router.tools.emulator.request import EngineRequest


def run_virtual(engine: Engine, arrivals: Iterable[tuple[float, EngineRequest]],
                start: float = 0.0, max_steps: int = 10_000_000) -> float:
    """Feed ``(time, request)`` arrivals and step until all work is done.

    Returns the virtual time at which the engine went idle. Per-request
    results are on the request objects (``ttft``, ``num_cached``, ...).
    """
    pending = sorted(arrivals, key=lambda item: item[0])
    now = start
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i][0] <= now:
            engine.add_request(pending[i][1], pending[i][0])
            i += 1
        if engine.has_work():
            out = engine.step(now)
            if not out.idle:
                now += out.duration
                continue
        if i >= len(pending):
            return now
        now = max(now, pending[i][0])
    raise RuntimeError("virtual run did not finish within max_steps")
