"""Isolation by a TBT objective against no link-aware booking and the one-at-a-time budget,
on several burst shapes (router/scheduling/stall_budget.py; replay, virtual time).

    python loadtests/burst_objective.py [--shapes SHAPE ...] [--seeds S ...] [--write]

A shape is ``prompts x tokens, P+D, Gbit/s[, spread s[, background]]``, written
``32x32000/4+4/50`` or ``40x24000/4+4/100/2.0/320``: that many long unique prompts arriving
within the spread (0.5 s by default) one second in, over ``background`` chat requests (160)
decoding through 4 s (handoff_bench.burst_trace). Each shape is run with link-aware booking
off, on with isolation ``budget`` (one stalling prefill per decode instance at a time), and
on with isolation ``objective`` (pd.handoff.tbt_objective at its defaults: p99 under
pd.tbt_target_s over a 10 s window). Target: decode TBT p99 cut by >= 30% against off,
TTFT p90 no worse. "stalled" is the measured share of decode steps (one per running decode
per engine step) longer than the 0.1 s target: what the objective bounds at 1%.
"""

from __future__ import annotations

import argparse
import math
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
VARIANTS = (("off", False, "auto"), ("budget", True, "budget"), ("objective", True, "objective"))
TARGET_S = 0.1  # pd.tbt_target_s's default, which the objective's target defaults to


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


def stalled_share(rec: Recorder) -> float:
    total = sum(rec.tbt_hist.values())
    late = sum(n for k, n in rec.tbt_hist.items() if k * TBT_BIN_S > TARGET_S)
    return late / total if total else math.nan


def run(shape: Shape, seed: int, aware: bool, isolation: str) -> Result:
    trace = burst_trace(shape.prompts, shape.tokens, shape.background, seed, shape.spread_s)
    spec = ClusterSpec(prefill=shape.prefill, decode=shape.decode, link_gbps=shape.gbps, link_aware=aware,
                       isolation=isolation)
    clock = VirtualClock()
    rec = Simulation(trace, spec, policy_for("ttft", spec, 0, clock), clock=clock).run()
    ttft = [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]
    short = [f - a for f, a, p in zip(rec.first_token, rec.arrival, rec.prompt) if not math.isnan(f) and p < shape.tokens]
    long_local = sum(1 for m, p in zip(rec.mode, rec.prompt) if m == "decode_only" and p >= shape.tokens)
    return Result(hist_percentile(rec.tbt_hist, 99, TBT_BIN_S), percentile(ttft, 90), percentile(ttft, 99),
                  percentile(short, 90), stalled_share(rec), long_local)


def verdict(off: Result, on: Result) -> str:
    cut = 1 - on.tbt_p99 / off.tbt_p99
    tbt = "met" if cut >= 0.3 else "not met"
    ttft = "no worse" if on.ttft_p90 <= off.ttft_p90 * 1.0001 else "worse"
    return f"TBT p99 cut {cut:.0%} ({tbt}), TTFT p90 {ttft}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", type=Shape.parse, default=[Shape.parse(s) for s in KNOWN + NEW + FRESH + HELD_OUT + LAST])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    rows = ["| shape | seed | link-aware booking | TBT p99 ms | TTFT p90 s | TTFT p99 s | short prompts' TTFT p90 s | "
            "steps > 0.1 s | long prompts on D | vs off |", "|---|---|---|---|---|---|---|---|---|---|"]
    met = {"budget": 0, "objective": 0}
    within = {label: 0 for label, _, _ in VARIANTS}  # TBT p99 within the objective's own target
    for shape in args.shapes:
        for seed in args.seeds:
            results = {label: run(shape, seed, aware, iso) for label, aware, iso in VARIANTS}
            for label, r in results.items():
                within[label] += r.tbt_p99 <= TARGET_S
                vs = "" if label == "off" else verdict(results["off"], r)
                if label != "off" and "(met)" in vs and "no worse" in vs:
                    met[label] += 1
                rows.append(f"| {shape} | {seed} | {label} | {r.tbt_p99 * 1000:.1f} | {r.ttft_p90:.3f} | "
                            f"{r.ttft_p99:.3f} | {r.short_p90:.3f} | {r.stalled:.2%} | {r.long_local} | {vs} |")
                print(rows[-1], flush=True)
    runs = len(args.shapes) * len(args.seeds)
    summary = (f"Both targets met (TBT p99 cut >= 30% and TTFT p90 no worse than off), of {runs} shape x seed runs: "
               f"budget {met['budget']}, objective {met['objective']}. TBT p99 within the objective's "
               f"{TARGET_S:g} s: " + ", ".join(f"{label} {n}" for label, n in within.items()) + ".")
    body = (__doc__.split("\n\n", 2)[2].strip() + "\n\nllama3-8b-h100 engines (replay), policy `ttft`, transfer "
            "interference 0.1.\n\n" + "\n".join(rows) + "\n\n" + summary)
    print(summary)
    if args.write:
        cmd = ("python loadtests/burst_objective.py --shapes " + " ".join(f"{s.prompts}x{s.tokens}/{s.prefill}+{s.decode}/"
               f"{s.gbps:g}" + (f"/{s.spread_s:g}/{s.background}" if (s.spread_s, s.background) != (0.5, 160) else "")
               for s in args.shapes) + f" --seeds {' '.join(map(str, args.seeds))} --write")
        write_section("Handoff: isolation by a TBT objective, burst shapes held out and new", cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
