"""Isolation by a TBT objective against no link-aware booking and the one-at-a-time budget,
on several burst shapes (router/scheduling/stall_budget.py; replay, virtual time).

    python loadtests/burst_objective.py [--shapes SHAPE ... | --draw N] [--seeds S ...] [--variants ...] [--write]

A shape is ``prompts x tokens, P+D, Gbit/s[, spread s[, background]]``, written
``32x32000/4+4/50`` or ``40x24000/4+4/100/2.0/320``: that many long unique prompts arriving
within the spread (0.5 s by default) one second in, over ``background`` chat requests (160)
decoding through 4 s (handoff_bench.burst_trace). Each shape is run with link-aware booking
off, on with isolation ``budget`` (one stalling prefill per decode instance at a time), and
on with isolation ``objective`` (pd.handoff.tbt_objective at its defaults: p99 under
pd.tbt_target_s over a 10 s window). Target: decode TBT p99 cut by >= 30% against off,
TTFT p90 no worse. "stalled" is the measured share of decode steps (one per running decode
per engine step) longer than the 0.1 s target: what the objective bounds at 1%. "KV bytes on
a divided link" is the share of the run's KV bytes that moved slower than their transfer
would alone (a link on its path carrying another transfer); measured on ``off``, it says
whether the burst saturates the links at all (>= 50%: burst_objective_rule.md, written
before it was measured). "Busiest NIC" is the share of the run's transfer span (first
arrival to last handoff) that the busiest NIC spent moving bytes.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.handoff_bench import burst_trace
from loadtests.report import write_section
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.record import TBT_BIN_S, Recorder
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation, VirtualClock
from router.tools.replay.summary import hist_percentile, percentile

# the shapes published before the objective existed: the default, then three held out from the budget rule
KNOWN = ("32x32000/4+4/50", "48x16000/4+4/50", "32x32000/2+6/50", "24x32000/6+2/50")
# chosen before any objective result was seen, never tuned on: shorter and longer prompts, a slower and a
# faster link, a wider arrival spread with twice the chat load
NEW = ("64x8000/4+4/50", "16x64000/3+5/25", "40x24000/4+4/100/2.0/320")
# chosen after the first evaluation on KNOWN + NEW (which showed packed short prompts stalling: the packing
# term), before any objective ran on them; the TTFT price was added after seeing them
FRESH = ("20x40000/3+3/50/1.0/200", "56x12000/5+3/100/0.5/240")
# chosen before the objective with its TTFT price ever ran on them: held out from the whole design (the last
# two chosen before an experiment that was not kept, and run once, on the committed objective)
HELD_OUT = ("36x20000/4+4/50/1.0/200", "28x28000/3+5/100/0.5/160", "44x18000/4+4/50/0.75/180",
            "24x48000/2+4/100/0.5/120")
# chosen with a rule written down before either ran on them (drop the growth term iff, on these, it meets
# both targets as often as with it and keeps TBT p99 under the target on 10 of 12 runs); then dropped
LAST = ("30x36000/3+5/50/0.5/140", "52x14000/4+3/200/1.5/260", "40x20000/2+6/50/1.0/200", "20x56000/4+4/100/0.5/160")
DRAW_SEED = 1212  # loadtests/burst_objective_rule.md item 3: held-out shapes drawn from this seed, never tuned on
VARIANTS = (("off", False, "auto"), ("budget", True, "budget"), ("objective", True, "objective"))
TARGET_S = 0.1  # pd.tbt_target_s's default, which the objective's target defaults to
SATURATED = 0.5  # burst_objective_rule.md item 1: a run is link-saturating when off moves this share of its KV shared
SECTION = "Handoff: the burst shapes' link saturation measured, isolation by a TBT objective (issue 12)"


@dataclass(frozen=True)
class Shape:
    prompts: int
    tokens: int
    prefill: int
    decode: int
    gbps: float
    spread_s: float = 0.5
    background: int = 160

    @staticmethod
    def parse(text: str) -> Shape:
        try:
            head, pd, gbps, *rest = text.split("/")
            prompts, tokens = head.split("x")
            p, d = pd.split("+")
            spread = float(rest[0]) if rest else 0.5
            background = int(rest[1]) if len(rest) > 1 else 160
            return Shape(int(prompts), int(tokens), int(p), int(d), float(gbps), spread, background)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 32x32000/4+4/50 or 40x24000/4+4/100/2.0/320)") from None

    def __str__(self) -> str:
        extra = f", {self.spread_s:g} s spread" if self.spread_s != 0.5 else ""
        extra += f", {self.background} chat" if self.background != 160 else ""
        return f"{self.prompts}x{self.tokens // 1000}K {self.prefill}P+{self.decode}D {self.gbps:g}G{extra}"


@dataclass(frozen=True)
class Result:
    tbt_p99: float
    ttft_p90: float
    ttft_p99: float
    short_p90: float
    stalled: float  # share of decode steps longer than TARGET_S
    long_local: int
    link_shared: float  # share of the KV bytes moved P -> D that moved slower than alone (a divided link)
    nic_peak: float  # the busiest NIC's share of the run's transfer span (first arrival to last handoff) moving bytes


def drawn(n: int, seed: int = DRAW_SEED) -> list[Shape]:
    """``n`` burst shapes drawn at random (burst_objective_rule.md item 3): prompts of 8K-64K tokens, 0.5-1.2M
    tokens in all (at least 8 prompts), a pool of 6-8 instances with 2-6 prefill and at least 2 decode,
    25/50/100/200 Gbit/s, 0.5-2 s spread, 120-320 chat requests."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tokens = rng.randrange(8000, 64001, 4000)
        prompts = max(8, round(rng.uniform(0.5e6, 1.2e6) / tokens))
        size = rng.randint(6, 8)
        prefill = rng.randint(2, min(6, size - 2))
        out.append(Shape(prompts, tokens, prefill, size - prefill, float(rng.choice((25, 50, 100, 200))),
                         round(rng.uniform(0.5, 2.0), 2), rng.randrange(120, 321, 20)))
    return out


