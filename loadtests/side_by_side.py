"""Live side by side: pd-router, sglang-router and vllm-router in front of the same emulated engines.

Why this shape: routers only differ where routing matters, so the engines' KV cache is sized
to hold the whole shared-prefix working set across the pool but not on one engine (12 groups x
~1.5k-token prefixes = ~18k tokens, plus the requests in flight, against 20k tokens per engine),
and the engines run in real time (time scale 1.0) so model time, not CPU, decides TTFT. Each
router in turn gets the *same* cluster with emptied caches and the *same* seeded workload, driven
by Locust headless (``loadtests/locustfile.py``, knobs by environment, CSV output). Engine-side
prefix hits come from the emulators' exact counters (``/emulator/stats`` deltas).

Scenarios (each router in the protocol it was built for):
  colocated   3 mixed vLLM-flavour engines: pd-router, sglang-router, vllm-router
  pd-vllm     2 prefill + 2 decode, vLLM flavour (NIXL-style kv_transfer_params): pd-router, vllm-router
  pd-sglang   2 prefill + 2 decode, SGLang flavour (bootstrap rooms): pd-router, sglang-router

    python loadtests/side_by_side.py --write
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.machine import Busy, busy_processes, contention_note, wait_until_quiet
from loadtests.peers import PeerUnavailable, Workers, command_line, peer_router
from loadtests.report import table, write_section
from router.tools.localrun import (
    Engine,
    emulated_cluster,
    engine_stats,
    pd_cluster_spec,
    reset_engines,
    router_config,
    router_process,
)

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Live side by side: pd-router, sglang-router, vllm-router"
SCENARIOS: dict[str, tuple[tuple[int, int, int, str], tuple[str, ...]]] = {
    # name: ((prefill, decode, mixed, flavor), routers)
    "colocated": ((0, 0, 3, "vllm"), ("pd-router", "sglang-router", "vllm-router")),
    "pd-vllm": ((2, 2, 0, "vllm"), ("pd-router", "vllm-router")),
    "pd-sglang": ((2, 2, 0, "sglang"), ("pd-router", "sglang-router")),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--routers", nargs="+", default=["pd-router", "sglang-router", "vllm-router"])
    p.add_argument("--duration", type=int, default=30, help="Locust run time per router, seconds")
    p.add_argument("--users", type=int, default=24, help="Locust users (closed-loop clients)")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per emulated GPU second")
    p.add_argument("--cache-tokens", type=int, default=20_000, help="KV cache per engine, tokens")
    p.add_argument("--profile", default="llama3-8b-h100")
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int, default=1500, help="shared prefix, words (~tokens)")
    p.add_argument("--question-len", type=int, default=64, help="words (~tokens)")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for other heavy processes to finish")
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    return p.parse_args(argv)


@dataclass
class Row:
    scenario: str
    router: str
    tokens_per_s: float = 0.0
    ttft_p50_ms: float = float("nan")
    ttft_p90_ms: float = float("nan")
    requests: int = 0
    errors: int = 0
    hit_ratio: float = float("nan")
    computed_k: float = float("nan")  # prefill tokens the engines computed, thousands
    note: str = ""


def locust_env(args: argparse.Namespace) -> dict[str, str]:
    """The workload knobs, passed to locustfile.py by environment."""
    knobs = {"GROUPS": args.groups, "PROMPTS_PER_GROUP": args.prompts_per_group, "SYSTEM_PROMPT_LEN": args.system_prompt_len,
             "QUESTION_LEN": args.question_len, "OUTPUT_LEN": args.output_len, "SEED": args.seed, "MODEL": "demo-model"}
    return {f"PDR_LT_{k}": str(v) for k, v in knobs.items()}


def locust_argv(url: str, csv_prefix: str, args: argparse.Namespace) -> list[str]:
    locust = os.path.join(os.path.dirname(sys.executable), "locust")
    return [locust if os.access(locust, os.X_OK) else "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
            "--headless", "-u", str(args.users), "-r", str(max(1, args.users // 2)), "-t", f"{args.duration}s",
            "--host", url, "--csv", csv_prefix, "--only-summary", "--loglevel", "INFO"]


_TOTALS = re.compile(r"shared-prefix load: (\d+) ok streams, (\d+) output tokens, ([\d.]+) output tokens/s")


def read_locust(csv_prefix: str, log: str, row: Row) -> None:
    """Fill ``row`` from Locust's ``*_stats.csv`` and its closing log line."""
    with open(csv_prefix + "_stats.csv", newline="") as fh:
        stats = {r["Name"]: r for r in csv.DictReader(fh)}
    for name, r in stats.items():
        if name.startswith("/v1/"):
            row.requests += int(r["Request Count"])
            row.errors += int(r["Failure Count"])
    ttft = stats.get("ttft")
    if ttft and int(ttft["Request Count"]):
        row.ttft_p50_ms, row.ttft_p90_ms = float(ttft["50%"]), float(ttft["90%"])
    totals = _TOTALS.search(log)
    if totals:
        row.tokens_per_s = float(totals.group(3))


def engine_delta(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], row: Row) -> None:
    """Prefix hit ratio = cached / (cached + computed) prompt tokens over all engines (PD transfers excluded)."""
    cached = computed = 0
    for name, stats in after.items():
        cached += stats["tokens"]["cached"] - before[name]["tokens"]["cached"]
        computed += stats["tokens"]["prefill_computed"] - before[name]["tokens"]["prefill_computed"]
    row.hit_ratio = cached / (cached + computed) if cached + computed else float("nan")
    row.computed_k = computed / 1000


