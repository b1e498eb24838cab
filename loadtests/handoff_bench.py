"""The handoff axes measured in the trace replay (router/tools/replay), each against its target.

    python loadtests/handoff_bench.py estimate [--trace PATH] [--limit N] [--seeds S ...] [--write]
    python loadtests/handoff_bench.py burst [--seeds S ...] [--write]

estimate: TTFT estimate error of disaggregated routes, per PD flavour: |measured/estimated - 1|
at p50/p90 over the requests the ``ttft`` policy sent to a (P, D) pair, on the Mooncake
conversation trace (../shared/traces/conversation_trace.jsonl, or --trace), with the engines
and the load drawn per seed. Target: p90 <= 0.2.

burst: a link-saturating burst of long prompts on a disaggregated cluster, the same policy
with and without link-aware booking (pd.handoff.link_aware), and each of its parts alone (the
link reservation, the isolation rule strict or by budget). Target: decode TBT p99 cut by
>= 30%, TTFT p90 no worse.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.estimate_terms import HEADER, by_term_rows, contributions
from loadtests.report import write_section
from router.tools.emulator.perf import PROFILES, get_profile
from router.tools.localrun import profile_timing
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.source import load_trace
from router.tools.replay.record import TBT_BIN_S
from router.tools.replay.summary import hist_percentile, percentile
from router.tools.replay.trace import Trace, TraceError, TraceRequest, finish

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


@dataclass(frozen=True)
class EstimateDraw:
    """One seed's engines and load: drawn, never fitted, so no one profile can be tuned to."""

    seed: int
    profile: str
    slowdown: float
    link_gbps: float
    rate_scale: float
    step_tokens: int  # the engines' chunked-prefill budget (the router is told it)
    interference: float  # steps slower while the NIC moves KV (the router is told it)


def draw_engines(seed: int, utilisation: tuple[float, float]) -> EstimateDraw:
    rng = random.Random(seed)
    profile = rng.choice(sorted(PROFILES))
    slowdown = round(rng.uniform(0.5, 2.0), 2)
    link = rng.choice((50.0, 100.0, 200.0, 400.0))
    # arrivals scaled so the drawn engines see a comparable load: the trace at x1 suits 8B engines at speed 1
    speed = profile_timing(get_profile(profile), slowdown)["prefill_tokens_per_s"] / \
        profile_timing(get_profile("llama3-8b-h100"), 1.0)["prefill_tokens_per_s"]
    rate = round(rng.uniform(*utilisation) * speed, 3)
    # drawn after the rest, so a seed keeps the engines it drew before these were
    return EstimateDraw(seed, profile, slowdown, link, rate, rng.choice((2048, 4096, 8192, 16384)),
                        round(rng.uniform(0.0, 0.2), 3))


def stamp_resolution(trace: Trace) -> float:
    """The grid a trace's timestamps were rounded to: the most common gap between distinct
    consecutive stamps, to the ms (0 when there are fewer than two). The conversation trace
    stamps one instant every 3 s (every gap 3000 +- 3 ms, ~10 requests per stamp)."""
    stamps = sorted({round(r.arrival_s, 3) for r in trace.requests})
    gaps = Counter(round(b - a, 3) for a, b in zip(stamps, stamps[1:]))
    return gaps.most_common(1)[0][0] if gaps else 0.0


def spread_arrivals(trace: Trace, resolution_s: float, seed: int) -> Trace:
    """Each arrival at a uniformly drawn instant of the ``resolution_s`` its timestamp was
    rounded to: given how many arrived in a slot, a Poisson process puts them uniformly in
    it. As stamped, ~10 requests share each instant and the replay would batch them into one
    engine step (the first one routed cannot know the next nine); spread over less than the
    grid (last session's 1 s of a 3 s grid), arrivals come in bursts at 3x the trace's rate
    with idle gaps between them, an arrival process no trace recorded."""
    if resolution_s <= 0:
        return trace
    rng = random.Random(seed)
    return finish(trace.name, trace.block_tokens,
                  [replace(r, arrival_s=r.arrival_s + rng.uniform(0.0, resolution_s)) for r in trace.requests])


