"""PD pair scoring versus independent choice, on an emulated 2 prefill + 2 decode cluster.

The same seeded shared-prefix chat workload goes through pd-router with
- ``ttft``: joint (P, D) pair scoring with selective disaggregation, and
- ``cache_aware``: P chosen by cache affinity and D by load, independently (the peers' way),
- ``round_robin``: both legs round robin,
each in front of the same engines (caches emptied between runs). Reported: client-side
TTFT p50/p90, engine-side prefix hit ratio, routes taken, and for ``ttft`` the estimate
error (measured / estimated TTFT, from the router's own histogram).

    python loadtests/pd_pairing.py [--flavor vllm] [--requests 160] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import table, write_section  # noqa: E402
from router.tools.demo import _delta  # noqa: E402
from router.tools.localrun import emulated_cluster, engine_stats, pd_cluster_spec, reset_engines, router_config, router_process  # noqa: E402
from router.tools.workload import SharedPrefixWorkload, drive  # noqa: E402

_BUCKET = re.compile(r'pd_router_ttft_estimate_ratio_bucket\{le="([^"]+)",mode="([^"]+)"\} ([0-9.e+]+)')


def estimate_error(metrics: str) -> str:
    """Median and mean of measured/estimated TTFT for end-to-end modes (buckets -> median)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in metrics.splitlines():
        m = _BUCKET.match(line)
        if m and m.group(2) != "prefill_leg":
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(3))
        elif line.startswith("pd_router_ttft_estimate_ratio_sum") and 'mode="prefill_leg"' not in line:
            total += float(line.split()[-1])
        elif line.startswith("pd_router_ttft_estimate_ratio_count") and 'mode="prefill_leg"' not in line:
            count += float(line.split()[-1])
    if not count:
        return "n/a"
    median = next(le for le, c in sorted(buckets.items()) if c >= count / 2)
    return f"median ≤{median:g}×, mean {total / count:.2f}× (n={count:.0f})"


def modes(metrics: str) -> str:
    found = re.findall(r'pd_router_route_modes_total\{mode="([^"]+)"\} ([0-9.]+)', metrics)
    return ", ".join(f"{m} {float(n):.0f}" for m, n in found)


def main(args: argparse.Namespace) -> int:
    workload = SharedPrefixWorkload(requests=args.requests, groups=args.groups, seed=args.seed)
    bodies = workload.bodies()
    rows = []
    specs = pd_cluster_spec(2, 2, flavor=args.flavor)
    with emulated_cluster(specs, time_scale=args.time_scale, cache_tokens=args.cache_tokens, seed=args.seed) as engines:
        for policy in args.policies:
            reset_engines(engines)
            config = router_config(engines, policy, time_scale=args.time_scale, cache_tokens=args.cache_tokens, seed=args.seed)
            with router_process(config) as router:
                before = engine_stats(engines)
                result = asyncio.run(drive(router.url, bodies, args.concurrency))
                time.sleep(0.3)
                hit, load = _delta(before, engine_stats(engines))
                metrics = httpx.get(router.url + "/metrics", timeout=5).text
            rows.append([policy, len(result.ttft_s) + result.errors, result.errors, f"{hit:.0%}",
                         f"{result.ttft_p50 * 1000:.0f}", f"{result.ttft_p90 * 1000:.0f}", modes(metrics),
                         estimate_error(metrics) if policy == "ttft" else "-",
                         " ".join(f"{e}:{p / 1000:.0f}k" for e, (n, p) in sorted(load.items()))])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    out = table(["policy", "requests", "errors", "prefix hit", "TTFT p50 ms", "TTFT p90 ms", "routes", "estimate error",
                 "prefill tokens per engine"], rows)
    print(out)
    if args.write:
        note = (f"Emulated 2 prefill + 2 decode {args.flavor} engines (llama3-8b-h100 profile, real time: time scale "
                f"{args.time_scale}, {args.cache_tokens} KV tokens each), {args.requests} streaming chat requests, "
                f"{args.groups} tenants × {workload.users} users with ~{workload.system_tokens}-token system prompts, "
                f"{args.concurrency} concurrent clients. "
                "`ttft` = joint pair scoring; `cache_aware` = P by cache affinity, D by load, chosen independently; "
                "estimate error = measured / estimated TTFT (1.0 is perfect).")
        write_section(f"PD pair scoring vs independent choice ({args.flavor})",
                      f"python loadtests/pd_pairing.py --flavor {args.flavor} --requests {args.requests} --write",
                      note + "\n\n" + out)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="vllm", choices=["vllm", "sglang"])
    p.add_argument("--policies", nargs="+", default=["ttft", "cache_aware", "round_robin"])
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--cache-tokens", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true")
    raise SystemExit(main(p.parse_args()))
