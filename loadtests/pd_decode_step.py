"""PD decode steps believed against the engines' own, on engines drawn at random (replay, virtual time).

    python loadtests/pd_decode_step.py [--cells N] [--seed S] [--hetero N] [--write]

Each cell draws an engine profile (llama3-8b-h100 or llama3-70b-h100x4), a slowdown (0.5-2.0),
a pool of 2-4 prefill and 2-4 decode instances and a workload (multi-turn chat with 2K-token
system prompts, or long-context chat: 8K system prompts, 1K-token turns, 512-token answers),
from ``--seed``. Four routers on the same engines: told the engines' decode step model (``pd.decode_step_*`` fitted to the profile) or
left on the config's defaults, each with and without the step measured from the engines'
inter-token latency (``engines.decode_step``; pd_cost.decode_step_seconds scales the model by
measured / model-at-the-measured-batch).

"step error" is predictive: every second of virtual time, each decode instance's believed step
at its engine's current batch (running requests, KV in use) is set against the mean
inter-token latency its engine's tokens saw over the next second; the figure is
|believed / seen - 1| at p50 and p90 over those pairs, and at p90 over the pairs after the
first 10 s (a measured belief needs a window of ``min_window_s`` and ``min_tokens`` first).
TTFT p90 and decode TBT p99 show whether the belief moves the routes.

``--hetero N`` adds N cells whose decode pool is not uniform: one or two decode instances step
1.5-3x slower again (older GPUs, a degraded instance), which no config states, and the TBT
target (``pd.tbt_target_s``, the operator's SLO) is drawn in 0.05-0.2 s. There the TBT filter
decides: "steps over target" is the share of decode steps (one per running decode per engine
step) longer than the cell's target, "on slow D" the share of decoded requests the slow
instances took.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import table, write_section
from router.config.model import PolicyConfig
from router.scheduling import build_policy
from router.scheduling.framework import Policy, View
from router.scheduling.pd_cost import decode_step_seconds
from router.state.base import Load
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.record import TBT_BIN_S
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.summary import hist_percentile, percentile
from router.tools.replay.synthetic import generate
from router.tools.replay.trace import Trace

SECTION = "PD decode steps: the believed step against the engines' own, engines drawn at random (issue 9 item 3 / issue 12)"
# (label, router told the decode step model, step measured from the engines' inter-token latency)
VARIANTS = (("told", True, False), ("told + measured", True, True),
            ("defaults", False, False), ("defaults + measured", False, True))
# the heterogeneous cells add the pd_tbt scorer, weighed in beside pd_ttft (router/scheduling/pd.py)
HETERO_VARIANTS = tuple((label, told, measured, 0.0) for label, told, measured in VARIANTS) + (
    ("defaults + measured + pd_tbt 0.5", False, True, 0.5),)
MIN_TOKENS = 32  # a second whose tokens are fewer than this says too little about the step
WARM_S = 10.0


@dataclass(frozen=True)
class Cell:
    profile: str
    slowdown: float
    prefill: int
    decode: int
    workload: str  # "chat" or "long"
    slow_decodes: tuple[float, ...] = ()  # d0, d1, ... this much slower again
    tbt_target_s: float | None = None

    def __str__(self) -> str:
        short = "8b" if "8b" in self.profile else "70b x4"
        extra = ""
        if self.slow_decodes:
            extra = f", {'/'.join(f'{s:.1f}' for s in self.slow_decodes)}x slower D, TBT target {self.tbt_target_s:.2f} s"
        return f"{short} x{self.slowdown:.2f} {self.prefill}P+{self.decode}D {self.workload}{extra}"


def draw(n: int, seed: int) -> list[Cell]:
    rng = random.Random(seed)
    return [Cell(rng.choice(("llama3-8b-h100", "llama3-70b-h100x4")), round(rng.uniform(0.5, 2.0), 2),
                 rng.randint(2, 4), rng.randint(2, 4), rng.choice(("chat", "long"))) for _ in range(n)]


def draw_hetero(n: int, seed: int) -> list[Cell]:
    rng = random.Random(seed * 1000 + 1)
    cells = []
    for _ in range(n):
        slow = tuple(round(rng.uniform(1.5, 3.0), 1) for _ in range(rng.randint(1, 2)))
        cells.append(Cell(rng.choice(("llama3-8b-h100", "llama3-70b-h100x4")), round(rng.uniform(0.5, 2.0), 2),
                          rng.randint(2, 4), rng.randint(3, 4), "chat", slow, round(rng.uniform(0.05, 0.2), 3)))
    return cells


def trace_for(cell: Cell, seed: int) -> Trace:
    # the arrival rate follows the engines' speed, so every cell is busy but not drowned
    speed = (1.0 if "8b" in cell.profile else 0.4) / cell.slowdown * (cell.prefill + cell.decode) / 6
    if cell.workload == "chat":
        rate = max(1.0, round(6.0 * speed, 2))
        return generate(f"multi_turn:sessions=96,turns=4,rate={rate},think=2,system=2048,user=400,output=256", seed)
    rate = max(0.5, round(2.0 * speed, 2))
    return generate(f"multi_turn:sessions=48,turns=3,rate={rate},think=3,system=8192,user=1000,output=512", seed)


class StepSampler:
    """Every second of virtual time: each decode instance's believed step at its engine's batch,
    and the engines' inter-token latency counters, to pair with the next second's mean step."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self._next = 0.0
        self._last: dict[str, tuple[float, float, float]] = {}  # id -> (itl s, itl tokens, believed)
        self.ratios: list[float] = []
        self.late: list[float] = []  # ... of the pairs believed after the first WARM_S

    def sample(self) -> None:
        sim = self._sim
        if sim.now < self._next:
            return
        self._next = sim.now + 1.0
        pd = sim.spec.pd_config()
        for node, cand in zip(sim.nodes, sim._candidates):
            if cand.role != "decode":
                continue
            engine, c = node.engine, node.engine.counters
            last = self._last.get(cand.id)
            if last is not None and c.itl_tokens - last[1] >= MIN_TOKENS and not math.isnan(last[2]):
                seen = (c.itl_seconds - last[0]) / (c.itl_tokens - last[1])
                self.ratios.append(last[2] / seen)
                if sim.now - 1.0 >= WARM_S:
                    self.late.append(last[2] / seen)
            believed = math.nan
            if engine.num_running:
                load = Load(engine.num_running, 0, int(engine.kv.usage * cand.cache_tokens), 0)
                believed = decode_step_seconds(View(cand, 0, load, None, None, 1.0), pd)
            self._last[cand.id] = (c.itl_seconds, c.itl_tokens, believed)