def estimate(args: argparse.Namespace) -> int:
    base = read_trace(args.trace, args.limit, 1.0)
    if base is None:
        return 2
    rows = ["| seed | engines | flavour | link-aware | PD routes | error p50 | error p90 | transfer term p50 | p90 |",
            "|---|---|---|---|---|---|---|---|---|"]
    pooled: dict[tuple[str, bool], list[float]] = {}
    terms: dict[tuple[str, bool], list[tuple[float, tuple[float, ...]]]] = {}
    resolution = stamp_resolution(base) if args.resolution_s is None else args.resolution_s
    for seed in args.seeds:
        d = draw_engines(seed, (args.utilisation_min, args.utilisation_max))
        trace = spread_arrivals(base, resolution, seed).scaled(d.rate_scale)
        engines = (f"{d.profile} x{d.slowdown:g} slower, {d.link_gbps:g} Gbit/s, arrivals x{d.rate_scale:g}, "
                   f"{d.step_tokens} tokens/step, interference {d.interference:g}")
        for flavor in args.flavours:
            for aware in args.link_aware:
                spec = ClusterSpec(prefill=4, decode=4, flavor=flavor, link_aware=aware, profile=d.profile,
                                   slowdown=d.slowdown, link_gbps=d.link_gbps, max_batched_tokens=d.step_tokens,
                                   prefill_chunk_tokens=d.step_tokens, transfer_interference=d.interference)
                sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
                sim.run()
                errs, terr = estimate_errors(sim), transfer_errors(sim)
                pooled.setdefault((flavor, aware), []).extend(errs)
                terms.setdefault((flavor, aware), []).extend(contributions(sim.record))
                rows.append(f"| {seed} | {engines} | {flavor} | {'on' if aware else 'off'} | {len(errs)} | "
                            f"{percentile(errs, 50):.3f} | {percentile(errs, 90):.3f} | "
                            f"{percentile(terr, 50):.3f} | {percentile(terr, 90):.3f} |")
                print(rows[-1], flush=True)
    summary = ["| flavour | link-aware | PD routes, all seeds | error p50 | error p90 | target p90 <= 0.2 |", "|---|---|---|---|---|---|"]
    for (flavor, aware), errs in pooled.items():
        p90 = percentile(errs, 90)
        summary.append(f"| {flavor} | {'on' if aware else 'off'} | {len(errs)} | {percentile(errs, 50):.3f} | {p90:.3f} | "
                       f"{'met' if p90 <= 0.2 else 'not met'} |")
    spread = (f"each arrival spread uniformly over the {resolution:g} s grid its timestamp was rounded to"
              + (" (the trace's own, `stamp_resolution`)" if args.resolution_s is None else "")
              if resolution > 0 else "arrivals as stamped (~10 requests per instant)")
    body = (f"Trace: `{Path(args.trace).name}`, first {len(base.requests)} requests, {spread}; 4 prefill + 4 decode "
            "engines drawn per seed (profile, step-time slowdown 0.5-2x, NIC Gbit/s, arrival rate for a "
            f"utilisation drawn in {args.utilisation_min:g}-{args.utilisation_max:g}, tokens per step 2K-16K, transfer "
            "interference 0-0.2; the router is told each), shared NICs, policy `ttft`, "
            "replay. Error = |measured / estimated TTFT - 1| over the requests sent to a (P, D) pair; the transfer "
            "term compares the priced `transfer_s` (>= 1 ms) with the measured time from the prefill's end to the "
            "KV on D.\n\n" + "\n".join(summary) + "\n\nPer seed:\n\n" + "\n".join(rows))
    if args.by_term:
        body += ("\n\nBy term (`--by-term`): a term's contribution to a request's error is (measured - priced) / "
                 "priced TTFT, so the five add up to measured / estimated - 1 (all seeds pooled); measured: P's "
                 "queue = arrival -> P schedules it, prefill -> P's prefill ends, transfer -> KV on D, admission "
                 "-> D schedules it, step -> first token.\n\n" + "\n".join(
                     HEADER + [r for (flavor, aware), c in terms.items()
                               for r in by_term_rows(f"{flavor}{' link-aware' if aware else ''}", c)]))
    print(body)
    if args.write:
        aware = " ".join("on" if a else "off" for a in args.link_aware)
        cmd = (f"python loadtests/handoff_bench.py estimate --limit {args.limit} --seeds {' '.join(map(str, args.seeds))}"
               + (f" --link-aware {aware}" if aware != "off" else "")
               + (f" --resolution-s {args.resolution_s:g}" if args.resolution_s is not None else "")
               + (" --by-term" if args.by_term else ""))
        write_section("Handoff: TTFT estimate error of PD routes per flavour", cmd, body)
    return 0


