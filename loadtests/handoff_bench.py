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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import write_section
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.source import load_trace
from router.tools.replay.summary import percentile
from router.tools.replay.trace import Trace, TraceError

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


def estimate(args: argparse.Namespace) -> int:
    trace = read_trace(args.trace, args.limit, args.rate_scale)
    if trace is None:
        return 2
    rows = ["| flavour | PD routes | error p50 | error p90 | target p90 <= 0.2 |", "|---|---|---|---|---|"]
    for flavor in ("vllm", "sglang"):
        spec = ClusterSpec(prefill=4, decode=4, flavor=flavor)
        sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
        sim.run()
        errs = estimate_errors(sim)
        p50, p90 = percentile(errs, 50), percentile(errs, 90)
        rows.append(f"| {flavor} | {len(errs)} | {p50:.3f} | {p90:.3f} | {'met' if p90 <= 0.2 else 'not met'} |")
        print(rows[-1], flush=True)
    body = (f"Trace: `{Path(args.trace).name}`, first {len(trace.requests)} requests, arrivals x{args.rate_scale:g}; "
            "4 prefill + 4 decode llama3-8b-h100 engines, shared NICs, policy `ttft`.\n\n" + "\n".join(rows))
    print(body)
    if args.write:
        cmd = f"python loadtests/handoff_bench.py estimate --limit {args.limit} --rate-scale {args.rate_scale:g}"
        write_section("Handoff: TTFT estimate error of PD routes per flavour", cmd, body)
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
    args = p.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
