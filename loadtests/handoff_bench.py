"""The handoff axes measured in the trace replay (router/tools/replay), each against its target.

    python loadtests/handoff_bench.py estimate [--trace PATH] [--limit N] [--write]
    python loadtests/handoff_bench.py burst [--write]

estimate: TTFT estimate error of disaggregated routes, per PD flavour: |measured/estimated - 1|
at p50/p90 over the requests the ``ttft`` policy sent to a (P, D) pair, on the Mooncake
conversation trace (../shared/traces/conversation_trace.jsonl, or --trace). Target: p90 <= 0.2.

burst: a link-saturating burst of long prompts on a disaggregated cluster, the same policy
with and without link-aware booking (pd.handoff.link_aware). Target: decode TBT p99 cut by
>= 30%, TTFT p90 no worse.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import write_section
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.source import load_trace
from router.tools.replay.record import TBT_BIN_S
from router.tools.replay.summary import hist_percentile, percentile
from router.tools.replay.trace import Trace, TraceError, TraceRequest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"


def read_trace(path: str, limit: int | None, scale: float) -> Trace | None:
    try:
        return load_trace(path, 0).limited(limit).scaled(scale)
    except TraceError as exc:
        print(f"trace not readable: {path}: {exc} (the public traces live in ../shared/traces; see its README.md)",
              file=sys.stderr)
        return None


def estimate_errors(sim: Simulation) -> list[float]:
    rec = sim.record
    return [abs((f - a) / e - 1) for f, a, e, m in zip(rec.first_token, rec.arrival, rec.estimate, rec.mode)
            if m == "disaggregated" and e > 0 and not math.isnan(f)]


def transfer_errors(sim: Simulation) -> list[float]:
    """|measured / priced - 1| of the handoff term alone: prefill end -> KV on D."""
    rec = sim.record
    return [abs(h / e - 1) for h, e in zip(rec.handoff, rec.transfer_estimate)
            if e > 0.001 and not math.isnan(h)]


def estimate(args: argparse.Namespace) -> int:
    trace = read_trace(args.trace, args.limit, args.rate_scale)
    if trace is None:
        return 2
    rows = ["| flavour | link-aware | PD routes | TTFT error p50 | TTFT error p90 | target p90 <= 0.2 | transfer term error p50 | p90 |",
            "|---|---|---|---|---|---|---|---|"]
    for flavor, aware in (("vllm", False), ("vllm", True), ("sglang", False), ("sglang", True)):
        spec = ClusterSpec(prefill=4, decode=4, flavor=flavor, link_aware=aware)
        sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
        sim.run()
        errs = estimate_errors(sim)
        p50, p90 = percentile(errs, 50), percentile(errs, 90)
        terr = transfer_errors(sim)
        rows.append(f"| {flavor} | {'on' if aware else 'off'} | {len(errs)} | {p50:.3f} | {p90:.3f} | {'met' if p90 <= 0.2 else 'not met'} | "
                    f"{percentile(terr, 50):.3f} | {percentile(terr, 90):.3f} |")
        print(rows[-1], flush=True)
    body = (f"Trace: `{Path(args.trace).name}`, first {len(trace.requests)} requests, arrivals x{args.rate_scale:g}; "
            "4 prefill + 4 decode llama3-8b-h100 engines, shared NICs, policy `ttft`. The transfer term "
            "compares the priced `transfer_s` (>= 1 ms) with the measured time from the prefill's end to the KV "
            "on D (setup included).\n\n" + "\n".join(rows))
    print(body)
    if args.write:
        cmd = f"python loadtests/handoff_bench.py estimate --limit {args.limit} --rate-scale {args.rate_scale:g}"
        write_section("Handoff: TTFT estimate error of PD routes per flavour", cmd, body)
    return 0


def burst_trace(long_prompts: int, long_tokens: int, background: int, seed: int) -> Trace:
    """Chat traffic decoding throughout (short prompts, long answers) and, one second in,
    a burst of long unique prompts whose KV saturates the NICs."""
    rng = random.Random(seed)
    reqs = [TraceRequest(rng.uniform(0.0, 4.0), 800, 400, tuple(range(10_000 + 2 * i, 10_002 + 2 * i)))
            for i in range(background)]
    blocks = -(-long_tokens // 512)
    reqs += [TraceRequest(1.0 + rng.uniform(0.0, 0.5), long_tokens, 64,
                          tuple(range(1_000_000 + i * blocks, 1_000_000 + (i + 1) * blocks)))
             for i in range(long_prompts)]
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace("burst", 512, tuple(reqs))


def burst(args: argparse.Namespace) -> int:
    trace = burst_trace(args.long_prompts, args.long_tokens, args.background, args.seed)
    rows = ["| link-aware booking | TBT p50 ms | TBT p99 ms | TTFT p90 s | TTFT p99 s |", "|---|---|---|---|---|"]
    results = {}
    for aware in (False, True):
        spec = ClusterSpec(prefill=args.prefill, decode=args.decode, link_gbps=args.link_gbps, link_aware=aware,
                           transfer_interference=args.interference)
        sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
        rec = sim.run()
        ttft = [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]
        r = (hist_percentile(rec.tbt_hist, 50, TBT_BIN_S), hist_percentile(rec.tbt_hist, 99, TBT_BIN_S),
             percentile(ttft, 90), percentile(ttft, 99))
        results[aware] = r
        rows.append(f"| {'on' if aware else 'off'} | {r[0] * 1000:.1f} | {r[1] * 1000:.1f} | {r[2]:.3f} | {r[3]:.3f} |")
        print(rows[-1], flush=True)
    off, on = results[False], results[True]
    cut = 1 - on[1] / off[1]
    verdict = (f"TBT p99 cut by {cut:.0%} (target >= 30%: {'met' if cut >= 0.3 else 'not met'}); TTFT p90 "
               f"{on[2]:.3f} s vs {off[2]:.3f} s ({'no worse' if on[2] <= off[2] * 1.0001 else 'worse'}).")
    body = (f"{args.long_prompts} prompts of {args.long_tokens} tokens within 0.5 s, over {args.background} chat "
            f"requests (800 in / 400 out) decoding through 4 s; {args.prefill} prefill + {args.decode} decode "
            f"llama3-8b-h100 engines, {args.link_gbps:g} Gbit/s NIC each, transfer interference "
            f"{args.interference:g}, policy `ttft`, replay.\n\n" + "\n".join(rows) + "\n\n" + verdict)
    print(body)
    if args.write:
        cmd = (f"python loadtests/handoff_bench.py burst --long-prompts {args.long_prompts} --long-tokens "
               f"{args.long_tokens} --background {args.background} --link-gbps {args.link_gbps:g}")
        write_section("Handoff: link-aware booking under a burst of long prompts", cmd, body)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("estimate")
    e.add_argument("--trace", default=str(DEFAULT_TRACE))
    e.add_argument("--limit", type=int, default=3000)
    e.add_argument("--rate-scale", type=float, default=1.0)
    e.add_argument("--write", action="store_true")
    e.set_defaults(func=estimate)
    b = sub.add_parser("burst")
    b.add_argument("--long-prompts", type=int, default=32)
    b.add_argument("--long-tokens", type=int, default=32000)
    b.add_argument("--background", type=int, default=160)
    b.add_argument("--prefill", type=int, default=4)
    b.add_argument("--decode", type=int, default=4)
    b.add_argument("--link-gbps", type=float, default=50.0)
    b.add_argument("--interference", type=float, default=0.1)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--write", action="store_true")
    b.set_defaults(func=burst)
    args = p.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
