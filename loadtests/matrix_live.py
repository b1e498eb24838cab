"""One matrix cell live: pd-router, sglang-router and vllm-router in turn in front of the
same emulated engines (caches emptied before each), the cell's trace sent open loop.

Prompts are text built from the trace's content blocks (each block a fixed run of
three-letter words, about one emulator token per word), so every router sees the same
prefixes the replay routed. The emulators run at ``time_scale`` (slowed down, or up to 4x
sped up) so the arrival rate is about ``--live-rate`` on the wall clock, which a 2-core
machine can drive; TTFTs are reported in emulated seconds (wall / time_scale).
Engine hit ratio comes from the emulators' exact counters (/emulator/stats deltas).
pd-router with ``facts`` is told each engine's cache size and rates; with ``defaults`` it
is given only the URLs, as a new user would.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from loadtests.matrix_cells import BLOCK, ENGINES, Drawn
from loadtests.peers import PeerUnavailable, peer_router
from loadtests.side_by_side import workers
from router.tools.localrun import Engine, emulated_cluster, engine_stats, pd_cluster_spec, reset_engines, router_config, router_process
from router.tools.replay.summary import percentile
from router.tools.replay.trace import TraceRequest

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def block_text(block: int) -> str:
    rng = random.Random(block)
    return "".join(" " + "".join(rng.choices(_LETTERS, k=3)) for _ in range(BLOCK))


def prompt_text(req: TraceRequest) -> str:
    words = "".join(block_text(b) for b in req.blocks).split(" ")[1:]
    return " " + " ".join(words[: req.input_tokens])


def pd_router_config(engines: Sequence[Engine], d: Drawn, time_scale: float, seed: int) -> dict[str, Any]:
    wall = time_scale * d.spec.slowdown  # wall seconds per profile second
    config = router_config(engines, "ttft", profile=d.spec.profile, time_scale=wall,
                           cache_tokens=d.spec.cache_tokens, seed=seed)
    if not d.spec.told:  # only what a new user writes: the URLs (and roles, all mixed here)
        config = {"instances": [{k: v for k, v in i.items() if k in ("url", "name", "role", "flavor", "model")}
                                for i in config["instances"]],
                  "policy": {"name": "ttft", "seed": seed}, "health": config["health"]}
    return config


@contextlib.contextmanager
def start(router: str, engines: Sequence[Engine], d: Drawn, time_scale: float, seed: int) -> Iterator[tuple[str, str | None]]:
    """The router's URL, and the path of its log (pd-router's; None for the peers), alive while the block runs."""
    if router == "pd-router":
        try:
            with router_process(pd_router_config(engines, d, time_scale, seed)) as proc:
                yield proc.url, proc.log_path
        except RuntimeError as exc:
            raise PeerUnavailable(f"pd-router: {exc}") from None
        return
    with peer_router(router, workers(engines)) as peer:
        yield peer.url, None


def report_errors(router: str, errors: Sequence[str], log_path: str | None) -> None:
    """What failed, by kind, and (pd-router) the warnings its log holds: a failed request must be explained."""
    if not errors:
        return
    for kind, n in collections.Counter(errors).most_common(5):
        print(f"    {router} error x{n}: {kind}", flush=True)
    if log_path is not None:
        with contextlib.suppress(OSError), open(log_path, encoding="utf-8", errors="replace") as fh:
            lines = [line.rstrip() for line in fh if "WARNING" in line or "ERROR" in line]
        for line in lines[-10:]:
            print(f"    {router} log: {line[:300]}", flush=True)


async def _send(client: httpx.AsyncClient, url: str, req: TraceRequest, text: str, at: float,
                ttfts: list[float], errors: list[str]) -> None:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    body = {"model": "demo-model", "prompt": text, "max_tokens": req.output_tokens, "stream": True, "ignore_eos": True}
    sent = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                body = (await resp.aread())[:200].decode("utf-8", "replace")
                errors.append(f"HTTP {resp.status_code}: {body}")
                return
            first = None
            async for line in resp.aiter_lines():
                if first is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                    first = time.perf_counter() - sent
            if first is None:
                errors.append("no tokens")
            else:
                ttfts.append(first)
    except httpx.HTTPError as exc:
        errors.append(f"{type(exc).__name__}: {exc}"[:200])


async def drive(url: str, reqs: Sequence[TraceRequest], texts: Sequence[str], time_scale: float) -> tuple[list[float], list[str]]:
    ttfts: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits, trust_env=False) as client:
        t0 = time.perf_counter() + 0.5
        await asyncio.gather(*(_send(client, url, r, t, t0 + r.arrival_s * time_scale, ttfts, errors)
                               for r, t in zip(reqs, texts)))
    return ttfts, errors


def live_cell(d: Drawn, routers: Sequence[str], seconds: float, wall_rate: float, seed: int) -> tuple[list[list[object]], str, str]:
    """Rows (cell, router, requests, errors, p50, p90, hit), the verdict and a note."""
    from loadtests.quality_matrix import verdict  # the one definition of a pass

    time_scale = max(0.25, d.rate / wall_rate)  # faster than real time only while the CPU can keep up
    reqs = [r for r in d.trace.requests if r.arrival_s * time_scale <= seconds] or list(d.trace.requests[:1])
    texts = [prompt_text(r) for r in reqs]
    rows: list[list[object]] = []
    results: dict[str, tuple[float | None, float | None]] = {}
    with emulated_cluster(pd_cluster_spec(0, 0, ENGINES, "vllm"), profile=d.spec.profile,
                          time_scale=time_scale * d.spec.slowdown, seed=seed, cache_tokens=d.spec.cache_tokens) as engines:
        for router in routers:
            reset_engines(engines)
            try:
                with start(router, engines, d, time_scale, seed) as (url, log_path):
                    before = engine_stats(engines)
                    ttfts, errors = asyncio.run(drive(url, reqs, texts, time_scale))
                    time.sleep(0.5)
                    after = engine_stats(engines)
                    report_errors(router, errors, log_path)
            except PeerUnavailable as exc:
                rows.append([d.cell.name, router, 0, "did not start", "—", "—", str(exc).splitlines()[0][:80]])
                continue
            cached = sum(after[n]["tokens"]["cached"] - before[n]["tokens"]["cached"] for n in after)
            computed = sum(after[n]["tokens"]["prefill_computed"] - before[n]["tokens"]["prefill_computed"] for n in after)
            hit = cached / (cached + computed) if cached + computed else math.nan
            model = [t / time_scale for t in ttfts]  # emulated seconds, as the replay reports them
            p50, p90 = percentile(model, 50), percentile(model, 90)
            results[router] = (None if math.isnan(p90) else p90, None if math.isnan(hit) else hit)
            rows.append([d.cell.name, router, len(reqs), len(errors), f"{p50:.3f}", f"{p90:.3f}", f"{hit:.3f}"])
            print(f"  {router}: p90 {p90:.3f} s, hit {hit:.3f}, {len(errors)} errors of {len(reqs)}", flush=True)
    ours = results.get("pd-router", (None, None))
    peers = {k: v for k, v in results.items() if k != "pd-router"}
    note = f"{d.describe()}; live {len(reqs)} requests, emulator time x{time_scale * d.spec.slowdown:.1f}"
    return rows, verdict(ours[0], ours[1], peers), note