def workers(engines: Sequence[Engine]) -> Workers:
    if all(e.spec.role == "mixed" for e in engines):
        return Workers(regular=tuple(e.url for e in engines))
    prefill = tuple((e.url, e.process.bootstrap_port if e.spec.flavor == "sglang" else None)
                    for e in engines if e.spec.role == "prefill")
    return Workers(prefill=prefill, decode=tuple(e.url for e in engines if e.spec.role == "decode"))


@contextlib.contextmanager
def start_router(name: str, engines: Sequence[Engine], args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(url, command) of ``name`` in front of ``engines``; PeerUnavailable if it cannot start."""
    if name == "pd-router":
        config = router_config(engines, "ttft", profile=args.profile, time_scale=args.time_scale,
                               cache_tokens=args.cache_tokens, seed=args.seed)
        with contextlib.ExitStack() as stack:
            try:
                proc = stack.enter_context(router_process(config))
            except RuntimeError as exc:
                raise PeerUnavailable(f"pd-router: {exc}") from None
            yield proc.url, "pd-router serve (policy ttft, config from router.tools.localrun.router_config)"
        return
    with peer_router(name, workers(engines)) as peer:
        yield peer.url, command_line(peer.argv)


def run_one(scenario: str, name: str, engines: Sequence[Engine], args: argparse.Namespace, commands: dict[str, str]) -> Row:
    row = Row(scenario, name)
    reset_engines(engines)
    try:
        with start_router(name, engines, args) as (url, command), tempfile.TemporaryDirectory() as tmp:
            commands.setdefault(f"{scenario} / {name}", command)
            before = engine_stats(engines)
            print(f"  {scenario:<10} {name:<14} locust {args.users} users x {args.duration}s ...", file=sys.stderr)
            done = subprocess.run(locust_argv(url, os.path.join(tmp, "run"), args), env={**os.environ, **locust_env(args)},
                                  capture_output=True, text=True, timeout=args.duration + 120, cwd=tmp, check=False)
            time.sleep(0.5)  # let the engines' counters settle after the last stream
            engine_delta(before, engine_stats(engines), row)
            read_locust(os.path.join(tmp, "run"), done.stderr + done.stdout, row)
            if done.returncode not in (0, 1):  # 1 = some requests failed, reported as errors
                row.note = f"locust exited {done.returncode}: {done.stderr.strip()[-200:]}"
    except PeerUnavailable as exc:
        row.note = "did not start: " + str(exc).splitlines()[0][:160]
        print(f"  {scenario:<10} {name:<14} {row.note}", file=sys.stderr)
    return row


def render(rows: Sequence[Row]) -> str:
    def num(value: float, fmt: str) -> str:
        return "—" if math.isnan(value) else format(value, fmt)

    body = [[r.scenario, r.router, num(r.tokens_per_s, ".0f"), num(r.ttft_p50_ms, ".0f"), num(r.ttft_p90_ms, ".0f"),
             r.requests, r.errors, num(r.hit_ratio * 100, ".0f") + ("" if math.isnan(r.hit_ratio) else "%"),
             num(r.computed_k, ".0f"), r.note] for r in rows]
    return table(["scenario", "router", "output tok/s", "TTFT p50 ms", "TTFT p90 ms", "requests", "errors",
                  "engine prefix hit", "prefill k-tokens computed", "note"], body)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    busy: list[Busy] = wait_until_quiet(args.wait_quiet) if args.wait_quiet else busy_processes()
    rows: list[Row] = []
    commands: dict[str, str] = {}
    started = time.perf_counter()
    for scenario in args.scenarios:
        (p, d, m, flavor), routers = SCENARIOS[scenario]
        chosen = [r for r in routers if r in args.routers]
        if not chosen:
            continue
        print(f"{scenario}: starting {p + d + m} emulated {flavor} engines ...", file=sys.stderr)
        with emulated_cluster(pd_cluster_spec(p, d, m, flavor), profile=args.profile, time_scale=args.time_scale,
                              seed=args.seed, cache_tokens=args.cache_tokens) as engines:
            rows += [run_one(scenario, name, engines, args, commands) for name in chosen]
    body = render(rows)
    print(body)
    print(f"\ndone in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.write:
        note = (f"Workload: Locust `loadtests/locustfile.py`, {args.users} users, {args.duration} s per router, "
                f"{args.groups} groups × {args.prompts_per_group} questions, ~{args.system_prompt_len}-token shared "
                f"prefix + ~{args.question_len}-token question, {args.output_len} output tokens, seed {args.seed}, "
                f"streaming `/v1/completions`. Engines: `{args.profile}` emulators at time scale {args.time_scale}, "
                f"{args.cache_tokens} KV tokens each, caches emptied before every router. Engine prefix hit = cached / "
                "(cached + computed) prompt tokens summed over the engines (KV handed over in PD is neither). "
                "pd-router gets the engines' profile and cache size in its config (its normal deployment); the peers "
                "run with their defaults and `--policy cache_aware`; vllm-router's cache_aware asks every engine to tokenize "
                "each prompt first (render 404, then `/tokenize`), as it does in production.\n\n" + contention_note(busy))
        cmds = "\n".join(f"- {k}: `{v}`" for k, v in commands.items())
        write_section(SECTION, "python loadtests/side_by_side.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      note + "\n\n" + body + "\n\nRouter commands:\n\n" + cmds)
    return 1 if any(r.errors or r.note for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
