"""The routing-quality matrix: one command, every cell in replay and (a subset) live.

Cells are workload x cache pressure x router knowledge (loadtests/matrix_cells.py); each
cell draws its engines (profile, step-time slowdown, cache size) and its arrival rate at
random from the seed, so no single profile can be fitted. Replay: pd-router's ``ttft``
against the baselines that stand in for the peers (``sglang_cache_aware`` is the
cache_aware rule both sglang-router and vllm-router implement), the ``bound`` and
``lru_alone`` (no queue, the hits of one LRU as large as the cluster's caches). Live:
pd-router, sglang-router and vllm-router in front of the same emulated engines, the same
trace sent open loop (loadtests/matrix_live.py).

A cell passes when ``ttft``'s p90 TTFT is <= 0.8x the best peer's and its engine hit ratio
is >= the best peer's - 2 points (the issue's targets); every cell's figures are printed
and written, including those that lose.

    python loadtests/quality_matrix.py                     # replay every cell, live the default subset
    python loadtests/quality_matrix.py --quick --write     # fewer requests, shorter live runs
    python loadtests/quality_matrix.py --cells chat b2b_zipf/2x --no-live
    python loadtests/quality_matrix.py --no-live --seed 2 --write --section 'Routing quality matrix, replay: seed 2'

Several seeds, two cells at a time, with the bound's reach per cell: loadtests/quality_seeds.py.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.machine import busy_processes, contention_note
from loadtests.matrix_cells import Cell, Drawn, draw, select
from loadtests.report import table, write_section
from router.tools.replay.bound import LRU_ALONE, gap_closed, reference_summaries
from router.tools.replay.run import replay

SECTION = "Routing quality matrix"
REPLAY_POLICIES = ("least_loaded", "sglang_cache_aware", "llmd_weighted", "ttft_spread", "ttft")
LIVE_DEFAULT = ("b2b_uniform/2x/defaults", "b2b_zipf/2x/defaults", "chat/2x/defaults", "longdoc/8x/facts",
                "bursty/0.5x/defaults", "dispersed/2x/facts")
P90_TARGET, HIT_MARGIN = 0.8, 0.02


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", nargs="+", default=None, metavar="PATTERN",
                   help="only cells matching a pattern of '/'-separated parts, e.g. chat, 2x, b2b_zipf/8x/facts")
    p.add_argument("--live-cells", nargs="+", default=None, metavar="PATTERN",
                   help=f"cells also run live (default: {' '.join(LIVE_DEFAULT)}); 'all' for every selected cell")
    p.add_argument("--no-live", action="store_true", help="replay only")
    p.add_argument("--quick", action="store_true", help="200 requests per replay cell, 20 s live runs")
    p.add_argument("--requests", type=int, default=None, help="requests per replay cell (default 600, --quick 200)")
    p.add_argument("--live-seconds", type=float, default=None, help="live run length per router (default 40, --quick 20)")
    p.add_argument("--live-rate", type=float, default=8.0, help="wall-clock arrivals/s live; emulator time is slowed to fit")
    p.add_argument("--routers", nargs="+", default=["pd-router", "sglang-router", "vllm-router"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write", action="store_true", help="write the results into docs/benchmarks.md")
    p.add_argument("--section", default=SECTION, help=f"the docs/benchmarks.md section --write replaces or appends (default {SECTION!r})")
    return p.parse_args(argv)


def _f(x: object, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def verdict(ours_p90: float | None, ours_hit: float | None, peers: dict[str, tuple[float | None, float | None]]) -> str:
    """'win' / 'loses: ...' against the best peer (lowest p90; highest hit)."""
    p90s = [p for p, _ in peers.values() if p is not None]
    hits = [h for _, h in peers.values() if h is not None]
    if ours_p90 is None or not p90s:
        return "no result"
    best_p90, best_hit = min(p90s), max(hits, default=0.0)
    why = []
    if ours_p90 > P90_TARGET * best_p90:
        why.append(f"p90 {ours_p90 / best_p90:.2f}x best peer")
    if ours_hit is not None and ours_hit < best_hit - HIT_MARGIN:
        why.append(f"hit {100 * (ours_hit - best_hit):+.0f} pts")
    return "meets target" if not why else "misses: " + ", ".join(why)


def replay_cell(d: Drawn) -> tuple[list[list[object]], str]:
    summaries = {name: replay(d.trace, d.spec, name, seed=1, ttft_slo_s=1e9).summary for name in REPLAY_POLICIES}
    bound, lru = reference_summaries(d.trace, d.spec, 1e9)
    baselines = {n: s for n, s in summaries.items() if n not in ("ttft", "ttft_spread")}
    best = min(baselines, key=lambda n: float(baselines[n]["ttft_p90"]))  # type: ignore[arg-type]
    rows: list[list[object]] = []
    for name, s in [*summaries.items(), ("bound", bound), (LRU_ALONE, lru)]:
        gap = gap_closed(float(s["ttft_p90"]), float(baselines[best]["ttft_p90"]), float(bound["ttft_p90"]))  # type: ignore[arg-type]
        rows.append([d.cell.name, name, _f(s.get("ttft_p50"), ".3f"), _f(s.get("ttft_p90"), ".3f"),
                     _f(s.get("hit_ratio"), ".3f"), _f(s.get("predicted_hit_ratio"), ".3f"),
                     _f(gap, ".2f") if name != "bound" else ""])
    ours = summaries["ttft"]
    peer = summaries["sglang_cache_aware"]
    v = verdict(ours["ttft_p90"], ours["hit_ratio"], {"cache_aware": (peer["ttft_p90"], peer["hit_ratio"])})  # type: ignore[arg-type, dict-item]
    return rows, v


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    requests = args.requests or (200 if args.quick else 600)
    live_seconds = args.live_seconds or (20.0 if args.quick else 40.0)
    cells = select(args.cells)
    if not cells:
        print("error: no cell matches --cells", file=sys.stderr)
        return 2
    live: list[Cell] = []
    if not args.no_live:
        live_patterns = None if args.live_cells == ["all"] else (args.live_cells or list(LIVE_DEFAULT))
        chosen = set(select(live_patterns))
        live = [c for c in cells if c in chosen]
    busy = busy_processes()
    started = time.perf_counter()
    replay_rows: list[list[object]] = []
    verdicts: list[list[object]] = []
    draws: dict[Cell, Drawn] = {}
    for cell in cells:
        d = draws[cell] = draw(cell, args.seed, requests)
        print(f"replay {cell.name}: {d.describe()}", file=sys.stderr)
        rows, v = replay_cell(d)
        replay_rows += rows
        verdicts.append([cell.name, "replay", v, d.describe()])
    live_rows: list[list[object]] = []
    if live:
        from loadtests.matrix_live import live_cell  # starts processes: only when asked

        for cell in live:
            d = draw(cell, args.seed, requests)
            print(f"live {cell.name}: {d.describe()}", file=sys.stderr)
            rows, v, note = live_cell(d, args.routers, live_seconds, args.live_rate, args.seed)
            live_rows += rows
            verdicts.append([cell.name, "live", v, note])
    replay_table = table(["cell", "policy", "TTFT p50 s", "TTFT p90 s", "engine hit", "router-believed hit", "gap closed"],
                         replay_rows)
    live_table = table(["cell", "router", "requests", "errors", "TTFT p50 s", "TTFT p90 s", "engine hit"], live_rows) \
        if live_rows else "(no live cells run)"
    verdict_table = table(["cell", "where", "verdict", "engines and traffic"], verdicts)
    elapsed = time.perf_counter() - started
    print(verdict_table + "\n\n" + replay_table + "\n\n" + live_table)
    print(f"\ndone in {elapsed:.0f} s", file=sys.stderr)
    if args.write:
        note = (f"{len(cells)} cells replayed ({requests} requests each, {ENGINES_NOTE}); {len(live)} live "
                f"({live_seconds:g} s of arrivals per router at ~{args.live_rate:g} req/s wall, emulator time slowed to fit; "
                f"TTFT in emulated seconds). Seed {args.seed}: engine profile, step-time slowdown (0.5-2x), cache size "
                "(from the measured hot set and the pressure) and arrival rate (40-80% of the cluster's prefill capacity "
                "for a perfect router) are drawn per cell. Replay peers: `sglang_cache_aware` is the cache_aware rule of "
                "sglang-router and vllm-router; `gap closed` is (best baseline - policy) / (best baseline - bound) on p90; "
                "`lru_alone` is each request alone with the hits one LRU as large as the cluster's caches keeps. "
                f"Target per cell: ttft p90 <= {P90_TARGET}x best peer and engine hit >= best peer - 2 points. "
                f"Whole run {elapsed / 60:.0f} min.\n\n" + contention_note(busy))
        write_section(args.section, "python loadtests/quality_matrix.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      note + "\n\n### Verdicts\n\n" + verdict_table + "\n\n### Replay\n\n" + replay_table
                      + "\n\n### Live\n\n" + live_table)
    return 0


ENGINES_NOTE = "4 emulated mixed engines"

if __name__ == "__main__":
    sys.exit(main())
