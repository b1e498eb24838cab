"""Emulator benchmarks: the model's TTFT table and streams per CPU core.

``python -m router.tools.emulator.bench ttft``: for each profile, model TTFT of an
8K-token prompt with 0/25/50/75/100% of it already cached, plus queueing, in
virtual time (deterministic, no sleeping).

``python -m router.tools.emulator.bench streams``: one emulator subprocess, N
concurrent streaming clients (a minimal raw-socket client in this process,
so client cost stays off the emulator's core). Reports the emulator's CPU
time per emitted token and whether it kept pace with the modelled GPU
(wall time vs model time x time scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from router.tools.emulator.build import build_engine
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import spawn_emulator
from router.tools.emulator.perf import PROFILES
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.vclock import run_virtual

# -- TTFT table ----------------------------------------------------------------


def ttft_rows(profile: str, prompt_len: int = 8192,
              fractions: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)
              ) -> list[tuple[float, int, float]]:
    """(fraction, cached tokens, model TTFT seconds) for one profile."""
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 100_000) for _ in range(prompt_len)]
    rows = []
    for fraction in fractions:
        engine = build_engine(EmulatorConfig(profile=profile)).engine
        shared = int(prompt_len * fraction)
        if shared:
            run_virtual(engine, [(0.0, EngineRequest("warm", prompt[:shared], 1))])
        probe = EngineRequest("probe", prompt, 1)
        run_virtual(engine, [(0.0, probe)])
        assert probe.ttft is not None
        rows.append((fraction, probe.num_cached, probe.ttft))
    return rows


def queue_rows(profile: str, prompt_len: int = 2048,
               depths: Sequence[int] = (1, 4, 16, 64)) -> list[tuple[int, float, float]]:
    """(queue depth, mean TTFT, last TTFT) when ``depth`` requests arrive at once."""
    rows = []
    for depth in depths:
        engine = build_engine(EmulatorConfig(profile=profile)).engine
        rng = random.Random(depth)
        reqs = [EngineRequest(f"r{i}", [rng.randrange(1000, 100_000)
                                        for _ in range(prompt_len)], 64)
                for i in range(depth)]
        run_virtual(engine, [(0.0, r) for r in reqs])
        ttfts = [r.ttft or 0.0 for r in reqs]
        rows.append((depth, sum(ttfts) / depth, ttfts[-1]))
    return rows


def print_ttft_tables() -> None:
    for name in sorted(PROFILES):
        print(f"\n{name}: 8192-token prompt, model TTFT")
        print("| cached | cached tokens | TTFT (ms) |")
        print("|---:|---:|---:|")
        for fraction, cached, ttft in ttft_rows(name):
            print(f"| {fraction:.0%} | {cached} | {ttft * 1000:.1f} |")
        print(f"\n{name}: N simultaneous 2048-token prompts (no cache hits)")
        print("| depth | mean TTFT (ms) | last TTFT (ms) |")
        print("|---:|---:|---:|")
        for depth, mean, last in queue_rows(name):
            print(f"| {depth} | {mean * 1000:.1f} | {last * 1000:.1f} |")


# -- streams per core ------------------------------------------------------------


@dataclass
class StreamResult:
    tokens: int
    ttft: float
    total: float
    ok: bool


async def _one_stream(host: str, port: int, prompt: str, max_tokens: int) -> StreamResult:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + body)
    tokens = 0
    ttft = 0.0
    tail = b""
    ok = False
    while True:
        data = await reader.read(65536)
        if not data:
            break
        window = tail + data
        count = window.count(b'data: {"id"')
        if count and tokens == 0:
            ttft = time.perf_counter() - t0
        tokens += count
        if b"data: [DONE]" in window:
            ok = True
            break
        tail = data[-16:]
    writer.close()
    # Every token chunk plus the final finish_reason chunk starts with data: {"id".
    return StreamResult(tokens=max(0, tokens - 1), ttft=ttft,
                        total=time.perf_counter() - t0, ok=ok)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def _run_streams(host: str, port: int, streams: int, max_tokens: int,
                       prompt_words: int) -> list[StreamResult]:
    prompts = [f"stream {i} " + "lorem ipsum dolor sit amet " * (prompt_words // 5)
               for i in range(streams)]
    return await asyncio.gather(*(_one_stream(host, port, p, max_tokens) for p in prompts))


def bench_streams(streams: int, max_tokens: int, time_scale: float, prompt_words: int,
                  profile: str) -> dict[str, float]:
    """Run one load; returns the figures printed by ``main``."""
    config = EmulatorConfig(time_scale=time_scale, profile=profile, max_num_seqs=1024)
    with spawn_emulator(config) as proc, httpx.Client(trust_env=False) as client:
        asyncio.run(_run_streams(proc.host, proc.port, 4, 4, prompt_words))  # warm up
        before = client.get(proc.url + "/emulator/stats").json()
        cpu0 = _cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        results = asyncio.run(_run_streams(proc.host, proc.port, streams, max_tokens,
                                           prompt_words))
        wall = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0
        after = client.get(proc.url + "/emulator/stats").json()
    tokens = sum(r.tokens for r in results)
    busy = after["model_time"]["busy_s"] - before["model_time"]["busy_s"]
    return {
        "streams": streams, "ok_streams": sum(r.ok for r in results),
        "tokens": tokens, "wall_s": wall, "cpu_s": cpu,
        "cpu_util": cpu / wall if wall else 0.0,
        "cpu_us_per_token": 1e6 * cpu / tokens if tokens else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "model_busy_s": busy,
        "pace": wall / (busy * time_scale) if busy and time_scale else 0.0,
        "mean_ttft_s": sum(r.ttft for r in results) / len(results),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.tools.emulator.bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("ttft", help="model TTFT vs cached prefix, per profile")
    streams = sub.add_parser("streams", help="concurrent streams on one emulator process")
    streams.add_argument("--streams", type=int, default=200)
    streams.add_argument("--max-tokens", type=int, default=256)
    streams.add_argument("--prompt-words", type=int, default=150)
    streams.add_argument("--time-scale", type=float, nargs="+", default=[1.0, 0.1, 0.01])
    streams.add_argument("--profile", default="llama3-8b-h100", choices=sorted(PROFILES))
    args = parser.parse_args(argv)
    if args.what == "ttft":
        print_ttft_tables()
        return 0
    print("| time scale | streams ok | tokens | wall s | emulator CPU s | CPU util | "
          "CPU us/token | tokens/s | pace (wall / scaled model) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scale in args.time_scale:
        r = bench_streams(args.streams, args.max_tokens, scale, args.prompt_words,
                          args.profile)
        print(f"| {scale} | {r['ok_streams']}/{r['streams']} | {r['tokens']} | "
              f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['cpu_util']:.0%} | "
              f"{r['cpu_us_per_token']:.1f} | {r['tokens_per_s']:.0f} | {r['pace']:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