def stalled_share(rec: Recorder) -> float:
    total = sum(rec.tbt_hist.values())
    late = sum(n for k, n in rec.tbt_hist.items() if k * TBT_BIN_S > TARGET_S)
    return late / total if total else math.nan


def run(shape: Shape, seed: int, aware: bool, isolation: str) -> Result:
    trace = burst_trace(shape.prompts, shape.tokens, shape.background, seed, shape.spread_s)
    spec = ClusterSpec(prefill=shape.prefill, decode=shape.decode, link_gbps=shape.gbps, link_aware=aware,
                       isolation=isolation)
    clock = VirtualClock()
    sim = Simulation(trace, spec, policy_for("ttft", spec, 0, clock), clock=clock)
    rec = sim.run()
    ttft = [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]
    short = [f - a for f, a, p in zip(rec.first_token, rec.arrival, rec.prompt) if not math.isnan(f) and p < shape.tokens]
    long_local = sum(1 for m, p in zip(rec.mode, rec.prompt) if m == "decode_only" and p >= shape.tokens)
    return Result(hist_percentile(rec.tbt_hist, 99, TBT_BIN_S), percentile(ttft, 90), percentile(ttft, 99),
                  percentile(short, 90), stalled_share(rec), long_local, *link_load(sim))


def link_load(sim: Simulation) -> tuple[float, float]:
    """The burst's load on the links (loadtests/burst_objective_rule.md, item 1): the share of the KV bytes
    moved that moved slower than alone, and the busiest NIC's share of the run's transfer span (its first
    arrival to its last handoff) spent moving bytes. (The rule's second figure, bytes / capacity over the
    burst's span, counted the chat's KV outside that span and passed 100%: replaced before any
    classification used it; it is not classified on.)"""
    fabric, rec = sim.fabric, sim.record
    ends = [m[2] for m in rec.milestones.values() if not math.isnan(m[2])]
    span = max(ends) - min(rec.arrival) if ends else 0.0
    nics = [busy for link, busy in fabric.busy_s.items() if isinstance(link, tuple) and link[0] == "nic"]
    shared = fabric.shared_bytes / fabric.moved_bytes if fabric.moved_bytes else 0.0
    return shared, (max(nics) / span if nics and span > 0 else 0.0)


