"""The replay matrix over several seeds, a few cells at a time: how many cells meet the
target per seed, and which cannot meet it whatever the router does.

Each cell is drawn and replayed exactly as loadtests/quality_matrix.py does (``draw``, then
``replay(..., seed=1, ttft_slo_s=1e9)``, judged by its ``verdict``), but only for the two
policies the verdict reads (``sglang_cache_aware``, the peers' cache_aware rule, and
``ttft``) plus the ``bound``. Per seed it prints the cells meeting the target, those
missing the hit target, the geometric mean of ttft's p90 over cache_aware's, and the copy
decisions (cache_room's ``replicate``) over all cells; per cell the figures, the verdict,
and the bound's p90 over cache_aware's: where that is above the 0.8x target even the bound
(every earlier block cached, no queue) could not meet it, and the cell is marked
``out of reach``. Beside it, ``lru_alone``'s (no queue either, but only the hits one LRU
cache as large as the cluster's would keep: router.tools.replay.bound): above 0.8x, the
cell is ``beyond the caches``, its target out of what placement alone could reach at this
cache size, though not a bound.

``--json FILE`` keeps every cell's figures; ``--against FILE`` (a run of other code, e.g.
main, with the same seeds and cells) prints and writes both side by side; ``--results FILE``
reports a ``--json`` run without replaying it again.

    python loadtests/quality_seeds.py --seeds 1 2 3 4 5 --jobs 2 --json out/branch.json
    python loadtests/quality_seeds.py --seeds 1 --cells chat --requests 200
    python loadtests/quality_seeds.py --seeds 1 2 3 4 5 --jobs 2 --against out/main.json \\
        --write --section 'Routing quality matrix, replay: ...'
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.machine import busy_processes, contention_note
from loadtests.matrix_cells import draw, select
from loadtests.quality_matrix import HIT_MARGIN, P90_TARGET, verdict
from loadtests.report import table, write_section
from router.tools.replay.bound import reference_summaries
from router.tools.replay.run import replay

PEER, OURS = "sglang_cache_aware", "ttft"


@dataclass(frozen=True)
class CellResult:
    seed: int
    cell: str
    peer_p90: float
    peer_hit: float
    p90: float
    hit: float
    copies: int  # cache_room's replicate decisions
    homes: int  # cache_room's home decisions
    bound_p90: float
    verdict: str
    lru_p90: float = math.nan  # lru_alone's (runs before it was measured have none)

    @property
    def meets(self) -> bool:
        return self.verdict == "meets target"

    @property
    def misses_hit(self) -> bool:
        return self.hit < self.peer_hit - HIT_MARGIN

    @property
    def ratio(self) -> float:
        return self.p90 / self.peer_p90

    @property
    def reach(self) -> float:
        """The bound's p90 over cache_aware's: above P90_TARGET, no policy can meet the target."""
        return self.bound_p90 / self.peer_p90

    @property
    def out_of_reach(self) -> bool:
        return self.reach > P90_TARGET

    @property
    def cache_reach(self) -> float:
        """lru_alone's p90 over cache_aware's (NaN when not measured)."""
        return self.lru_p90 / self.peer_p90

    @property
    def beyond_caches(self) -> bool:
        return self.cache_reach > P90_TARGET


def run_cell(job: tuple[int, str, int]) -> CellResult:
    seed, name, requests = job
    (cell,) = [c for c in select([name]) if c.name == name]
    d = draw(cell, seed, requests)
    peer = replay(d.trace, d.spec, PEER, seed=1, ttft_slo_s=1e9).summary
    ours = replay(d.trace, d.spec, OURS, seed=1, ttft_slo_s=1e9).summary
    bound, lru = reference_summaries(d.trace, d.spec, 1e9)
    reasons: dict[str, int] = ours["decisions_by_reason"]  # type: ignore[assignment]
    v = verdict(ours["ttft_p90"], ours["hit_ratio"], {"cache_aware": (peer["ttft_p90"], peer["hit_ratio"])})  # type: ignore[arg-type, dict-item]
    return CellResult(seed, name, float(peer["ttft_p90"]), float(peer["hit_ratio"]), float(ours["ttft_p90"]),  # type: ignore[arg-type]
                      float(ours["hit_ratio"]), reasons.get("replicate", 0), reasons.get("home", 0),  # type: ignore[arg-type]
                      float(bound["ttft_p90"]), v.replace("misses: ", ""), float(lru["ttft_p90"]))  # type: ignore[arg-type]


def run_all(seeds: Sequence[int], cells: Sequence[str], requests: int, jobs: int) -> list[CellResult]:
    work = [(s, c, requests) for s in seeds for c in cells]
    if jobs <= 1:
        results = [run_cell(w) for w in work]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = []
            for r in pool.imap_unordered(run_cell, work):
                results.append(r)
                print(f"  {len(results)}/{len(work)} seed {r.seed} {r.cell}: {r.verdict}", file=sys.stderr)
    order = {(s, c): i for i, (s, c, _) in enumerate(work)}
    return sorted(results, key=lambda r: order[(r.seed, r.cell)])


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


@dataclass(frozen=True)
class SeedSummary:
    cells: int
    meeting: int
    missing_hit: int
    geomean_ratio: float
    copies: int
    out_of_reach: int
    meeting_in_reach: int
    beyond_caches: int


def summarise(results: Sequence[CellResult]) -> SeedSummary:
    return SeedSummary(len(results), sum(r.meets for r in results), sum(r.misses_hit for r in results),
                       geomean([r.ratio for r in results]), sum(r.copies for r in results),
                       sum(r.out_of_reach for r in results), sum(r.meets and not r.out_of_reach for r in results),
                       sum(r.beyond_caches for r in results))


def _by_seed(results: Sequence[CellResult]) -> dict[int, list[CellResult]]:
    out: dict[int, list[CellResult]] = {}
    for r in results:
        out.setdefault(r.seed, []).append(r)
    return out


def _pair(now: SeedSummary, base: SeedSummary | None, field: str, fmt: str) -> str:
    """``field`` of ``now``, as ``base -> now`` when there is a base."""
    text = format(getattr(now, field), fmt)
    return text if base is None else f"{format(getattr(base, field), fmt)} → {text}"


def seed_table(results: Sequence[CellResult], base: Sequence[CellResult] | None) -> str:
    """Per seed: cells, meeting, missing hit, geometric-mean p90 ratio, copies (base -> these when compared)."""
    cells = {(r.seed, r.cell) for r in results}  # the base's summary over the same cells only
    mine, theirs = _by_seed(results), _by_seed([r for r in base or [] if (r.seed, r.cell) in cells])
    rows: list[list[object]] = []
    for seed, rs in mine.items():
        s = summarise(rs)
        b = summarise(theirs[seed]) if seed in theirs else None

        rows.append([seed, s.cells, _pair(s, b, "meeting", "d"), _pair(s, b, "missing_hit", "d"),
                     _pair(s, b, "geomean_ratio", ".3f"), _pair(s, b, "copies", "d"), s.out_of_reach,
                     _pair(s, b, "meeting_in_reach", "d"), s.beyond_caches])
    return table(["seed", "cells", "meeting the target", "missing the hit target", "geometric mean p90 / cache_aware",
                  "copy decisions", "out of reach (bound > 0.8x)", "meeting, of those in reach",
                  "beyond the caches (lru_alone > 0.8x)"], rows)


def cell_table(results: Sequence[CellResult], base: Sequence[CellResult] | None) -> str:
    theirs = {(r.seed, r.cell): r for r in base or []}
    rows: list[list[object]] = []
    for r in results:
        reach = f"{r.reach:.2f}" + (" out of reach" if r.out_of_reach else "")
        lru = "—" if math.isnan(r.lru_p90) else f"{r.cache_reach:.2f}" + (" beyond the caches" if r.beyond_caches else "")
        row: list[object] = [r.cell, f"{r.peer_p90:.3f} / {r.peer_hit:.3f}", reach, lru]
        b = theirs.get((r.seed, r.cell))
        if base is not None:
            row += [f"{b.p90:.3f} / {b.hit:.3f} / {b.copies}", b.verdict] if b else ["—", "—"]
        row += [f"{r.p90:.3f} / {r.hit:.3f} / {r.copies}", r.verdict]
        rows.append(row)
    head = ["cell", "cache_aware p90 s / hit", "bound p90 / cache_aware's", "lru_alone p90 / cache_aware's"]
    if base is not None:
        head += ["ttft base: p90 s / hit / copies", "verdict"]
    head += ["ttft: p90 s / hit / copies", "verdict"]
    return table(head, rows)


def report(results: Sequence[CellResult], base: Sequence[CellResult] | None) -> str:
    parts = ["### Per seed\n\n" + seed_table(results, base)]
    for seed, rs in _by_seed(results).items():
        b = [r for r in base if r.seed == seed] if base is not None else None
        parts.append(f"#### Seed {seed}\n\n" + cell_table(rs, b))
    return "\n\n".join(parts)


def load(path: Path) -> list[CellResult]:
    return [CellResult(**row) for row in json.loads(path.read_text())]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--cells", nargs="+", default=None, metavar="PATTERN", help="as quality_matrix.py --cells")
    p.add_argument("--requests", type=int, default=600, help="requests per cell (the matrix's default 600)")
    p.add_argument("--jobs", type=int, default=2, help="cells replayed at once (processes)")
    p.add_argument("--json", type=Path, default=None, help="write every cell's figures here")
    p.add_argument("--against", type=Path, default=None, help="a --json of other code (e.g. main) to compare with")
    p.add_argument("--results", type=Path, default=None,
                   help="report a --json run instead of replaying (its seeds and cells; --seeds/--cells ignored)")
    p.add_argument("--note", default="", help="prose to put before the tables with --write")
    p.add_argument("--write", action="store_true", help="append (or replace) --section in docs/benchmarks.md")
    p.add_argument("--section", default="Routing quality matrix, replay: several seeds")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cells = [c.name for c in select(args.cells)]
    if args.results:
        loaded = load(args.results)
        cells = list(dict.fromkeys(r.cell for r in loaded))
        args.seeds = list(dict.fromkeys(r.seed for r in loaded))
    if not cells:
        print("error: no cell matches --cells", file=sys.stderr)
        return 2
    base = load(args.against) if args.against else None
    busy = busy_processes()
    started = time.perf_counter()
    results = loaded if args.results else run_all(args.seeds, cells, args.requests, args.jobs)
    elapsed = time.perf_counter() - started
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    text = report(results, base)
    print(text)
    print(f"\ndone in {elapsed:.0f} s", file=sys.stderr)
    if args.write:
        run = (f"reported from {args.results.name} (a --json run)" if args.results
               else f"{args.jobs} at a time; {elapsed / 60:.0f} min")
        note = (f"{len(cells)} cells x seeds {' '.join(map(str, args.seeds))}, {args.requests} requests per cell, replay "
                f"only (virtual time), {run}. Per cell: cache_aware "
                "(`sglang_cache_aware`) and `ttft` as quality_matrix.py replays and judges them (target: p90 <= "
                f"{P90_TARGET}x cache_aware's, hit >= its - {100 * HIT_MARGIN:.0f} pts), copies = cache_room's replicate "
                "decisions, and the bound's p90 over cache_aware's: above 0.8x (`out of reach`) no policy could meet "
                "the p90 target; lru_alone's likewise (`beyond the caches`: no queue, the hits of one LRU as large as "
                "the cluster's caches). " + ("" if args.results else contention_note(busy)))
        given = list(argv if argv is not None else sys.argv[1:])
        if "--note" in given:  # prose, not part of what reproduces the figures
            del given[given.index("--note"):given.index("--note") + 2]
        command = "python loadtests/quality_seeds.py " + shlex.join(given)
        write_section(args.section, command, (args.note + "\n\n" if args.note else "") + note + "\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
