"""``store_bench.py migrate``: time from a decode instance's death mid-stream to the next token.

Live: emulated vLLM engines (1 prefill, 2 decode; each decode drops every stream after
``DIE_AFTER`` tokens, so every session breaks once and goes on on the other decode instance for
the rest of its budget) behind a ``pd-router serve`` subprocess; with a shared store (engines
``--kv-store-url``, router ``kv_store.enabled``) and without; without, once with the prefill
instance still caching the prompt (the continuation's prefill there computes only the generated
tokens, then the KV crosses the PD link) and once with that copy evicted as the session starts
(a true re-prefill). Per session, at the client: the gap between the last token before the break
and the first after it (failure -> next token), the mean gap between the other tokens (TBT), the
TTFT of the same prompt sent again (fully cached on an instance) and, with the store, its TTFT on
an engine that never saw it (a probe that loads it all from the store). With a standby
(``kv_store.standby``), the session's backup decode instance loads the prompt from the store once
the first token arrived; its cost is read from the engines: the warm's tokens brought into a
backup's cache (KV room, against what the serving instance holds for the session) and the prompt
tokens computed and loaded over the whole cluster during the sessions, against the same cluster
without a standby. ``--flavor sglang``: the same with emulated SGLang engines (bootstrap protocol);
a decode worker cannot serve alone, so the continuation goes through a pair again (the one prefill
with the other decode worker): the prefill holds the prompt unless evicted, loads what it lacks
from the store (with one) or computes it, and the whole KV crosses the PD link to the new decode
worker; with a standby, the session's prefill hands the prompt's KV to the backup decode worker
once the first token arrived, and the continuation moves only the generated tail. The engines run
``--time-scale`` times slower than the modelled GPU and every figure is divided by it (model
milliseconds): the CPU the emulators, the router and the client spend per request (tokenising an
8K-token prompt takes tens of wall milliseconds on a loaded 2-core machine) then weighs 1/scale.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from loadtests.report import table, write_section
from router.tools.emulator import EmulatorConfig, FaultConfig
from router.tools.emulator.launch import spawn_emulator
from router.tools.localrun import router_process
from router.tools.process import free_port, stop_process

DIE_AFTER = 64
MAX_TOKENS = 96
STORE_GBPS = 200.0  # the profile's PD link: the store path and the PD path move bytes equally fast
WORDS = ("cache", "block", "token", "route", "store", "load", "page", "layer", "query", "key", "value", "batch")


def _prompt(i: int, n: int, rng: random.Random) -> str:
    return f"Session {i}: " + " ".join(rng.choice(WORDS) for _ in range(n))


@contextlib.contextmanager
def _store_server(scale: float) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "router.tools.emulator.store_server", "--port", str(port),
                             "--gbps", str(STORE_GBPS), "--time-scale", str(scale)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the KV store did not start")
            time.sleep(0.05)
        yield url
    finally:
        stop_process(proc)


@contextlib.contextmanager
def _cluster(store: bool, scale: float, dtype: str, standby: bool,
             flavor: str) -> Iterator[tuple[str, dict[str, str], str | None]]:
    """(router url, engine name -> url, probe engine url with the store or None)."""
    with contextlib.ExitStack() as stack:
        store_url = stack.enter_context(_store_server(scale)) if store else None
        base: dict[str, Any] = {"flavor": flavor, "time_scale": scale, "model": "m", "kv_store_url": store_url,
                                "kv_store_write_blocks": 1, "kv_dtype": dtype, "bootstrap_port": 0}
        engines = {"p0": stack.enter_context(spawn_emulator(EmulatorConfig(role="prefill", **base)))}
        for name in ("d0", "d1"):
            engines[name] = stack.enter_context(spawn_emulator(EmulatorConfig(
                role="decode", faults=FaultConfig(die_after_tokens=DIE_AFTER), **base)))
        probe = stack.enter_context(spawn_emulator(EmulatorConfig(role="mixed", **base))) if store else None
        instances: list[dict[str, Any]] = [{"url": e.url, "name": n, "role": "prefill" if n == "p0" else "decode",
                                            "flavor": flavor, "model": "m"} for n, e in engines.items()]
        if flavor == "sglang":
            instances[0]["bootstrap_port"] = engines["p0"].bootstrap_port
        config = {"instances": instances,
                  "policy": {"name": "ttft", "seed": 1}, "health": {"interval_s": 60},
                  "proxy": {"first_byte_timeout_s": 60 * scale, "idle_timeout_s": 60 * scale},
                  "kv_store": {"enabled": store, "bandwidth_gbps": STORE_GBPS, "kv_dtype": dtype,
                               "standby": {"enabled": standby, "min_prompt_tokens": 1024}}}
        router = stack.enter_context(router_process(config))
        yield router.url, {n: e.url for n, e in engines.items()}, probe.url if probe is not None else None


def _stream(url: str, prompt: str, max_tokens: int, on_first: str | None = None) -> tuple[list[float], bool]:
    """Arrival times (from the send) of each token event, and whether [DONE] came; ``on_first``:
    an engine whose prefix cache is reset as the first token arrives."""
    times: list[float] = []
    done = False
    started = time.perf_counter()
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if any(c.get("text") for c in event.get("choices") or ()):
                    times.append(time.perf_counter() - started)
                    if on_first is not None and len(times) == 1:
                        httpx.post(on_first + "/reset_prefix_cache", timeout=10)
    return times, done


def _work(engines: dict[str, str]) -> tuple[int, int]:
    """(prompt tokens computed, prompt tokens loaded from the store) over ``engines`` so far."""
    computed = loaded = 0
    for url in engines.values():
        s = httpx.get(url + "/emulator/stats", timeout=10).json()
        computed += s["tokens"]["prefill_computed"]
        loaded += s["store"]["loaded_tokens_admitted"]
    return computed, loaded


def _warm_tokens(engines: dict[str, str]) -> int:
    """Prompt tokens of the standby warms the decode engines finished (what they hold for them)."""
    total = 0
    for name, url in engines.items():
        if name != "p0":
            recent = httpx.get(url + "/emulator/stats", params={"recent": 1000}, timeout=10).json()["recent"]
            total += sum(r["prompt_tokens"] for r in recent if (r["client_request_id"] or "").endswith("-standby"))
    return total


def _measure(store: bool, evict: bool, dtype: str, standby: bool, rounds: int, prompt_tokens: int,
             scale: float, flavor: str) -> dict[str, float]:
    rng = random.Random(12)
    gaps, tbts, cached, loaded = [], [], [], []
    computed_work = loaded_work = 0
    with _cluster(store, scale, dtype, standby, flavor) as (url, engines, probe):
        _stream(url, _prompt(-1, 200, rng), 4)  # warm the connections
        for i in range(rounds):
            prompt = _prompt(i, prompt_tokens, rng)
            before = _work(engines)
            times, done = _stream(url, prompt, MAX_TOKENS, engines["p0"] if evict else None)
            after = _work(engines)
            computed_work += after[0] - before[0]
            loaded_work += after[1] - before[1]
            if not done or len(times) != MAX_TOKENS:
                raise RuntimeError(f"session {i} did not complete unbroken: {len(times)} tokens, done={done}")
            gap = times[DIE_AFTER] - times[DIE_AFTER - 1]
            gaps.append(gap)
            tbts.append((times[-1] - times[0] - gap) / (len(times) - 2))  # tokens arrive in bursts under load
            cached.append(_stream(url, prompt, 2)[0][0])
            if probe is not None:
                loaded.append(_stream(probe, prompt, 2)[0][0])
        warm = _warm_tokens(engines) if standby else 0
    out = {"gap_p50_s": statistics.median(gaps), "gap_max_s": max(gaps), "tbt_p50_s": statistics.median(tbts),
           "cached_ttft_p50_s": statistics.median(cached)}
    if loaded:
        out["store_ttft_p50_s"] = statistics.median(loaded)
    out = {k: v / scale for k, v in out.items()}
    # what one session held on its serving decode instance: prompt + generated tokens
    out.update(computed=computed_work / rounds, loaded=loaded_work / rounds, warm=warm / rounds,
               session_kv=float(prompt_tokens + MAX_TOKENS))
    return out


VARIANTS = {"store": (True, False, "auto", False), "store + standby": (True, False, "auto", True),
            "store, fp8 KV": (True, False, "fp8", False), "store, fp8 KV + standby": (True, False, "fp8", True),
            "store, prefill's copy evicted": (True, True, "auto", False),
            "no store": (False, False, "auto", False), "no store, prefill's copy evicted": (False, True, "auto", False)}
# what --flavor measures by default: the vLLM set as published before
DEFAULT_VARIANTS = {"vllm": [v for v in VARIANTS if v != "store, prefill's copy evicted"],
                    "sglang": ["store", "store + standby", "store, prefill's copy evicted", "no store",
                               "no store, prefill's copy evicted"]}


def run_migrate(args: argparse.Namespace) -> int:
    for prompt_tokens in args.prompt_tokens:
        load = os.getloadavg()
        results = {label: _measure(*VARIANTS[label], args.rounds, prompt_tokens, args.time_scale, args.flavor)
                   for label in args.variants}
        end = os.getloadavg()
        body = _report(results, args, prompt_tokens, load[0], end[0])
        print(body, flush=True)
        if args.write:
            variants = "" if list(args.variants) == DEFAULT_VARIANTS[args.flavor] else " --variants " + " ".join(
                f"'{v}'" for v in args.variants)
            sglang = args.flavor == "sglang"
            title = f"Session migration{', SGLang PD pools' if sglang else ''}: failure to next token, {prompt_tokens}-token prompts"
            if args.section:
                title = f"{args.section} ({prompt_tokens}-token prompts)"
                variants += f" --section {shlex.quote(args.section)}"
            write_section(title, f"flock /work/scratch/bench.lock python loadtests/store_bench.py migrate --write "
                          f"{'--flavor sglang ' if sglang else ''}--rounds {args.rounds} --prompt-tokens {prompt_tokens} "
                          f"--time-scale {args.time_scale:g}{variants}", body)
    return 0


def _report(results: dict[str, dict[str, float]], args: argparse.Namespace, prompt_tokens: int, load: float,
            end: float) -> str:
    ms = lambda x: f"{x * 1000:.1f}"  # noqa: E731

    def cost(label: str) -> list[str]:
        r = results[label]
        base = results.get(label.replace(" + standby", ""))
        if not label.endswith("+ standby") or base is None:
            return ["-", "-", "-"]
        room = f"{r['warm'] / r['session_kv']:.2f}"
        dc = f"{(r['computed'] - base['computed']) / max(base['computed'], 1):+.1%}"
        dl = f"{(r['loaded'] - base['loaded']) / max(base['loaded'], 1):+.0%}"
        return [room, dc, dl]

    rows = [[label, ms(r["gap_p50_s"]), ms(r["gap_max_s"]), ms(r["tbt_p50_s"]), ms(r["cached_ttft_p50_s"]),
             ms(r["store_ttft_p50_s"]) if "store_ttft_p50_s" in r else "-",
             f"**{r['gap_p50_s'] / r['cached_ttft_p50_s']:.2f}**", *cost(label)] for label, r in results.items()]
    headers = ["cluster", "failure -> next token p50 ms", "max ms", "TBT mean ms", "TTFT fully cached p50 ms",
               "TTFT all from the store p50 ms", "gap / cached TTFT (target <= 2)",
               "standby KV room / session's KV", "prompt tokens computed vs no standby",
               "tokens loaded from the store vs no standby"]
    body = table(headers, rows)
    body += (
        f"\n\n{args.rounds} sessions of ~{prompt_tokens} prompt tokens, {MAX_TOKENS} tokens each; every decode "
        f"instance drops each stream after {DIE_AFTER} tokens and the router continues it on the other one. "
        f"1 prefill + 2 decode emulated {'SGLang' if args.flavor == 'sglang' else 'vLLM'} llama3-8b-h100 engines at time scale {args.time_scale:g} (figures in "
        f"model ms: wall / scale), store {STORE_GBPS:g} Gbit/s; load average {load:.1f} at the start, "
        f"{end:.1f} at the end. The floor of a load at failure time: ~{prompt_tokens + DIE_AFTER} tokens x 128 KiB "
        f"at {STORE_GBPS:g} Gbit/s = {(prompt_tokens + DIE_AFTER) * 131072 * 8 / (STORE_GBPS * 1e9) * 1000:.1f} ms "
        f"(half that in fp8). ")
    if args.flavor == "sglang":
        body += (
            "SGLang: a decode worker serves only paired with a prefill, so the continuation goes through the "
            "prefill again with the other decode worker; the prefill holds the prompt in its prefix cache (unless "
            "evicted: its cache is reset as the session's first token arrives), loads what it lacks from the store "
            "or computes it, and the whole prompt + generated KV crosses the PD link to the new decode worker "
            "(the emulated decode keeps transferred KV in a prefix cache, as SGLang's with "
            "--disaggregation-decode-enable-radix-cache). The fully cached TTFT is the same PD route: "
            "prefill from cache plus the transfer. Standby: the session's prefill hands the prompt's KV to the "
            "backup decode worker once the first token arrived (a paired warm, max_tokens 1), and the "
            "continuation moves only the generated tail; its cost is counted as for vLLM below.\n")
    body += (
        "Standby (`kv_store.standby`, min_prompt_tokens 1024): the backup decode instance "
        "loads the prompt once the first token arrived, and the continuation there loads only the generated "
        "tail. Its cost, per long session whether it fails or not: KV room = the warm's prompt tokens held in "
        "the backup's cache over the session's own prompt + output on its serving instance; computed and "
        "loaded = prompt tokens over the whole cluster during the sessions against the same cluster without a "
        "standby (every session here fails once, so the loaded column nets the warm against the continuation's "
        "smaller load; for a session that never fails, the warm adds a whole prompt's load from the store).\n")
    return body
