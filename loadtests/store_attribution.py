"""Where the store-aware router's TTFT estimate goes wrong, request by request.

    python loadtests/store_attribution.py [--trace PATH] [--limit N] [--rate-scale X] [--prefill-chunk-tokens N] [--told-only | --not-told-only]

The store replay of store_bench.py (8 mixed engines, a shared store), with the router told
of the store and not told, each request's estimate and measured TTFT kept, and for every
load from the store: what the router priced it at (store_cost.load_seconds from the tier's
state at the decision), how long it took, and how long the request still waited for its
first token after the last byte arrived. Printed per cluster:

* TTFT p88/p90/p92 and the requests above the told router's p90 by prompt size (is a p90
  difference a shift of the whole tail or one point of a steep curve?);
* measured - estimated TTFT, for requests that loaded and for those that did not;
* loads: measured / priced, p50 and p90;
* load-bound requests (the rest of the prompt computed before the load ended): the wait
  from the load's end to the first token, with and without another prefill running on
  the engine then (its last token needs a step, which that prefill's chunk shares).

Virtual time: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.core.instances import Candidate
from router.scheduling.framework import RouteRequest, View
from router.scheduling.store_cost import load_seconds
from router.state.base import Load
from router.state.store_tier import StoreHit
from router.tools.emulator.request import EngineRequest
from loadtests.store_bench import cluster
from router.tools.replay.cluster import Node
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.source import load_trace
from router.tools.replay.summary import percentile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
BUCKETS = ((0, 16_000), (16_000, 24_000), (24_000, 32_000), (32_000, 10**9))


@dataclass
class Observed:
    hits: dict[int, StoreHit] = field(default_factory=dict)  # what the tier said at the decision
    load_start: dict[int, float] = field(default_factory=dict)
    load_end: dict[int, float] = field(default_factory=dict)
    load_bound: dict[int, bool] = field(default_factory=dict)  # the rest was computed when the load ended
    others_prefilling: dict[int, bool] = field(default_factory=dict)  # another prefill ran on the engine then


class AttributedSimulation(Simulation):
    """The replay, keeping what the router's store tier said and what each load did."""

    obs: Observed

    def _arrive(self, i: int) -> None:
        if self.tier is not None:
            tr = self.trace.requests[i]
            hit = self.tier.hit(self._prompts.keys(tr, self._prompts.tokens(tr)))
            if hit is not None:
                self.obs.hits[i] = hit
        super()._arrive(i)

    def _start_load(self, node: Node, request: EngineRequest) -> None:
        self.obs.load_start[int(request.request_id[1:])] = self.now
        super()._start_load(node, request)

    def _load_end(self, rid: str) -> None:
        node, request = self._loading[rid]
        i = int(rid[1:])
        self.obs.load_end[i] = self.now
        self.obs.load_bound[i] = request.num_computed >= request.prompt_len - 1
        self.obs.others_prefilling[i] = any(r.num_computed < r.prompt_len and r.request_id != rid
                                            for r in node.engine.running)
        super()._load_end(rid)


def run(trace_path: str, limit: int | None, rate_scale: float, aware: bool, chunk: int | None = None) -> AttributedSimulation:
    trace = load_trace(trace_path, 0).limited(limit).scaled(rate_scale)
    spec = cluster(chunk, store_tokens=20_000_000, store_aware=aware)
    sim = AttributedSimulation(trace, spec, policy_for("ttft", spec, 0))
    sim.obs = Observed()
    sim.run()
    return sim


def _q(values: list[float], qs: tuple[int, ...] = (50, 90)) -> str:
    return " / ".join(f"{percentile(values, q):.3f}" for q in qs) if values else "-"


def report(name: str, sim: AttributedSimulation, threshold: float) -> float:
    rec, obs = sim.record, sim.obs
    n = rec.n
    ttft = [rec.first_token[i] - rec.arrival[i] for i in range(n)]
    done = [i for i in range(n) if not math.isnan(ttft[i])]
    p90 = percentile([ttft[i] for i in done], 90)
    threshold = threshold or p90
    print(f"\n{name}: TTFT p88 / p90 / p92 {_q([ttft[i] for i in done], (88, 90, 92))} s")
    above = [sum(1 for i in done if lo <= rec.prompt[i] < hi and ttft[i] > threshold) for lo, hi in BUCKETS]
    print(f"  requests above {threshold:.3f} s by prompt tokens <16K / 16-24K / 24-32K / >=32K: "
          + " / ".join(map(str, above)))
    loaded = [i for i in done if i in obs.load_start]
    plain = [i for i in done if i not in obs.load_start and not math.isnan(rec.estimate[i])]
    for label, group in (("with a load", loaded), ("without", plain)):
        err = [ttft[i] - rec.estimate[i] for i in group if not math.isnan(rec.estimate[i])]
        print(f"  measured - estimated TTFT, {label} ({len(err)}): p10 / p50 / p90 {_q(err, (10, 50, 90))} s")
    ratios = []
    bpt = sim.spec.kv_bytes_per_token()
    cand = Candidate("engine", kv_bytes_per_token=bpt)
    for i in loaded:
        hit = obs.hits.get(i)
        if hit is None:
            continue
        req = RouteRequest(f"r{i}", (), rec.prompt[i], rec.output[i], 1, store=hit)
        priced = load_seconds(req, View(cand, 0, Load()), rec.loaded[i])
        ratios.append((obs.load_end[i] - obs.load_start[i]) / priced)
    if ratios:
        print(f"  loads ({len(ratios)} priced): measured / priced p50 / p90 {_q(ratios)}")
    for busy in (False, True):
        waits = [rec.first_token[i] - obs.load_end[i] for i in loaded
                 if obs.load_bound.get(i) and obs.others_prefilling.get(i) is busy]
        print(f"  load-bound, {'another prefill running' if busy else 'no other prefill'} at the load's end "
              f"({len(waits)}): first token - load end p50 / p90 {_q(waits)} s")
    return p90


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(DEFAULT_TRACE))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--rate-scale", type=float, default=2.0)
    p.add_argument("--prefill-chunk-tokens", type=int, default=None,
                   help="the step budget the router is told (default: the engines' own; 0 = not told)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--told-only", action="store_true", help="only the router told of the store")
    only.add_argument("--not-told-only", action="store_true", help="only the router not told of the store")
    args = p.parse_args()
    threshold = 0.0
    if not args.not_told_only:
        told = run(args.trace, args.limit, args.rate_scale, True, args.prefill_chunk_tokens)
        threshold = report("store, router told", told, 0.0)
    if not args.told_only:
        report("store, router not told", run(args.trace, args.limit, args.rate_scale, False, args.prefill_chunk_tokens),
               threshold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