def burst_trace(long_prompts: int, long_tokens: int, background: int, seed: int, spread_s: float = 0.5) -> Trace:
    """Chat traffic decoding throughout (short prompts, long answers) and, one second in,
    a burst of long unique prompts (arriving within ``spread_s``) whose KV saturates the NICs."""
    rng = random.Random(seed)
    reqs = [TraceRequest(rng.uniform(0.0, 4.0), 800, 400, tuple(range(10_000 + 2 * i, 10_002 + 2 * i)))
            for i in range(background)]
    blocks = -(-long_tokens // 512)
    reqs += [TraceRequest(1.0 + rng.uniform(0.0, spread_s), long_tokens, 64,
                          tuple(range(1_000_000 + i * blocks, 1_000_000 + (i + 1) * blocks)))
             for i in range(long_prompts)]
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace("burst", 512, tuple(reqs))


# (label, pd.handoff.link_aware, pd.handoff.isolation): the baseline, each part of link-aware booking
# alone, the strict isolation of the last version, and link-aware booking as it is now (auto = budget)
BURST_VARIANTS = (("off", False, "auto"), ("link reservation only", True, "off"), ("strict isolation only", False, "strict"),
                  ("link + strict isolation", True, "strict"), ("on (link + budget isolation)", True, "auto"))


def burst(args: argparse.Namespace) -> int:
    rows = ["| seed | link-aware booking | TBT p50 ms | TBT p99 ms | TTFT p90 s | TTFT p99 s | short prompts' TTFT p90 s | "
            "decode-alone routes |", "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for seed in args.seeds:
        trace = burst_trace(args.long_prompts, args.long_tokens, args.background, seed)
        results = {}
        for label, aware, isolation in BURST_VARIANTS:
            spec = ClusterSpec(prefill=args.prefill, decode=args.decode, link_gbps=args.link_gbps, link_aware=aware,
                               isolation=isolation, transfer_interference=args.interference)
            sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
            rec = sim.run()
            ttft = [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]
            short = [f - a for f, a, p in zip(rec.first_token, rec.arrival, rec.prompt)
                     if not math.isnan(f) and p < args.long_tokens]
            r = (hist_percentile(rec.tbt_hist, 50, TBT_BIN_S), hist_percentile(rec.tbt_hist, 99, TBT_BIN_S),
                 percentile(ttft, 90), percentile(ttft, 99), percentile(short, 90))
            results[label] = r
            local = sum(1 for m in rec.mode if m == "decode_only")
            long_local = sum(1 for m, p in zip(rec.mode, rec.prompt) if m == "decode_only" and p >= args.long_tokens)
            rows.append(f"| {seed} | {label} | {r[0] * 1000:.1f} | {r[1] * 1000:.1f} | {r[2]:.3f} | {r[3]:.3f} | "
                        f"{r[4]:.3f} | {local} ({long_local} long) |")
            print(rows[-1], flush=True)
        off, on = results["off"], results[BURST_VARIANTS[-1][0]]
        cut = 1 - on[1] / off[1]
        verdicts.append(f"seed {seed}: TBT p99 cut by {cut:.0%} (target >= 30%: {'met' if cut >= 0.3 else 'not met'}); "
                        f"TTFT p90 {on[2]:.3f} s vs {off[2]:.3f} s ({'no worse' if on[2] <= off[2] * 1.0001 else 'worse'}).")
    body = (f"{args.long_prompts} prompts of {args.long_tokens} tokens within 0.5 s, over {args.background} chat "
            f"requests (800 in / 400 out) decoding through 4 s; {args.prefill} prefill + {args.decode} decode "
            f"llama3-8b-h100 engines, {args.link_gbps:g} Gbit/s NIC each, transfer interference "
            f"{args.interference:g}, policy `ttft`, pd.tbt_target_s 0.1 (the default), replay (virtual time). "
            "Link-aware booking has two parts, measured apart: the link reservation (KV bytes in flight booked per "
            "NIC and priced; beyond `max_link_backlog_s` a pair waits) and isolation (`pd.handoff.isolation`: which "
            "prompts whose prefill chunk plus a decode step passes `pd.tbt_target_s` a decode instance with decodes "
            "running may take alone). `off` sends the burst to decode instances whenever the prefill queues are "
            "longer than prefilling there (`decode_only_faster`), and every chunk of such a prefill holds all the "
            "decodes running there; `strict` never does, so the burst has only the prefill pool's compute; `budget` "
            "(what link-aware booking does now) lets each decode instance take one such prompt at a time: its "
            "decodes see one stalled run (one prompt's chunks), not the chunks of every prompt the queues would "
            "send there.\n\n" + "\n".join(rows) + "\n\n" + "\n".join(f"- {v}" for v in verdicts))
    print(body)
    if args.write:
        cmd = (f"python loadtests/handoff_bench.py burst --long-prompts {args.long_prompts} --long-tokens "
               f"{args.long_tokens} --background {args.background} --prefill {args.prefill} --decode {args.decode} "
               f"--link-gbps {args.link_gbps:g} --seeds {' '.join(map(str, args.seeds))} --write")
        title = "Handoff: link-aware booking under a burst of long prompts"
        if (args.long_prompts, args.long_tokens, args.prefill, args.decode) != (32, 32000, 4, 4):
            title += f" ({args.long_prompts}x{args.long_tokens // 1000}K, {args.prefill}P+{args.decode}D)"
            body = ("A burst shape held out: not looked at while the budget rule was designed (on the default "
                    "32x32K, 4P+4D shape).\n\n" + body)
        write_section(title, cmd, body)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("estimate")
    e.add_argument("--trace", default=str(DEFAULT_TRACE))
    e.add_argument("--limit", type=int, default=2000)
    e.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    e.add_argument("--flavours", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
    e.add_argument("--resolution-s", type=float, default=None,
                   help="spread arrivals over this grid their timestamps were rounded to (default: the trace's "
                        "own, the most common gap between stamps; 0: as stamped)")
    e.add_argument("--by-term", action="store_true", help="also report each priced term's share of the error")
    e.add_argument("--link-aware", nargs="+", default=[False], type=lambda v: v == "on", metavar="off|on",
                   help="rows without and/or with link-aware booking (default: off)")
    e.add_argument("--utilisation-min", type=float, default=0.6)
    e.add_argument("--utilisation-max", type=float, default=1.2)
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
    b.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    b.add_argument("--write", action="store_true")
    b.set_defaults(func=burst)
    args = p.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
