"""One replica's decisions on the Redis store with many in flight: CPU, and how often it decided twice.

Why beside ``decision_cost.py`` (one decision at a time): a replica with requests in flight
books and releases while each decision's round trip is out, and a store that cannot tell its
own changes from other replicas' re-runs the policy (``revisions``) or even moves bookings
(``corrections``: another call each) over load it booked itself. That only shows with
decisions in flight.

For each tree (this one, and with ``--baseline REF`` the router package of that commit or a
directory), a subprocess runs ``--in-flight`` workers, each deciding and releasing in turn on
one RedisStore, over ``--instances`` candidates pruned to 16, prompts of 2,048 tokens drawn from
32 prefixes, every instance busy with a request of its own (decision_cost.populate). A warm-up
pass, then ``--decisions`` measured: the subprocess's CPU (process time) and the redis-server's
(INFO cpu), per decision and its release. Trees alternate, ``--rounds`` times.

    python loadtests/redis_in_flight.py [--baseline REF] [--instances 2 64] [--in-flight 16] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if os.environ.get("IN_FLIGHT_SOURCE"):  # a baseline's subprocess: the router package of another tree
    sys.path.insert(0, os.environ["IN_FLIGHT_SOURCE"])

SECTION = "Redis store with decisions in flight"


async def run_case(url: str, n_instances: int, in_flight: int, decisions: int) -> dict[str, float]:
    from loadtests.decision_cost import HASHING, make_text, populate, redis_factory, store_cpu
    from router.config.model import PolicyConfig
    from router.request.hashing import root_seed, text_block_keys
    from router.scheduling import Candidate, RouteRequest, build_policy
    from router.scheduling.decide import decide
    from router.scheduling.prune import Pruner

    rng = random.Random(3)
    cands = [Candidate(f"i{i}", cache_tokens=2_000_000, prefill_tokens_per_s=10_000) for i in range(n_instances)]
    ids = [c.id for c in cands]
    store = await redis_factory(url)(ids)
    policy = build_policy(PolicyConfig(seed=1), None)
    seed = root_seed("m")
    await populate(store, ids, 2048, seed, rng)
    prompts = [tuple(text_block_keys(make_text(2048, random.Random(t)), HASHING.block_chars, seed, HASHING.max_blocks))
               for t in range(32)]
    pruner = Pruner(16, random.Random(1))
    count = 0

    async def worker(w: int) -> None:
        nonlocal count
        while count < decisions:
            count += 1
            req = RouteRequest(f"r{w}-{count}-{rng.random()}", prompts[rng.randrange(len(prompts))], 2048, 256,
                               HASHING.block_tokens)
            routed = await decide(store, policy, req, cands, pruner=pruner)
            await asyncio.sleep(0)  # the request's life: other decisions run meanwhile
            await store.release(routed.booking)

    await asyncio.gather(*(worker(w) for w in range(in_flight)))  # warm-up pass
    count = 0
    corrections, revisions = store.corrections, getattr(store, "revisions", None)
    server, cpu = await store_cpu(store), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(in_flight)))
    cpu, server = time.process_time() - cpu, await store_cpu(store) - server
    out = {"router_us": cpu / count * 1e6, "redis_us": server / count * 1e6,
           "corrections": (store.corrections - corrections) / count,
           "revisions": -1.0 if revisions is None else (store.revisions - revisions) / count}  # type: ignore[attr-defined]
    await store.close()
    return out


def measure(source: Path | None, url: str, n: int, in_flight: int, decisions: int) -> dict[str, float]:
    env = dict(os.environ)
    if source is not None:
        env["IN_FLIGHT_SOURCE"] = str(source)
    proc = subprocess.run([sys.executable, __file__, "--case", url, str(n), str(in_flight), str(decisions)], env=env,
                          capture_output=True, text=True, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs=4, metavar=("URL", "N", "IN_FLIGHT", "DECISIONS"), help=argparse.SUPPRESS)
    p.add_argument("--baseline", metavar="REF", help="also measure the router package of this git commit (or a directory holding router/)")
    p.add_argument("--instances", type=int, nargs="+", default=[2, 64])
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--decisions", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--section", default=SECTION)
    args = p.parse_args(argv)
    if args.case:
        url, n, in_flight, decisions = args.case
        print(json.dumps(asyncio.run(run_case(url, int(n), int(in_flight), int(decisions)))))
        return 0
    from loadtests.cpu_per_request import redis_server
    from loadtests.overhead import router_source, source_label
    from loadtests.report import table, write_section

    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        url, _ = stack.enter_context(redis_server())
        trees: dict[str, Path | None] = {"pd-router": None}
        if args.baseline:
            trees[f"pd-router@{source_label(args.baseline)}"] = stack.enter_context(router_source(args.baseline))
        for rnd in range(args.rounds):
            order = list(trees.items()) if rnd % 2 == 0 else list(reversed(trees.items()))
            for name, source in order:
                for n in args.instances:
                    res = measure(source, url, n, args.in_flight, args.decisions)
                    results.setdefault((name, n), []).append(res)
                    print(f"  round {rnd + 1} {name:<22} {n:>4} instances: router {res['router_us']:.0f} µs, "
                          f"redis-server {res['redis_us']:.0f} µs, corrections {res['corrections']:.1%}", file=sys.stderr,
                          flush=True)
    rows = []
    for n in args.instances:
        for name in trees:
            runs = results[(name, n)]

            def both(key: str, fmt: str, runs: list[dict[str, float]] = runs) -> str:
                return " / ".join(format(r[key], fmt) for r in runs)

            revised = "—" if runs[0]["revisions"] < 0 else both("revisions", ".0%")
            rows.append([n, name, both("router_us", ".0f"), both("redis_us", ".0f"),
                         both("corrections", ".0%"), revised])
    body = table(["instances", "tree", "router CPU µs / decision + release", "redis-server CPU µs",
                  "decisions moved (corrections)", "policy run again (revisions)"], rows)
    note = "Load average %.1f / %.1f / %.1f (2 cores) at the end." % os.getloadavg()
    print(body + "\n\n" + note)
    if args.write:
        method = (f"{args.in_flight} decisions in flight on one replica, {args.decisions} measured per run after a "
                  f"warm-up pass, candidates pruned to 16, 2,048-token prompts from 32 prefixes; one figure per round "
                  f"({args.rounds} rounds, trees alternating). " + note)
        write_section(args.section, "python loadtests/redis_in_flight.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), method + "\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
