"""Scale-out: N pd-router replicas sharing one Redis, against one replica.

Two measurements per N (replicas are separate ``pd-router serve`` processes on their own
ports; the load is spread over them the way a Kubernetes Service would, client i -> replica
i mod N):

1. **Routing quality and phantom load** (emulated vLLM engines, real time scaled): the same
   seeded shared-prefix workload through N replicas. Hit ratio = cached / prompt tokens as
   the engines measured them (``/emulator/stats``), each run from empty engine caches and a
   fresh Redis namespace. After the run, every instance's booked load in Redis must be 0.
2. **Throughput and cost per request** (zero-work backends, non-streaming): req/s of the
   whole fleet, router CPU per request (utime + stime of every replica's process tree) and
   redis-server CPU per request (``INFO cpu``), and the booked load left afterwards.

The per-request CPU figures give the projection to N = 32 on paper: replicas on a core
each serve N / router-CPU requests per second, until the Redis cores saturate at
cores / Redis-CPU (one for standalone Redis, one per primary of a Cluster, less its skew).

    python loadtests/scale_out.py [--replicas 1 2] [--redis-cluster URL] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.cpu_per_request import cpu_seconds, redis_server, tree  # noqa: E402
from loadtests.loadgen import encode_post, run_load  # noqa: E402
from loadtests.overhead import request_bodies, zero_backend  # noqa: E402
from loadtests.report import table, write_section  # noqa: E402
from router.state.redis_store import RedisStore  # noqa: E402
from router.tools.localrun import (EngineSpec, RouterProcess, emulated_cluster, engine_stats, reset_engines,  # noqa: E402
                                   router_config, router_process)
from router.tools.workload import SharedPrefixWorkload  # noqa: E402

SECTION = "Scale-out: router replicas on one Redis"


@contextlib.contextmanager
def replicas(config: dict[str, Any], n: int) -> Iterator[list[RouterProcess]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(router_process(config)) for _ in range(n)]


async def booked_load(redis_url: str, prefix: str, instances: Sequence[str], cluster: bool = False) -> int:
    """Requests + prefill + KV tokens still booked in Redis over ``instances`` (0 = no phantom load)."""
    store = RedisStore(redis_url, {}, key_prefix=prefix, cluster=cluster)
    await store.start()
    try:
        loads = (await store.snapshot((), list(instances))).loads.values()
        return sum(load.requests + load.prefill_tokens + load.kv_tokens + load.transfers for load in loads)
    finally:
        await store.close()


async def drive(urls: Sequence[str], bodies: Sequence[dict[str, Any]], concurrency: int) -> tuple[int, float]:
    """Closed loop over one shared queue; client i sends through replica i mod N. (errors, seconds)"""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    errors = 0
    async with httpx.AsyncClient(timeout=120, trust_env=False, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def worker(i: int) -> None:
            nonlocal errors
            url = urls[i % len(urls)] + "/v1/chat/completions"
            while not queue.empty():
                body = queue.get_nowait()
                r = await client.post(url, json={**body, "stream": False})
                errors += r.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return errors, time.perf_counter() - started


@dataclass
class Quality:
    replicas: int
    hit_ratio: float
    errors: int
    seconds: float
    phantom: int


def quality(n: int, redis_url: str, args: argparse.Namespace) -> Quality:
    workload = SharedPrefixWorkload(groups=args.groups, users=4, requests=args.requests, seed=args.seed)
    bodies = workload.bodies()
    specs = [EngineSpec("mixed")] * args.engines
    with emulated_cluster(specs, cache_tokens=args.cache_tokens, seed=args.seed) as engines:
        prefix = f"scale{os.getpid()}n{n}r{random.getrandbits(24)}"
        config = router_config(engines, "ttft", cache_tokens=args.cache_tokens, seed=args.seed,
                               extra={"state": {"backend": "redis", "redis_url": redis_url, "key_prefix": prefix}})
        reset_engines(engines)
        with replicas(config, n) as fleet:
            errors, seconds = asyncio.run(drive([r.url for r in fleet], bodies, args.clients))
            time.sleep(0.2)  # queued first-byte writes ride a 5 ms timer; releases are sent at once
            phantom = asyncio.run(booked_load(redis_url, prefix, [e.name for e in engines]))
        stats = engine_stats(engines).values()
        prompt = sum(s["tokens"]["prompt"] for s in stats)
        cached = sum(s["tokens"]["cached"] for s in stats)
    return Quality(n, cached / prompt if prompt else 0.0, errors, seconds, phantom)


def redis_cpu_seconds(redis_url: str, cluster: bool) -> float:
    """CPU the Redis server (every primary of a Cluster) has used so far."""
    import redis

    if cluster:
        client = redis.RedisCluster.from_url(redis_url)
        nodes = list(client.info("cpu", target_nodes=redis.RedisCluster.PRIMARIES).values())
    else:
        client = redis.Redis.from_url(redis_url)
        nodes = [client.info("cpu")]
    client.close()
    return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes)


@dataclass
class Throughput:
    replicas: int
    redis: str
    rps: float
    router_cpu_us: float
    redis_cpu_us: float
    errors: int
    phantom: int


async def _fleet_load(fleet: Sequence[RouterProcess], concurrency: int, duration: float, warmup: float) -> tuple[int, int]:
    bodies = request_bodies()
    tasks = []
    for i, replica in enumerate(fleet):
        host, port = replica.url.rsplit("//", 1)[1].split(":")
        reqs = [encode_post(host, int(port), "/v1/completions", b) for b in bodies]
        share = concurrency // len(fleet) + (1 if i < concurrency % len(fleet) else 0)
        tasks.append(run_load(host, int(port), reqs, share, duration, warmup))
    results = await asyncio.gather(*tasks)
    return sum(r.completed for r in results), sum(r.errors for r in results)


def throughput(n: int, redis_url: str, args: argparse.Namespace, cluster: bool = False) -> Throughput:
    with zero_backend(2) as (backends, _):
        prefix = f"scalez{os.getpid()}n{n}r{random.getrandbits(24)}"
        config = {"instances": [{"url": u, "name": f"z{i}"} for i, u in enumerate(backends)],
                  "state": {"backend": "redis", "redis_url": redis_url, "key_prefix": prefix,
                            "sharding": {"cluster": cluster}}}
        with replicas(config, n) as fleet:
            asyncio.run(_fleet_load(fleet, args.concurrency, 0.0, args.warmup))  # warm-up, not recorded
            pids = [p for r in fleet for p in tree(r.process.pid)]
            server0, before = redis_cpu_seconds(redis_url, cluster), cpu_seconds(pids)
            answers, errors = asyncio.run(_fleet_load(fleet, args.concurrency, args.duration, 0.0))
            used, server = cpu_seconds(pids) - before, redis_cpu_seconds(redis_url, cluster) - server0
            time.sleep(0.2)
            phantom = asyncio.run(booked_load(redis_url, prefix, ["z0", "z1"], cluster))
    answers = max(1, answers)
    return Throughput(n, "Cluster (3 primaries)" if cluster else "standalone", answers / args.duration,
                      used / answers * 1e6, server / answers * 1e6, errors, phantom)


def projection(rows: Sequence[Throughput], target: int = 32) -> str:
    """Throughput at ``target`` replicas from the measured per-request CPU: the last standalone
    row for standalone Redis, the last Cluster row (if measured) for a Cluster."""
    alone = [r for r in rows if r.redis == "standalone"][-1]
    on_cluster = [r for r in rows if r.redis != "standalone"]
    router_rps = target / (alone.router_cpu_us * 1e-6)
    lines = [f"- Per request, at N = {alone.replicas} on standalone Redis: {alone.router_cpu_us:.0f} µs of router CPU, "
             f"{alone.redis_cpu_us:.0f} µs of Redis CPU, 2 Redis round trips (decision; release with the queued "
             f"first-byte write)."]
    lines.append(f"- N = {target} replicas, one core each: {router_rps:,.0f} req/s of router capacity.")
    cases = [("standalone Redis (one core)", 1.0, alone.redis_cpu_us)]
    if on_cluster:
        c = on_cluster[-1]
        lines.append(f"- On the 3-node Cluster (N = {c.replicas}): {c.router_cpu_us:.0f} µs of router CPU and "
                     f"{c.redis_cpu_us:.0f} µs of Redis CPU per request, summed over the primaries (a decision is one "
                     f"call per slot it touches instead of one call).")
        cases += [("a Redis Cluster of 3 primaries", 3 * 0.8, c.redis_cpu_us), ("a Redis Cluster of 8 primaries", 8 * 0.8, c.redis_cpu_us),
                  ("a Redis Cluster of 16 primaries", 16 * 0.8, c.redis_cpu_us)]
    for name, cores, cost in cases:
        redis_rps = cores / (cost * 1e-6)
        bound = "Redis-bound" if redis_rps < router_rps else "router-bound"
        lines.append(f"- with {name}: Redis saturates at {redis_rps:,.0f} req/s → N = {target} serves "
                     f"{min(router_rps, redis_rps):,.0f} req/s ({bound}); replicas it can feed: "
                     f"{redis_rps * alone.router_cpu_us * 1e-6:.0f}.")
    lines.append("- Cluster primaries are counted at 0.8 of a core each: a decision's residency shard follows the prompt's "
                 "first block, so a few hot system prompts load their slots' nodes more than others; instance shards "
                 "spread evenly. Each decision touches 1 residency slot and ≤ `instance_shards` instance slots, so adding "
                 "nodes divides the per-node work but not the round trips.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--cache-tokens", type=int, default=16_000, help="each emulated engine's KV cache")
    p.add_argument("--groups", type=int, default=12, help="tenants (system prompts) of the workload")
    p.add_argument("--requests", type=int, default=480)
    p.add_argument("--clients", type=int, default=16, help="concurrent clients of the quality run")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent connections of the throughput run")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redis-cluster", metavar="URL", help="also measure throughput at the largest N on this Redis Cluster")
    p.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    with redis_server() as (redis_url, _):
        qual = [quality(n, redis_url, args) for n in args.replicas]
        for q in qual:
            print(f"quality N={q.replicas}: hit {q.hit_ratio:.3f} errors {q.errors} phantom {q.phantom} ({q.seconds:.1f} s)",
                  file=sys.stderr, flush=True)
        thr = [throughput(n, redis_url, args) for n in args.replicas]
        if args.redis_cluster:
            thr.append(throughput(max(args.replicas), args.redis_cluster, args, cluster=True))
        for t in thr:
            print(f"throughput N={t.replicas} {t.redis}: {t.rps:.0f} req/s router {t.router_cpu_us:.0f} µs redis {t.redis_cpu_us:.0f} µs "
                  f"errors {t.errors} phantom {t.phantom}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    base = qual[0].hit_ratio
    out = table(["replicas", "engine-measured hit ratio", "vs 1 replica (points)", "errors", "booked load left in Redis"],
                [[q.replicas, f"{q.hit_ratio:.3f}", f"{(q.hit_ratio - base) * 100:+.1f}", q.errors, q.phantom] for q in qual])
    out += "\n\n" + table(["replicas", "Redis", "req/s (fleet)", "router CPU µs / request", "Redis CPU µs / request", "errors",
                           "booked load left in Redis"],
                          [[t.replicas, t.redis, f"{t.rps:,.0f}", f"{t.router_cpu_us:.0f}", f"{t.redis_cpu_us:.0f}", t.errors,
                            t.phantom] for t in thr])
    out += "\n\nProjection to N = 32 (on paper, from the measured per-request costs):\n\n" + projection(thr)
    note = (f"Quality: {args.engines} emulated vLLM engines of {args.cache_tokens:,} KV tokens, {args.requests} chat requests "
            f"({args.groups} tenants × 4 users, seed {args.seed}), {args.clients} concurrent clients spread over the replicas, "
            f"policy `ttft`; each run from empty caches and a fresh namespace. Throughput: 2 zero-work backends, "
            f"non-streaming completions, {args.concurrency} connections over the replicas for {args.duration:.0f} s. "
            f"Everything (replicas, load generator, backends, redis-server) shares this machine's 2 cores with other "
            f"tenants: load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, so req/s is indicative only; "
            f"the CPU-per-request columns are what the projection uses.")
    print(out)
    if args.write:
        write_section(SECTION, "python loadtests/scale_out.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      note + "\n\n" + out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
