"""Overload: a concurrency limit with a bounded wait queue, 429 + Retry-After beyond it."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from gateway.test_app import TOKEN, cluster, completion, loads  # type: ignore[import-not-found]
from router.core.errors import Overloaded
from router.request.overload import Overload
from servers import FakeBackend


async def test_the_limit_queues_then_refuses_with_retry_after():
    # The first four hold their slots ~1.7 s, so that all 16 have arrived before any slot frees
    # even on a slow host (a trickle would let a fifth be served at once); the queue waits up to
    # 10 s, so the four queued behind them are served, never timed out.
    engine = FakeBackend("e", first_byte_s=1.4, chunk_s=0.1)
    with cluster(engine, proxy={"max_concurrent": 4, "max_queued": 4, "queue_timeout_s": 10}) as (url, _):
        async with httpx.AsyncClient(timeout=10) as client:
            rs = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=completion(i, stream=i % 2 == 0))
                                        for i in range(16)))
        codes = Counter(r.status_code for r in rs)
        assert codes == {200: 8, 429: 8}, codes  # 4 served, 4 waited and were served, 8 refused at once
        refused = next(r for r in rs if r.status_code == 429)
        assert refused.headers["retry-after"] == "2" and refused.json()["error"]["code"] == "overloaded"
        assert engine.peak <= 4
        assert loads(url) == {"e": 0}
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.post(f"{url}/v1/completions", json=completion(99))).status_code == 200  # the slots came back
            metrics = (await client.get(f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})).text
        assert 'pd_router_rejected_total{status="429"} 8.0' in metrics


async def test_a_waiter_times_out_and_a_cancelled_one_gives_its_turn_away():
    admission = Overload(1, 2, 0.2, 1)
    await admission.acquire()
    try:
        await admission.acquire()
        raise AssertionError("should have timed out")
    except Overloaded:
        pass
    gone = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0.01)
    gone.cancel()
    nxt = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0.01)
    admission.release()  # passes over the cancelled waiter to the next
    await asyncio.wait_for(nxt, 1)
    admission.release()
    assert admission.active == 0 and not admission._waiters