def verdict(off: Result, on: Result) -> str:
    cut = 1 - on.tbt_p99 / off.tbt_p99
    tbt = "met" if cut >= 0.3 else "not met"
    ttft = "no worse" if on.ttft_p90 <= off.ttft_p90 * 1.0001 else "worse"
    return f"TBT p99 cut {cut:.0%} ({tbt}), TTFT p90 {ttft}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", type=Shape.parse, default=[Shape.parse(s) for s in KNOWN + NEW + FRESH + HELD_OUT + LAST])
    p.add_argument("--draw", type=int, default=0, metavar="N",
                   help=f"run N shapes drawn from seed {DRAW_SEED} instead of --shapes (held out: burst_objective_rule.md)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", choices=[v[0] for v in VARIANTS], default=[v[0] for v in VARIANTS],
                   help="which to run (off always runs: the others are compared with it)")
    p.add_argument("--section", default=SECTION, help="the docs/benchmarks.md section --write replaces (or appends)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    if args.draw:
        args.shapes = drawn(args.draw)
    rows = ["| shape | seed | link-aware booking | TBT p99 ms | TTFT p90 s | TTFT p99 s | short prompts' TTFT p90 s | "
            "steps > 0.1 s | long prompts on D | KV bytes on a divided link | busiest NIC | vs off |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    met = {"budget": 0, "objective": 0}
    within = {label: 0 for label, _, _ in VARIANTS if label == "off" or label in args.variants}  # TBT p99 under target
    saturating = {"runs": 0, "budget": 0, "objective": 0}  # burst_objective_rule.md item 1, measured on off
    for shape in args.shapes:
        for seed in args.seeds:
            results = {label: run(shape, seed, aware, iso) for label, aware, iso in VARIANTS
                       if label == "off" or label in args.variants}
            saturating["runs"] += results["off"].link_shared >= SATURATED
            for label, r in results.items():
                within[label] += r.tbt_p99 <= TARGET_S
                vs = "" if label == "off" else verdict(results["off"], r)
                if label != "off" and "(met)" in vs and "no worse" in vs:
                    met[label] += 1
                    saturating[label] += results["off"].link_shared >= SATURATED
                rows.append(f"| {shape} | {seed} | {label} | {r.tbt_p99 * 1000:.1f} | {r.ttft_p90:.3f} | "
                            f"{r.ttft_p99:.3f} | {r.short_p90:.3f} | {r.stalled:.2%} | {r.long_local} | {r.link_shared:.0%} | "
                            f"{r.nic_peak:.0%} | {vs} |")
                print(rows[-1], flush=True)
    runs = len(args.shapes) * len(args.seeds)
    shown = [label for label in ("budget", "objective") if label in args.variants]
    summary = (f"Both targets met (TBT p99 cut >= 30% and TTFT p90 no worse than off), of {runs} shape x seed runs: "
               + ", ".join(f"{label} {met[label]}" for label in shown) + f"; of the {saturating['runs']} link-saturating "
               f"runs (>= {SATURATED:.0%} of the KV bytes on a divided link without link-aware booking): "
               + ", ".join(f"{label} {saturating[label]}" for label in shown) + f". TBT p99 within the objective's "
               f"{TARGET_S:g} s: " + ", ".join(f"{label} {n}" for label, n in within.items()) + ".")
    body = (__doc__.split("\n\n", 2)[2].strip() + "\n\nllama3-8b-h100 engines (replay), policy `ttft`, transfer "
            "interference 0.1.\n\n" + "\n".join(rows) + "\n\n" + summary)
    print(summary)
    if args.write:
        cmd = ("python loadtests/burst_objective.py --shapes " + " ".join(f"{s.prompts}x{s.tokens}/{s.prefill}+{s.decode}/"
               f"{s.gbps:g}" + (f"/{s.spread_s:g}/{s.background}" if (s.spread_s, s.background) != (0.5, 160) else "")
               for s in args.shapes) + f" --seeds {' '.join(map(str, args.seeds))}"
               + (f" --variants {' '.join(args.variants)}" if len(args.variants) < len(VARIANTS) else "")
               + (f" --section '{args.section}'" if args.section != SECTION else "") + " --write")
        write_section(args.section, cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
