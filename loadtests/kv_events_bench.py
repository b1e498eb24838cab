"""Precise residency from KV events: does the router know what the engines hold, does it
route better for it, and how many events can one router process take while routing?

Three parts (``--parts``), each printing its table; ``--write`` records them in
docs/benchmarks.md under "Precise residency from KV events":

* replay: ``pd-router replay`` of a shared-prefix trace on 4 engines whose caches hold a
  fraction of the tenants' prefixes, approximate vs precise residency, with the router
  told the engines' real cache size and then the config default (500k tokens, what a new
  user gets). Predicted hit = what residency said at decision time; measured = what the
  engines served from cache at admission.
* live: emulated engines (subprocesses, publishing KV events on ZMQ) behind a router
  process on the same seeded chat workload: approximate (character keys, routing
  history) with the real and the default cache size, and precise (token mode through the
  engines' /tokenize, events found through GET /kv_event_sources). Predicted = the
  router's pd_router_estimated_cached_prefix_ratio mean; measured = the engines' per
  request cached / prompt tokens mean, so both are per-request means.
* ingest: moved to ``loadtests/kv_flood.py`` (docs/benchmarks.md, "KV-event ingest while
  routing"), which measures in-process and sidecar ingestion side by side.
* tokenize: how long encoding one prompt with a local tokenizer.json takes (token mode,
  ``source: file``), which sets where prompts move to a worker thread.

    python loadtests/kv_events_bench.py --write
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.loadgen import LoadResult, encode_post, new_event_loop, run_load
from loadtests.machine import busy_processes, contention_note, wait_until_quiet
from loadtests.report import table, write_section
from router.tools.localrun import emulated_cluster, engine_stats, pd_cluster_spec, reset_engines, router_config, router_process
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import replay
from router.tools.replay.source import load_trace
from router.tools.shared_prefix import SharedPrefix
from router.tools.workload import SharedPrefixWorkload, drive

SECTION = "Precise residency from KV events"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = 500_000  # what the router assumes per instance when its config says nothing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["replay", "live", "tokenize"],
                   choices=["replay", "live", "tokenize"])
    p.add_argument("--trace", default="synthetic:shared_prefix")
    p.add_argument("--rate-scale", type=float, default=0.5)
    p.add_argument("--replay-cache-tokens", type=int, default=30_000, help="per engine: ~5 of 32 tenants' system prompts")
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--time-scale", type=float, default=0.5)
    p.add_argument("--cache-tokens", type=int, default=8_000,
                   help="live engines: two running requests and about three of the twelve tenants' prefixes")
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for other heavy processes to finish")
    p.add_argument("--write", action="store_true")
    return p.parse_args(argv)


# -- replay ------------------------------------------------------------------------------
def part_replay(args: argparse.Namespace) -> str:
    trace = load_trace(args.trace, 0).scaled(args.rate_scale)
    rows = []
    for told in (None, DEFAULT_CACHE):
        spec = ClusterSpec(mixed=4, cache_tokens=args.replay_cache_tokens, router_cache_tokens=told)
        for residency in ("approximate", "precise"):
            s = replay(trace, spec, "ttft", residency=residency).summary
            rows.append([residency, "real" if told is None else f"default ({told:,})", f"{s['predicted_hit_ratio']:.3f}",
                         f"{s['hit_ratio']:.3f}", f"{s['ttft_p50']:.3f}", f"{s['ttft_p90']:.3f}", f"{s['ttft_p99']:.3f}"])
            print(f"  replay {rows[-1]}", file=sys.stderr)
    head = (f"Replay: `{args.trace}` x{args.rate_scale} ({len(trace.requests)} requests), 4 mixed engines of "
            f"{args.replay_cache_tokens:,} cache tokens, policy ttft.\n\n")
    return head + table(["residency", "cache size the router is told", "predicted hit", "measured hit", "TTFT p50 s",
                         "TTFT p90 s", "TTFT p99 s"], rows)


# -- live --------------------------------------------------------------------------------
def _router_metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _engine_request_mean(engines: list[Any], before: dict[str, dict[str, Any]],
                         after: dict[str, dict[str, Any]]) -> float:
    """Mean of cached / prompt tokens over the requests each engine finished in the run."""
    ratios = []
    with httpx.Client(timeout=5, trust_env=False) as client:
        for e in engines:
            n = after[e.name]["requests"]["finished"] - before[e.name]["requests"]["finished"]
            if n <= 0:
                continue
            for rec in client.get(e.url + "/emulator/stats", params={"recent": n}).json()["recent"]:
                if rec["prompt_tokens"]:
                    ratios.append(rec["cached_tokens"] / rec["prompt_tokens"])
    return sum(ratios) / len(ratios) if ratios else float("nan")


def part_live(args: argparse.Namespace) -> str:
    workload = SharedPrefixWorkload(requests=args.requests, groups=args.groups, seed=1)
    bodies = workload.bodies()
    specs = pd_cluster_spec(0, 0, mixed=3)
    variants: list[tuple[str, str, dict[str, Any], int | None]] = [
        ("approximate", "real", {}, args.cache_tokens),
        ("approximate", f"default ({DEFAULT_CACHE:,})", {}, None),
        ("precise", f"default ({DEFAULT_CACHE:,})", {"hashing": {"mode": "tokens"},
                                                      "kv_events": {"enabled": True, "discover_interval_s": 0.5}}, None),
    ]
    rows = []
    with emulated_cluster(specs, time_scale=args.time_scale, cache_tokens=args.cache_tokens, kv_events=True) as engines:
        for residency, told, extra, router_cache in variants:
            reset_engines(engines)  # each run starts cold; engines publish AllBlocksCleared
            config = router_config(engines, "ttft", time_scale=args.time_scale, cache_tokens=router_cache, extra=extra)
            if router_cache is None:
                for inst in config["instances"]:
                    inst.pop("cache_tokens")
            with router_process(config) as router:
                time.sleep(1.5 if residency == "precise" else 0.2)  # discovery, subscription
                before = engine_stats(engines)
                result = asyncio.run(drive(router.url, bodies, args.concurrency))
                time.sleep(0.3)
                after = engine_stats(engines)
                cached = sum(after[n]["tokens"]["cached"] - before[n]["tokens"]["cached"] for n in after)
                prompt = sum(after[n]["tokens"]["prompt"] - before[n]["tokens"]["prompt"] for n in after)
                count = _router_metric(router.url, "pd_router_estimated_cached_prefix_ratio_count")
                total = _router_metric(router.url, "pd_router_estimated_cached_prefix_ratio_sum")
                measured = _engine_request_mean(engines, before, after)
            rows.append([residency, told, f"{total / count if count else float('nan'):.3f}", f"{measured:.3f}",
                         f"{cached / prompt if prompt else 0:.3f}", f"{result.ttft_p50 * 1000:.0f}",
                         f"{result.ttft_p90 * 1000:.0f}", result.errors])
            print(f"  live {rows[-1]}", file=sys.stderr)
    head = (f"Live: 3 emulated engines (subprocesses, time scale {args.time_scale}, {args.cache_tokens:,} cache tokens "
            f"each), {args.requests} streaming chat requests, {workload.groups} tenants x {workload.users} users "
            f"(~{workload.system_tokens} shared tokens each), concurrency {args.concurrency}, policy ttft.\n\n")
    return head + table(["residency", "cache size the router is told", "predicted hit (per request)",
                         "measured hit (per request)", "measured hit (tokens)", "TTFT p50 ms", "TTFT p90 ms", "errors"], rows)


# -- ingest ------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _events_applied(url: str) -> float:
    return _router_metric(url, "pd_router_kv_events_total")


async def paced_load(host: str, port: int, requests: list[bytes], rate: float, duration_s: float,
                     clients: int = 8) -> LoadResult:
    """Open loop at ``rate`` requests/s over ``clients`` keep-alive connections (a late answer
    delays only its own connection's next request): latency at a load the router can carry,
    so what ingestion adds shows as latency, not as lost throughput."""
    from loadtests.loadgen import _Connection

    loop = asyncio.get_running_loop()
    result = LoadResult()
    start = time.perf_counter() + 0.2

    async def client(k: int) -> None:
        _t, conn = await loop.create_connection(_Connection, host, port)
        n = 0
        while True:
            due = start + (n * clients + k) / rate
            if due > start + duration_s:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            conn.waiter = loop.create_future()
            t0 = time.perf_counter()
            assert conn.transport is not None
            conn.transport.write(requests[(n * clients + k) % len(requests)])
            status = await asyncio.wait_for(conn.waiter, 10)
            result.latencies.append(time.perf_counter() - t0)
            result.completed += 1
            result.errors += status != 200
            n += 1
        assert conn.transport is not None
        conn.transport.close()

    await asyncio.gather(*(client(k) for k in range(clients)))
    result.window_s = duration_s
    return result


def _load(url: str, bodies: list[dict[str, object]], rate: float, duration: float) -> LoadResult:
    host, port = url.rsplit("//", 1)[1].split(":")
    reqs = [encode_post(host, int(port), "/v1/completions", b) for b in bodies]
    loop = new_event_loop()
    try:
        if rate > 0:
            return loop.run_until_complete(paced_load(host, int(port), reqs, rate, duration))
        return loop.run_until_complete(run_load(host, int(port), reqs, 8, duration, 1.0))
    finally:
        loop.close()


def _flood(port: int, rate: int, seconds: float) -> subprocess.Popen[str]:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from loadtests.kv_flood import flood_main; "
            f"flood_main({port}, {float(rate)}, {float(seconds)})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


# -- tokenize ----------------------------------------------------------------------------
def part_tokenize(args: argparse.Namespace) -> str:
    """How long the event loop would be held by encoding one prompt in the router."""
    import tempfile

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from router.config.precise import TokensConfig
    from router.request.tokenize import FileTokenizer

    # ~400k characters of the workloads' English-like text (one system prompt of the shared-prefix generator)
    words = SharedPrefix(1, 1, 80_000, 1, 0).texts().systems[0][:400_000]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([words[:200_000]], trainer=trainers.BpeTrainer(
        vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(f"{tmp}/tokenizer.json")
        file_tok = FileTokenizer(TokensConfig(source="file", path=f"{tmp}/tokenizer.json"))
        for chars in (1_000, 10_000, 100_000, 400_000):
            text = words[:chars]
            file_tok.encode(text, True)
            reps = max(3, 200_000 // chars)
            t0 = time.perf_counter()
            for _ in range(reps):
                ids = file_tok.encode(text, True)
            ms = (time.perf_counter() - t0) / reps * 1e3
            stall = asyncio.run(_loop_stall(file_tok, text))
            rows.append([f"{chars:,}", f"{len(ids):,}", f"{ms:.2f}", f"{stall:.1f}",
                         "thread" if chars > TokensConfig().offload_chars else "inline"])
    head = ("Tokenize: a byte-level BPE of 8,000 tokens trained here with `tokenizers` (no download), encoding one "
            "prompt of the workload's English-like text; prompts above `hashing.tokens.offload_chars` "
            f"({TokensConfig().offload_chars:,}) are encoded in a worker thread so the event loop never waits for them.\n\n")
    return head + table(["prompt chars", "tokens", "encode ms", "longest event-loop stall ms (1 ms ticker)", "where"],
                        rows)


async def _loop_stall(file_tok: Any, text: str) -> float:
    """The longest gap a 1 ms ticker sees while the router's tokenizer encodes ``text``."""
    from router.request.prompt import parse_body

    parsed = parse_body(json.dumps({"model": "m", "prompt": text}).encode(), "completions", 4.0)
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    gaps.clear()
    await file_tok.apply(parsed)
    await asyncio.sleep(0.002)
    task.cancel()
    return max(gaps) * 1e3


def main() -> int:
    args = parse_args()
    parts = {"replay": part_replay, "live": part_live, "tokenize": part_tokenize}
    busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else busy_processes()
    out = [f"{contention_note(busy)} Load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."]
    for name in args.parts:
        print(f"{name} ...", file=sys.stderr)
        out.append(parts[name](args))
        print(out[-1] + "\n")
    if args.write:
        command = "python loadtests/kv_events_bench.py" + ("" if len(args.parts) == 3 else " --parts " + " ".join(args.parts))
        write_section(SECTION, command + " --write", "\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
