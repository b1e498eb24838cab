"""Microbenchmark: the cost of one routing decision versus pool size and prompt length.

A decision = canonical prompt -> block keys (hash) + residency look-up + scoring + booking
(``routing.decide`` with the default ``ttft`` policy). Residency is pre-filled so every
instance holds prefixes and the request's own prefix sits on a few instances. Measured for
the memory store and, with ``--redis URL``, the Redis store (round trips counted).

    python loadtests/decision_cost.py [--redis redis://127.0.0.1:6379/0] [--pd] [--phases] [--write]

``--baseline REF --rounds N`` runs the cases N times for the router package of git REF and
for this tree in turn (each in a subprocess, alternating which goes first) and prints both
side by side (``--write``: a section of its own, "Decision cost side by side").

``--pd`` measures clusters of half prefill, half decode instances instead, where ``ttft``
prices (P, D) routes. ``--phases`` also prints, for the memory store, the median of each
phase of a decision timed on its own: hashing, pruning, snapshot, choice (filters, scoring,
pick), booking (load and the prompt's residency), release.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if os.environ.get("DECISION_COST_SOURCE"):  # --baseline's subprocess: the router package of another commit
    sys.path.insert(0, os.environ["DECISION_COST_SOURCE"])

from loadtests.report import table, write_section  # noqa: E402
from router.config.model import HashingConfig, PDConfig, PolicyConfig  # noqa: E402
from router.request.hashing import root_seed, text_block_keys  # noqa: E402
from router.scheduling import Candidate, RouteRequest, build_policy  # noqa: E402
from router.scheduling.decide import RequestChooser, decide  # noqa: E402
from router.scheduling.prune import Pruner  # noqa: E402
from router.state.base import Booking  # noqa: E402
from router.state.memory import MemoryStore  # noqa: E402

HASHING = HashingConfig()


class Forced:
    """A chooser that books a given instance (to lay down residency before measuring)."""

    def __init__(self, booking_id: str, instance: str, keys: list[int], prefill: int = 0) -> None:
        self.booking = Booking.single(booking_id, instance, prefill, 0, keys)

    def __call__(self, snap):
        return self.booking

    def revise(self, snap, booking):
        return None


def make_text(tokens: int, rng: random.Random) -> str:
    words = ["alpha", "beta", "gamma", "delta", "omega", "router", "cache", "prefill"]
    out, size = [], 0
    while size < tokens * HASHING.chars_per_token:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


async def populate(store, ids: list[str], prompt_tokens: int, seed: int, rng: random.Random) -> tuple[str, list[int]]:
    """The request's text and keys, and the store set up around them (the same for every case)."""
    text = make_text(prompt_tokens, rng)
    keys = text_block_keys(text, HASHING.block_chars, seed, HASHING.max_blocks)
    # warm residency through real bookings: the request's prefix, to various depths, on a few instances
    for i, inst in enumerate(rng.sample(ids, min(4, len(ids)))):
        depth = max(1, len(keys) * (i + 1) // 5)
        _, booking = await store.decide(keys[:depth], ids, Forced(f"warm{i}", inst, keys[:depth]))
        await store.release(booking)
    # every instance busy with a request of its own (kept in flight): no idle shortcut for pruning
    for i, inst in enumerate(ids):
        await store.decide([], [inst], Forced(f"busy{i}", inst, [], prefill=rng.randrange(0, 20_000)))
    return text, keys


async def bench_case(store_factory, n_instances: int, prompt_tokens: int, iterations: int, pd: bool = False,
                     prune_k: int = 0) -> dict[str, float]:
    rng = random.Random(n_instances * 7 + prompt_tokens)
    roles = ["prefill", "decode"] if pd else ["mixed"]
    cands = [Candidate(f"i{i}", cache_tokens=2_000_000, prefill_tokens_per_s=10_000, role=roles[i % len(roles)])
             for i in range(n_instances)]
    ids = [c.id for c in cands]
    store = await store_factory(ids)
    policy = build_policy(PolicyConfig(seed=1), PDConfig() if pd else None)
    seed = root_seed("m")
    text, keys = await populate(store, ids, prompt_tokens, seed, rng)
    pruner = Pruner(prune_k, random.Random(1)) if prune_k else None
    hash_s, decide_s = [], []
    trips = 0
    server_cpu = await store_cpu(store)
    cpu = time.process_time()
    for it in range(iterations):
        t0 = time.perf_counter()
        k = text_block_keys(text, HASHING.block_chars, seed, HASHING.max_blocks)
        t1 = time.perf_counter()
        req = RouteRequest(f"r{it}", tuple(k), prompt_tokens, 256, HASHING.block_tokens)
        before = store.round_trips
        routed = await decide(store, policy, req, cands, pruner=pruner)
        t2 = time.perf_counter()
        trips += store.round_trips - before
        await store.release(routed.booking)
        hash_s.append(t1 - t0)
        decide_s.append(t2 - t1)
    cpu = time.process_time() - cpu
    server_cpu = await store_cpu(store) - server_cpu
    trips /= iterations
    await store.close()
    med = statistics.median
    totals = sorted(a + b for a, b in zip(hash_s, decide_s))
    return {"hash_us": med(hash_s) * 1e6, "decide_us": med(decide_s) * 1e6,
            "total_us": med(totals) * 1e6, "p99_us": totals[min(len(totals) - 1, int(len(totals) * 0.99))] * 1e6,
            "blocks": len(keys), "trips": trips, "cpu_us": cpu / iterations * 1e6,
            "server_cpu_us": server_cpu / iterations * 1e6}


async def phase_case(n_instances: int, prompt_tokens: int, iterations: int, prune_k: int) -> dict[str, float]:
    """The phases of ``decide`` on the memory store, each timed alone (same set-up as bench_case)."""
    rng = random.Random(n_instances * 7 + prompt_tokens)
    cands = [Candidate(f"i{i}", cache_tokens=2_000_000, prefill_tokens_per_s=10_000) for i in range(n_instances)]
    ids = [c.id for c in cands]
    store = await memory_factory()(ids)
    policy = build_policy(PolicyConfig(seed=1), None)
    seed = root_seed("m")
    text, keys = await populate(store, ids, prompt_tokens, seed, rng)
    pruner = Pruner(prune_k, random.Random(1))
    phases: dict[str, list[float]] = {p: [] for p in ("hash", "prune", "snapshot", "choose", "book", "release")}
    clock = time.perf_counter
    for it in range(iterations):
        t0 = clock()
        k = text_block_keys(text, HASHING.block_chars, seed, HASHING.max_blocks)
        t1 = clock()
        req = RouteRequest(f"r{it}", tuple(k), prompt_tokens, 256, HASHING.block_tokens)
        pruned = pruner.prune(store, req, cands)
        chosen, req = (pruned.candidates, pruned.request) if pruned is not None else (cands, req)
        t2 = clock()
        snap = store.snapshot_now(req.keys, [c.id for c in chosen])
        t3 = clock()
        booking = RequestChooser(policy, req, chosen, None, cands)(snap)
        t4 = clock()
        store.book(booking)
        t5 = clock()
        await store.release(booking)
        t6 = clock()
        for name, a, b in zip(phases, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
            phases[name].append((b - a) * 1e6)
    return {name: statistics.median(v) for name, v in phases.items()}


async def store_cpu(store) -> float:
    """CPU seconds the Redis server has used so far (0 for the memory store): the benchmark's
    redis-server serves nobody else, so its delta is what the decisions (and releases) cost it."""
    client = getattr(store, "_client", None)
    if client is None:
        return 0.0
    from redis.asyncio import RedisCluster

    if isinstance(client, RedisCluster):  # every primary's, summed
        info = await client.info("cpu", target_nodes=RedisCluster.PRIMARIES)
    else:
        info = await client.info("cpu")
    nodes = [info] if "used_cpu_user" in info else [v for v in info.values() if isinstance(v, dict)]
    return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes)


def memory_factory():
    async def make(ids):
        store = MemoryStore({i: 10_000_000 for i in ids}, 600.0)
        await store.start()
        return store
    return make


def redis_factory(url: str, cluster: bool = False, lease_s: float = 15.0):
    from router.state.redis_store import RedisStore

    async def make(ids):
        store = RedisStore(url, {i: 10_000_000 for i in ids}, key_prefix=f"bench{random.getrandbits(32)}", timeout_s=5,
                           cluster=cluster, lease_s=lease_s)
        await store.start()
        return store
    return make


def load_note() -> str:
    return "Load average during the run: %.1f / %.1f / %.1f (2 cores)." % os.getloadavg()


def side_by_side(args: argparse.Namespace, argv: list[str]) -> int:
    """``--baseline``: the cases in a subprocess per tree and round; ranges over the rounds."""
    import subprocess

    from loadtests.overhead import router_source, source_label

    rev = source_label(args.baseline)
    keep = [a for a in argv if a != "--write"]
    cut = keep.index("--baseline")
    keep = keep[:cut] + keep[cut + 2:]
    results: dict[str, list[list[dict[str, float]]]] = {rev: [], "now": []}
    loads = []
    with router_source(args.baseline) as source:
        for rnd in range(args.rounds):
            for tree in ([rev, "now"] if rnd % 2 == 0 else ["now", rev]):
                env = dict(os.environ, DECISION_COST_SOURCE=str(source) if tree == rev else "")
                out = subprocess.run([sys.executable, __file__, *keep, "--json"], env=env, capture_output=True, text=True,
                                     check=True).stdout
                results[tree].append(json.loads(out.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
                print(f"round {rnd + 1} {tree} done (load {loads[-1]:.1f})", flush=True)

    def span(tree: str, i: int, field: str) -> str:
        vals = [run[i][field] for run in results[tree]]
        return f"{min(vals):,.0f}" if len(vals) == 1 or min(vals) == max(vals) else f"{min(vals):,.0f}–{max(vals):,.0f}"

    rows = []
    for i, case in enumerate(results["now"][0]):
        rows.append([case["store"], f"{int(case['instances']):,} × {int(case['tokens']) // 1024}K",
                     *(f"{span(rev, i, f)} → {span('now', i, f)}" for f in ("total_us", "p99_us", "cpu_us", "server_cpu_us")),
                     f"{span(rev, i, 'trips')} → {span('now', i, 'trips')}"])
    out = table(["store", "instances × tokens", f"total µs p50 ({rev} → now)", "total µs p99", "router CPU µs / decision",
                 "Redis CPU µs / decision", "round trips"], rows)
    print(out)
    if args.write:
        note = (f"{args.rounds} rounds, each tree in its own process per round, alternating which runs first; ranges over "
                f"the rounds. Load average (1 min) after each run: {min(loads):.1f}–{max(loads):.1f} (2 cores). CPU columns "
                "as in \"Decision cost at scale\" (benchmark process per decision + release; redis-server INFO cpu delta).")
        write_section(args.section or "Decision cost side by side", "python loadtests/decision_cost.py " + " ".join(argv),
                      note + "\n\n" + out)
    return 0


async def main(args: argparse.Namespace) -> int:
    rows = []
    found = []
    stores = [("memory", memory_factory())] + ([("redis", redis_factory(args.redis))] if args.redis else []) + \
        ([("redis cluster", redis_factory(args.redis_cluster, cluster=True))] if getattr(args, "redis_cluster", None) else [])
    cases = [(name, factory, k) for name, factory in stores for k in (args.candidates if not args.pd else [0])]
    for name, factory, k in cases:
        for n in args.instances:
            for tokens in args.tokens:
                iters = max(5, args.iterations // (4 if tokens >= 65536 or n >= 1024 else 1))
                r = await bench_case(factory, n, tokens, iters, args.pd, k)
                found.append({"store": name, "instances": n, "tokens": tokens, **r})
                if getattr(args, "json", False):
                    continue
                rows.append([name + (" (PD)" if args.pd else ""), k or "off", n, tokens, r["blocks"], f"{r['hash_us']:.0f}",
                             f"{r['decide_us']:.0f}", f"{r['total_us']:.0f}", f"{r['p99_us']:.0f}", f"{r['cpu_us']:.0f}",
                             f"{r['server_cpu_us']:.0f}", f"{r['trips']:.0f}"])
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
    if getattr(args, "json", False):
        print(json.dumps(found))
        return 0
    out = table(["store", "pruning k", "instances", "prompt tokens", "blocks", "hash µs (p50)", "decide µs (p50)", "total µs (p50)",
                 "total µs (p99)", "router CPU µs / decision", "Redis CPU µs / decision", "Redis round trips / decision"], rows)
    print(out)
    phase_rows = []
    if getattr(args, "phases", False) and not args.pd:
        for k in args.candidates:
            for n in args.instances:
                for tokens in args.tokens:
                    ph = await phase_case(n, tokens, max(5, args.iterations // (4 if tokens >= 65536 or n >= 1024 else 1)), k)
                    phase_rows.append([k or "off", n, tokens, *(f"{v:.0f}" for v in ph.values())])
        phases = table(["pruning k", "instances", "prompt tokens", "hash µs", "prune µs", "snapshot µs", "choose µs",
                        "book µs", "release µs"], phase_rows)
        print(phases)
        out += "\n\nPhases of a decision on the memory store, each timed alone (medians; `--phases`):\n\n" + phases
    if args.write:
        note = ("Targets: a decision (hash + decide) ≤ 200 µs at 256 instances × 32K tokens and ≤ 1 ms at 1,024 × 128K. "
                "Every instance carries a request of its own (random booked prefill), the prompt's prefix sits on 4 of them. "
                "`decide` = residency look-up, candidate pruning (`pruning k`: the holders of the first block plus the k "
                "least-loaded; `off`: every instance scored), `ttft` scoring, booking (memory: in-process; Redis: one "
                "round trip to a local standalone redis-server, or to a local 3-node Cluster: one call per slot, "
                "pipelined). CPU columns: the benchmark process's CPU per decision "
                "(decision + release, hashing included) and the redis-server's (INFO cpu delta), both robust to a loaded "
                "machine where wall-time percentiles are not. " + load_note())
        write_section(args.section or "Decision cost at scale", "python loadtests/decision_cost.py " + " ".join(sys.argv[1:]),
                      note + "\n\n" + out)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis", help="also measure the Redis store at this URL")
    p.add_argument("--redis-cluster", metavar="URL", help="also measure it on the Redis Cluster this node belongs to")
    p.add_argument("--instances", type=int, nargs="+", default=[8, 64, 256, 1024])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--pd", action="store_true", help="half prefill, half decode instances: (P, D) route pricing")
    p.add_argument("--candidates", type=int, nargs="+", default=[0, PolicyConfig().candidates],
                   help="candidate pruning: holders + this many least-loaded (policy.candidates); 0 = score all")
    p.add_argument("--phases", action="store_true", help="also time each phase of a memory-store decision alone")
    p.add_argument("--write", action="store_true", help="record the table in docs/benchmarks.md")
    p.add_argument("--baseline", metavar="REF", help="also run the router package of this git commit (or directory holding router/), side by side")
    p.add_argument("--rounds", type=int, default=1, help="with --baseline: rounds of each tree")
    p.add_argument("--section", help="the docs/benchmarks.md section --write replaces (or appends); default "
                   "\"Decision cost at scale\", with --baseline \"Decision cost side by side\"")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parsed = p.parse_args()
    if parsed.baseline:
        raise SystemExit(side_by_side(parsed, sys.argv[1:]))
    raise SystemExit(asyncio.run(main(parsed)))
