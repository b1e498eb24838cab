"""Client-side CPU per upstream request: the router's Upstream.send (httpx API on pool.py) vs aiohttp.

Why: the issue asks whether a well-kept client (aiohttp) would do better than the custom
pool. This drives each, in this process pinned to core 0, against the zero backend pinned to
core 1, at concurrency 16, reading every body, and reports process CPU time per request
(best of 3 runs after a warm-up run), so the figure does not depend on the machine's other
tenants the way wall time does.

    python loadtests/client_cost.py [--requests 6000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from loadtests.overhead import request_bodies, zero_backend  # noqa: E402
from router.upstream.client import Upstream  # noqa: E402

HEADERS = {"content-type": "application/json"}


async def cpu_per_request(send: Callable[[bytes], Awaitable[None]], bodies: list[bytes], n: int, concurrency: int) -> float:
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await send(bodies[i % len(bodies)])

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - started) / n * 1e6


async def best_of(send: Callable[[bytes], Awaitable[None]], bodies: list[bytes], args: argparse.Namespace) -> float:
    await cpu_per_request(send, bodies, args.requests // 4, args.concurrency)  # warm: connections, caches
    return min([await cpu_per_request(send, bodies, args.requests, args.concurrency) for _ in range(3)])


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    bodies = [json.dumps(b).encode() for b in request_bodies()]
    up = Upstream.open(64, 30.0)
    timeout = httpx.Timeout(30.0)

    async def lean(body: bytes) -> None:
        r = await up.send(url, body, HEADERS, timeout)
        async for _ in r.aiter_raw():
            pass
        await r.aclose()

    out = {"Upstream.send (httpx API on pool.py)": await best_of(lean, bodies, args)}
    await up.aclose()
    try:
        import aiohttp
    except ImportError:
        print("aiohttp is not installed (pip install -e '.[bench]'): not measured", file=sys.stderr)
        return out
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        async def ai(body: bytes) -> None:
            async with session.post(url, data=body, headers=HEADERS) as r:
                async for _ in r.content.iter_any():
                    pass
        out["aiohttp ClientSession"] = await best_of(ai, bodies, args)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    affinity = os.sched_getaffinity(0)
    with zero_backend(1) as (urls, pid):
        if (os.cpu_count() or 1) >= 2:
            os.sched_setaffinity(pid, {1})
            os.sched_setaffinity(0, {0})
        try:
            import uvloop
            results = uvloop.run(measure(urls[0] + "/v1/completions", args))
        finally:
            os.sched_setaffinity(0, affinity)
    print("| client | CPU µs / request |\n|---|---|")
    for name, us in results.items():
        print(f"| {name} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
