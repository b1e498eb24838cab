"""How many prefix hits a trace allows on caches of a given size, whatever routes it.

For a Mooncake trace (one id per 512-token block, ids chained: router/tools/replay/trace.py)
and a cluster's total KV capacity, at the trace's block granularity:

* ``infinite``: the leading run of blocks any earlier request carried (the replay's bound).
* ``lru``: the leading run still held by one LRU cache of the whole capacity (every request's
  blocks touched in order, the least recently used evicted): what engines that evict LRU keep
  if placement wastes nothing (no block held twice); the replay's ``lru_alone`` row.
* ``belady``: block hits (anywhere in the prompt, not only the leading run) of one cache of the
  whole capacity that evicts the block used again furthest in the future (Belady's MIN). No
  eviction policy, and no placement over caches of that total size, gets more: the headroom
  that engines' eviction, not routing, would have to take.

Also the gap between a follow-up and the turn it extends, and how long the capacity holds a
block at the trace's token rate (``--rate-scale``): a follow-up that comes later than that misses
under LRU wherever it is routed.

    python loadtests/cache_reach.py ../shared/traces/conversation_trace.jsonl --engines 8 --rate-scale 2
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.tools.emulator.build import engine_config
from router.tools.replay.bound import BlockLRU
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.trace import Trace, TraceError, TraceRequest, read_mooncake

NEVER = 1 << 62


@dataclass(frozen=True)
class Reach:
    infinite: float  # hit ratios, of prompt tokens
    lru: float
    belady: float
    capacity_tokens: int
    hold_s: float  # capacity / the trace's prompt tokens per second
    followup_gap_s: tuple[float, float, float]  # p10, p50, p90 of a follow-up's gap to the turn it extends


def _block_tokens(r: TraceRequest, k: int, size: int) -> int:
    return min(size, r.input_tokens - k * size)


def reach(trace: Trace, capacity_tokens: int) -> Reach:
    size = trace.block_tokens
    cap = max(1, capacity_tokens // size)
    total = sum(r.input_tokens for r in trace.requests)
    seen: dict[int, int] = {}  # block -> first request carrying it
    lru = BlockLRU(cap)
    inf_hit = lru_hit = 0
    gaps: list[float] = []
    for j, r in enumerate(trace.requests):
        run = 0
        while run < len(r.blocks) and r.blocks[run] in seen:
            run += 1
        inf_hit += sum(_block_tokens(r, k, size) for k in range(run))
        if run > 1:  # extends an earlier turn, not only the shared first block
            gaps.append(r.arrival_s - trace.requests[seen[r.blocks[run - 1]]].arrival_s)
        lru_hit += sum(_block_tokens(r, k, size) for k in range(lru.leading(r.blocks)))
        lru.touch(r.blocks)
        for b in r.blocks:
            seen.setdefault(b, j)
    span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s if trace.requests else 0.0
    gaps.sort()
    pick = (lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]) if gaps else (lambda q: float("nan"))
    return Reach(inf_hit / total, lru_hit / total, _belady(trace, cap) / total, cap * size,
                 cap * size / (total / span) if span > 0 else float("inf"), (pick(0.1), pick(0.5), pick(0.9)))


def _belady(trace: Trace, cap: int) -> int:
    """Tokens hit by Belady's MIN over the block sequence (a block inserted on a miss may be
    the one evicted at once: it is used again furthest away)."""
    seq = [(b, _block_tokens(r, k, trace.block_tokens)) for r in trace.requests for k, b in enumerate(r.blocks)]
    upcoming = [NEVER] * len(seq)
    last: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        upcoming[i] = last.get(seq[i][0], NEVER)
        last[seq[i][0]] = i
    held: dict[int, int] = {}  # block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped
    hit = 0
    for i, (b, tokens) in enumerate(seq):
        if b in held:
            hit += tokens
        held[b] = upcoming[i]
        heapq.heappush(heap, (-upcoming[i], b))
        while len(held) > cap:
            use, x = heapq.heappop(heap)
            if held.get(x) == -use:
                del held[x]
    return hit


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--profile", default="llama3-8b-h100")
    p.add_argument("--cache-tokens", type=int, default=None, help="per engine (default: what the profile's HBM leaves)")
    p.add_argument("--rate-scale", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.engines < 1 or args.rate_scale <= 0:
        print("error: --engines must be >= 1 and --rate-scale > 0", file=sys.stderr)
        return 2
    try:
        trace = read_mooncake(args.trace).scaled(args.rate_scale)
    except TraceError as exc:
        print(f"error: {exc} (trace files are not in the repository; see ../shared/traces/README.md)", file=sys.stderr)
        return 2
    spec = ClusterSpec(mixed=args.engines, profile=args.profile, cache_tokens=args.cache_tokens)
    config = engine_config(spec.emulator_config(), spec.perf())
    r = reach(trace, args.engines * config.num_blocks * config.block_size)
    g = r.followup_gap_s
    print(json.dumps({"trace": trace.name, "requests": len(trace.requests), "capacity_tokens": r.capacity_tokens,
                      "hit_infinite": round(r.infinite, 4), "hit_lru": round(r.lru, 4), "hit_belady": round(r.belady, 4),
                      "cache_holds_s": round(r.hold_s, 1),
                      "followup_gap_s_p10_p50_p90": [round(x, 1) for x in g]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
