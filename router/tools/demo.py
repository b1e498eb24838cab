"""``pd-router demo``: the router at work on emulated engines, in under a minute.

Starts a colocated pool (3 mixed engines) and a disaggregated one (2 prefill + 2 decode),
then, for each policy, a router on the embedded defaults (in-memory state) in front of
each pool, and drives the same seeded shared-prefix workload through it. Engine caches
are emptied between runs. The table compares what the engines saw (prefix hit ratio,
prefill work per engine) and what the clients saw (TTFT).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.tools.localrun import (
    Engine,
    EngineSpec,
    emulated_cluster,
    engine_stats,
    pd_cluster_spec,
    reset_engines,
    router_config,
    router_process,
)
from router.tools.workload import RunResult, SharedPrefixWorkload, drive

SCENARIOS: dict[str, list[EngineSpec]] = {
    "colocated": pd_cluster_spec(0, 0, mixed=3),
    "pd": pd_cluster_spec(2, 2),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="run emulated engines + the router and compare policies")
    p.add_argument("--requests", type=int, default=120, help="requests per run")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per emulated GPU second")
    p.add_argument("--cache-tokens", type=int, default=20000,
                   help="KV cache per engine: small enough that no engine holds every tenant's prefix")
    p.add_argument("--groups", type=int, default=12, help="tenants, each with its own long system prompt")
    p.add_argument("--policies", nargs="+", default=["ttft", "round_robin"])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--profile", default="llama3-8b-h100")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


@dataclass
class Row:
    scenario: str
    policy: str
    result: RunResult
    hit_ratio: float
    load: dict[str, tuple[int, int]]  # engine -> (requests, prefill tokens computed)


def progress_bar(label: str):
    """A bar redrawn in place on a terminal; a few plain lines otherwise (logs, CI)."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(1, total)
        if tty:
            sys.stderr.write(f"\r  {label:<24} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            if done == total:
                sys.stderr.write("\n")
        elif done == total or done * 4 // total != (done - 1) * 4 // total:
            sys.stderr.write(f"  {label:<24} {done}/{total}\n")
        sys.stderr.flush()
    return show


def _delta(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> tuple[float, dict[str, tuple[int, int]]]:
    cached = computed = 0
    load = {}
    for name, stats in after.items():
        b = before[name]
        c = stats["tokens"]["cached"] - b["tokens"]["cached"]
        p = stats["tokens"]["prefill_computed"] - b["tokens"]["prefill_computed"]
        n = stats["requests"]["added"] - b["requests"]["added"]
        cached, computed = cached + c, computed + p
        load[name] = (n, p)
    return (cached / (cached + computed) if cached + computed else 0.0), load


def run_scenario(name: str, engines: Sequence[Engine], args: argparse.Namespace, bodies: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for policy in args.policies:
        reset_engines(engines)
        config = router_config(engines, policy, profile=args.profile, time_scale=args.time_scale, seed=args.seed,
                               cache_tokens=args.cache_tokens)
        with router_process(config) as router:
            before = engine_stats(engines)
            result = asyncio.run(drive(router.url, bodies, args.concurrency, progress_bar(f"{name} / {policy}")))
            time.sleep(0.2)  # let the engines' counters settle after the last stream
            hit, load = _delta(before, engine_stats(engines))
        rows.append(Row(name, policy, result, hit, load))
    return rows


def render(rows: Sequence[Row], time_scale: float) -> str:
    head = ("scenario", "policy", "requests", "errors", "prefix hit", "TTFT p50", "TTFT p90", "prefill tokens per engine (requests)")
    lines = [" | ".join(head), " | ".join("-" * len(h) for h in head)]
    for r in rows:
        load = "  ".join(f"{e}:{p / 1000:.0f}k({n})" for e, (n, p) in sorted(r.load.items()))
        lines.append(" | ".join((
            r.scenario, r.policy, str(len(r.result.ttft_s) + r.result.errors), str(r.result.errors),
            f"{r.hit_ratio:.0%}", f"{r.result.ttft_p50 * 1000:.0f} ms", f"{r.result.ttft_p90 * 1000:.0f} ms", load,
        )))
    note = (f"TTFT is wall-clock at time scale {time_scale} (1 emulated GPU second = {time_scale} s); "
            "prefix hit = prompt tokens served from the engines' caches / prompt tokens they prefilled.")
    return "\n".join(lines) + "\n" + note


def run(args: argparse.Namespace) -> int:
    workload = SharedPrefixWorkload(requests=args.requests, groups=args.groups, seed=args.seed)
    bodies = workload.bodies()
    print(f"pd-router demo: {args.requests} streaming chat requests, {workload.groups} tenants x {workload.users} users, "
          f"~{workload.system_tokens} shared tokens each; engines: {args.profile} at time scale {args.time_scale}")
    rows: list[Row] = []
    started = time.perf_counter()
    for name in args.scenarios:
        specs = SCENARIOS[name]
        print(f"starting {len(specs)} emulated engines for '{name}' ...", file=sys.stderr)
        with emulated_cluster(specs, profile=args.profile, time_scale=args.time_scale, seed=args.seed,
                              cache_tokens=args.cache_tokens) as engines:
            rows += run_scenario(name, engines, args, bodies)
    print()
    print(render(rows, args.time_scale))
    print(f"\ndone in {time.perf_counter() - started:.0f} s")
    failed = [r for r in rows if r.result.errors]
    for r in failed:
        print(f"errors in {r.scenario}/{r.policy}: {r.result.error_samples}", file=sys.stderr)
    return 1 if failed else 0