@dataclass(frozen=True)
class Result:
    err_p50: float
    err_p90: float
    late_p90: float
    ratio_p50: float
    ttft_p90: float
    tbt_p99: float
    pairs: int
    over_target: float = math.nan  # share of decode steps longer than the cell's TBT target
    on_slow: float = math.nan  # share of decoded requests on the slowed decode instances


def policy(spec: ClusterSpec, tbt_weight: float) -> Policy:
    """The ``ttft`` preset's PD pipeline, with the pd_tbt scorer weighed in when ``tbt_weight``."""
    if not tbt_weight:
        return policy_for("ttft", spec, 0)
    config = PolicyConfig.model_validate({"seed": 0, "ttft": spec.ttft_weights()})
    tol = config.ttft.tie_tolerance / (1 + config.ttft.tie_tolerance)  # as the preset's picker
    config = PolicyConfig.model_validate({"seed": 0, "ttft": spec.ttft_weights(), "pipeline": {
        "routes": "pd_pairs", "scorers": ["pd_ttft", {"name": "pd_tbt", "weight": tbt_weight}],
        "picker": {"name": "max_score", "params": {"tolerance": tol}}}})
    return build_policy(config, pd=spec.pd_config())


def run(cell: Cell, seed: int, told: bool, measured: bool, tbt_weight: float = 0.0) -> Result:
    spec = ClusterSpec(prefill=cell.prefill, decode=cell.decode, profile=cell.profile, slowdown=cell.slowdown,
                       decode_steps_told=told, decode_step_measured=measured, decode_slowdowns=cell.slow_decodes,
                       tbt_target_s=cell.tbt_target_s)
    sim = Simulation(trace_for(cell, seed), spec, policy(spec, tbt_weight))
    sampler = StepSampler(sim)
    arrive = sim._arrive

    def sampled(i: int) -> None:
        sampler.sample()
        arrive(i)

    sim._arrive = sampled  # type: ignore[method-assign]
    rec = sim.run()
    ttft = [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]
    errors = [abs(r - 1) for r in sampler.ratios]
    late = [abs(r - 1) for r in sampler.late]
    target = spec.pd_config().tbt_target_s
    steps = sum(rec.tbt_hist.values())
    over = sum(n for k, n in rec.tbt_hist.items() if k * TBT_BIN_S > target) / steps if steps else math.nan
    slow = {f"d{i}" for i in range(len(cell.slow_decodes))}
    decoded = [d for d in rec.instance if d]
    on_slow = sum(1 for d in decoded if d in slow) / len(decoded) if decoded else math.nan
    return Result(percentile(errors, 50) if errors else math.nan, percentile(errors, 90) if errors else math.nan,
                  percentile(late, 90) if late else math.nan,
                  statistics.median(sampler.ratios) if sampler.ratios else math.nan,
                  percentile(ttft, 90), hist_percentile(rec.tbt_hist, 99, TBT_BIN_S), len(errors), over, on_slow)


