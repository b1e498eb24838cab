"""Issue 10, required load test: 1 of 3 engine processes SIGKILLed under steady load.
The client sees 0 failed non-streamed requests and 0 broken streams (continuation on)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter

import httpx

from faults.conftest import router  # type: ignore[import-not-found]
from router.tools.emulator import EmulatorConfig
from router.tools.emulator.launch import spawn_emulator

WORKERS, SECONDS, KILL_AT = 12, 4.0, 1.5


def check(r: httpx.Response, stream: bool) -> str:
    if r.status_code != 200:
        return f"http_{r.status_code}"
    if not stream:
        return "ok" if r.json()["choices"][0]["text"] else "empty"
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    if events.count("[DONE]") != 1:
        return "no_done"
    if any("error" in json.loads(e) for e in events if e != "[DONE]"):
        return "error_event"
    return "ok"


async def test_one_of_three_engines_killed_under_load():
    engines = [spawn_emulator(EmulatorConfig(model="m", time_scale=0.05, engine_id=f"e{i}")) for i in range(3)]
    try:
        instances = [{"url": e.url, "name": f"e{i}"} for i, e in enumerate(engines)]
        with router(instances, policy={"name": "round_robin", "seed": 1}, health={"interval_s": 0.5}) as (url, app):
            results: Counter[str] = Counter()
            stop = time.monotonic() + SECONDS

            async def worker(w: int, client: httpx.AsyncClient) -> None:
                i = 0
                while time.monotonic() < stop:
                    stream = (w + i) % 2 == 0
                    body = {"model": "m", "prompt": f"user {w} asks question {i}.", "max_tokens": 40, "stream": stream}
                    r = await client.post(f"{url}/v1/completions", json=body)
                    results[("stream " if stream else "json ") + check(r, stream)] += 1
                    i += 1

            async def killer() -> None:
                await asyncio.sleep(KILL_AT)
                engines[0].process.send_signal(signal.SIGKILL)

            async with httpx.AsyncClient(timeout=30) as client:
                await asyncio.gather(killer(), *(worker(w, client) for w in range(WORKERS)))
            print("client saw:", dict(results))
            assert set(results) == {"stream ok", "json ok"}, results
            assert sum(results.values()) > 50
            assert not app.state.pool.get("e0").routable
    finally:
        for e in engines:
            e.stop()
