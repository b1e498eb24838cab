"""The first minute with a 2.5x wrong default prefill rate: calibration from the router's own
first bytes alone, against the same plus the engines' own prefill histograms.

Four emulated vLLM engines (profile, step-time slowdown and arrival rate drawn from the seed,
as the quality matrix's ``b2b_uniform/2x/defaults`` cell draws them), the cell's trace sent open
loop. A share of the requests (``--bypass``) goes straight to a random engine, as another
router's or a direct client's would: the engines' histograms count them, the router's first
bytes cannot. The router is given only the URLs and a default rate ``--wrong`` times too high
and too low (and right, for reference). Rows: TTFT p50/p90 of the requests sent through the router, over the first third
of the run and the whole run, in emulated seconds (wall / time scale); the rate the router
believed at the end, as a multiple of the true one (1.00 is right); the decode step it believed at the end
(engines.decode_step, from the engines' inter-token latency histograms) over the engines' own mean
inter-token latency during the run (``--decode-step off``: the router keeps the configured step).

Wall-time figures: run under the shared lock.

    flock /work/scratch/bench.lock python loadtests/engine_calibration.py --seconds 60 --write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.matrix_cells import ENGINES, Cell, Drawn, draw
from loadtests.matrix_live import _send, prompt_text
from loadtests.report import table, write_section
from router.engines.readings import parse_metrics
from router.tools.localrun import Engine, emulated_cluster, pd_cluster_spec, profile_timing, reset_engines, router_process
from router.tools.emulator.perf import get_profile
from router.tools.replay.summary import percentile
from router.tools.replay.trace import TraceRequest

SECTION = "Calibration from the engines' own metrics: the first minute with a 2.5x wrong default rate (issue 9 item 3)"
TOKEN = "bench"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="wall seconds of traffic per run")
    p.add_argument("--wall-rate", type=float, default=3.0, help="arrivals per wall second (sets the emulators' time scale)")
    p.add_argument("--bypass", type=float, default=0.5, help="share of the requests sent straight to an engine")
    p.add_argument("--wrong", type=float, default=2.5, help="the default rate is this many times too high, then too low")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cell", default="b2b_uniform/2/defaults", help="workload/pressure/knowledge the traffic is drawn as")
    p.add_argument("--decode-step", choices=("on", "off"), default="on",
                   help="the router measures each engine's decode step from its inter-token latency (engines.decode_step)")
    p.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    return p.parse_args(argv)


def config(engines: Sequence[Engine], rate: float, engine_calibration: bool, seed: int,
           decode_step: bool = True) -> dict[str, Any]:
    """Only what a new user writes (the URLs), plus the wrong default rate."""
    return {"instances": [{"url": e.url, "name": e.name, "model": "demo-model"} for e in engines],
            "policy": {"name": "ttft", "seed": seed, "ttft": {"prefill_tokens_per_s": rate}},
            "engines": {"calibration": {"enabled": engine_calibration}, "decode_step": {"enabled": decode_step}},
            "server": {"admin_token": TOKEN}, "health": {"interval_s": 2.0}}


async def drive(router: str, engines: Sequence[Engine], reqs: Sequence[TraceRequest], texts: Sequence[str],
                time_scale: float, bypass: float, seed: int) -> tuple[list[tuple[float, float]], int]:
    """Send the trace open loop; (arrival wall s, TTFT wall s) of the routed requests, and errors."""
    rng = random.Random(seed)
    targets = [rng.choice(engines).url if rng.random() < bypass else router for _ in reqs]
    routed: list[tuple[float, float]] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits, trust_env=False) as client:
        t0 = time.perf_counter() + 0.5

        async def one(req: TraceRequest, text: str, url: str) -> None:
            ttfts: list[float] = []
            at = t0 + req.arrival_s * time_scale
            await _send(client, url, req, text, at, ttfts, errors)
            if url == router and ttfts:
                routed.append((at - t0, ttfts[0]))

        await asyncio.gather(*(one(r, t, u) for r, t, u in zip(reqs, texts, targets)))
    return routed, len(errors)


def believed(router: str) -> tuple[float, float | None]:
    """The mean prefill rate and decode step the router uses now, over its instances (the
    step over those it has measured; None when it measured none)."""
    docs = httpx.get(f"{router}/debug/instances", headers={"authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    rates = [float(d["prefill_tokens_per_s"]) for d in docs["instances"]]
    steps = [float(d["decode_step_s"]) for d in docs["instances"] if d.get("decode_step_s") is not None]
    return sum(rates) / len(rates), (sum(steps) / len(steps) if steps else None)


def itl_totals(engines: Sequence[Engine]) -> tuple[float, float]:
    """(seconds, tokens) of inter-token latency the engines have counted, summed."""
    seconds = tokens = 0.0
    for e in engines:
        r = parse_metrics(httpx.get(f"{e.url}/metrics", timeout=5).text)
        seconds += r.itl_s or 0.0
        tokens += r.itl_tokens or 0.0
    return seconds, tokens


def run(args: argparse.Namespace) -> tuple[str, list[list[object]]]:
    workload, pressure, knowledge = args.cell.split("/")
    d: Drawn = draw(Cell(workload, float(pressure), knowledge), args.seed, 2000)
    time_scale = max(0.25, d.rate / args.wall_rate)
    wall = time_scale * d.spec.slowdown  # wall seconds per profile second
    true_rate = profile_timing(get_profile(d.spec.profile), wall)["prefill_tokens_per_s"]
    reqs = [r for r in d.trace.requests if r.arrival_s * time_scale <= args.seconds]
    texts = [prompt_text(r) for r in reqs]
    variants = [(f"{w:g}x", true_rate * w, on) for w in (args.wrong, 1 / args.wrong, 1.0) for on in (False, True)]
    rows: list[list[object]] = []
    with emulated_cluster(pd_cluster_spec(0, 0, ENGINES, "vllm"), profile=d.spec.profile, time_scale=wall,
                          seed=args.seed, cache_tokens=d.spec.cache_tokens) as engines:
        for name, rate, on in variants:
            reset_engines(engines)
            itl_before = itl_totals(engines)
            with router_process(config(engines, rate, on, args.seed, args.decode_step == "on")) as proc:
                routed, errors = asyncio.run(drive(proc.url, engines, reqs, texts, time_scale, args.bypass, args.seed))
                end_rate, end_step = believed(proc.url)
            itl_after = itl_totals(engines)
            spent, tokens = itl_after[0] - itl_before[0], itl_after[1] - itl_before[1]
            step_ratio = f"{end_step / (spent / tokens):.2f}" if end_step is not None and tokens > 0 else "-"
            early = [t / time_scale for at, t in routed if at <= args.seconds / 3]
            every = [t / time_scale for _, t in routed]
            row: list[object] = [name, "on" if on else "off", len(routed), errors,
                                 f"{percentile(early, 50):.3f}", f"{percentile(early, 90):.3f}",
                                 f"{percentile(every, 50):.3f}", f"{percentile(every, 90):.3f}", f"{end_rate / true_rate:.2f}",
                                 step_ratio]
            rows.append(row)
            print("  " + " | ".join(str(c) for c in row), flush=True)
    note = (f"{d.describe()}; {len(reqs)} requests in {args.seconds:g} s wall, {args.bypass:.0%} straight to a random "
            f"engine; emulator time x{wall:.2f}; true rate {true_rate:.0f} tokens/s (wall)")
    return note, rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load = os.getloadavg()
    note, rows = run(args)
    headers = ["default rate", "engine metrics", "routed", "errors", f"p50 first {args.seconds / 3:g} s",
               f"p90 first {args.seconds / 3:g} s", "p50 all", "p90 all", "rate believed at end / true",
               "decode step believed at end / engines' mean inter-token latency"]
    body = table(headers, rows)
    print(note)
    print(body)
    load_note = f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: " + \
        " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(load_note)
    if args.write:
        command = "flock /work/scratch/bench.lock python loadtests/engine_calibration.py " + " ".join(argv or sys.argv[1:])
        write_section(SECTION, command, f"{note}. {load_note}.\n\n{body}\n")


if __name__ == "__main__":
    main()