def geomean(a: list[float], b: list[float]) -> float:
    return math.exp(statistics.mean(math.log(x / y) for x, y in zip(a, b)))


def hetero_table(cells: list[Cell], seed: int) -> str:
    """The heterogeneous cells: does the belief move the routes where the TBT filter decides?"""
    rows: list[list[object]] = []
    over: dict[str, list[float]] = {label: [] for label, *_ in HETERO_VARIANTS}
    slow: dict[str, list[float]] = {label: [] for label, *_ in HETERO_VARIANTS}
    tbt: dict[str, list[float]] = {label: [] for label, *_ in HETERO_VARIANTS}
    ttft: dict[str, list[float]] = {label: [] for label, *_ in HETERO_VARIANTS}
    for i, cell in enumerate(cells):
        for label, told, measured, weight in HETERO_VARIANTS:
            r = run(cell, seed + 100 + i, told, measured, weight)
            slow[label].append(r.on_slow)
            tbt[label].append(r.tbt_p99)
            ttft[label].append(r.ttft_p90)
            over[label].append(r.over_target)
            rows.append([str(cell), label, f"{r.err_p90:.2f}", f"{r.over_target:.2%}", f"{r.on_slow:.0%}",
                         f"{r.tbt_p99 * 1000:.1f}", f"{r.ttft_p90:.3f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
    base = "defaults + measured"
    summary = ("Median over the cells of the share of decode steps over the TBT target: " + ", ".join(
        f"{label} {statistics.median(v):.2%}" for label, v in over.items() if v) + ". Median share of requests on the "
        "slow instances: " + ", ".join(f"{label} {statistics.median(v):.0%}" for label, v in slow.items() if v)
        + ". With pd_tbt against without (defaults + measured), geometric mean over the cells: TBT p99 "
        f"x{geomean(tbt['defaults + measured + pd_tbt 0.5'], tbt[base]):.2f}, TTFT p90 "
        f"x{geomean(ttft['defaults + measured + pd_tbt 0.5'], ttft[base]):.2f}.")
    print(summary)
    return table(["cell", "router", "step error p90", "steps over target", "on slow D", "TBT p99 ms", "TTFT p90 s"],
                 rows) + "\n\n" + summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--hetero", type=int, default=0, metavar="N", help="also N cells with slower decode instances")
    p.add_argument("--section", default=SECTION)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    rows: list[list[object]] = []
    errors: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    late: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    base: list[Result] = []  # defaults + measured, per cell: what pd_tbt is set against
    for i, cell in enumerate(draw(args.cells, args.seed)):
        for label, told, measured in VARIANTS:
            r = run(cell, args.seed + i, told, measured)
            if (told, measured) == (False, True):
                base.append(r)
            errors[label].append(r.err_p90)
            late[label].append(r.late_p90)
            rows.append([str(cell), label, f"{r.err_p50:.2f}", f"{r.err_p90:.2f}", f"{r.late_p90:.2f}", f"{r.ratio_p50:.2f}",
                         f"{r.ttft_p90:.3f}", f"{r.tbt_p99 * 1000:.1f}", r.pairs])
            print(" | ".join(map(str, rows[-1])), flush=True)
    summary = "Median over the cells of each router's p90 step error: " + ", ".join(
        f"{label} {statistics.median(v):.2f}" for label, v in errors.items() if v) + "; after the first 10 s: " + ", ".join(
        f"{label} {statistics.median(v):.2f}" for label, v in late.items() if v) + "."
    print(summary)
    body = (__doc__.split("\n\n", 2)[2].strip() + "\n\n"
            + table(["cell", "router", "step error p50", "step error p90", "p90 after 10 s", "believed / seen, median", "TTFT p90 s",
                     "TBT p99 ms", "pairs"], rows) + "\n\n" + summary)
    if args.hetero and base:  # the same uniform cells with pd_tbt weighed in: what it costs where pools are alike
        weighed = [run(cell, args.seed + i, False, True, 0.5) for i, cell in enumerate(draw(args.cells, args.seed))]
        line = ("On these uniform pools, defaults + measured with pd_tbt 0.5 against without, geometric mean over the "
                f"cells: TTFT p90 x{geomean([r.ttft_p90 for r in weighed], [r.ttft_p90 for r in base]):.2f}, TBT p99 "
                f"x{geomean([r.tbt_p99 for r in weighed], [r.tbt_p99 for r in base]):.2f}.")
        print(line)
        body += "\n\n" + line
    if args.hetero:
        body += "\n\nDecode pools with slower instances:\n\n" + hetero_table(draw_hetero(args.hetero, args.seed), args.seed)
    if args.write:
        write_section(args.section, f"python loadtests/pd_decode_step.py --cells {args.cells} --seed {args.seed}"
                      + (f" --hetero {args.hetero}" if args.hetero else "") + " --write", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
