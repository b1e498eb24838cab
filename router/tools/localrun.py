"""Run a whole emulated deployment on loopback: engine emulators and router processes.

Used by ``pd-router demo`` and the benchmarks. Engines run as subprocesses (real
parallelism on small machines); the router gets a config derived from the engines'
performance profile, scaled to the emulators' ``time_scale`` so that its TTFT estimates
are in the same wall-clock seconds it measures.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import EmulatorProcess, spawn_emulator
from router.tools.emulator.perf import PerfProfile, decode_step_time, get_profile, prefill_time
from router.tools.process import free_port, read_tail, retry_port_race, startup_error, stop_process, wait_ready


@dataclass(frozen=True)
class EngineSpec:
    role: str  # prefill | decode | mixed
    flavor: str = "vllm"


@dataclass
class Engine:
    name: str
    spec: EngineSpec
    process: EmulatorProcess

    @property
    def url(self) -> str:
        return self.process.url


def pd_cluster_spec(prefill: int, decode: int, mixed: int = 0, flavor: str = "vllm") -> list[EngineSpec]:
    return [EngineSpec("prefill", flavor)] * prefill + [EngineSpec("decode", flavor)] * decode + [EngineSpec("mixed", flavor)] * mixed


@contextlib.contextmanager
def emulated_cluster(
    specs: Sequence[EngineSpec], *, profile: str = "llama3-8b-h100", time_scale: float = 0.05, seed: int = 0,
    cache_tokens: int | None = None, kv_events: bool = False,
) -> Iterator[list[Engine]]:
    """Start one emulator process per spec (in parallel); stop them all on exit. With
    ``kv_events`` each publishes its KV events, with a replay socket, on free ports (see
    GET /kv_event_sources)."""
    names = _names(specs)

    def start(i: int) -> EmulatorProcess:
        spec = specs[i]
        config = EmulatorConfig(flavor=spec.flavor, role=spec.role, profile=profile, model="demo-model",  # type: ignore[arg-type]
                                seed=seed + i, time_scale=time_scale, cache_tokens=cache_tokens,
                                bootstrap_port=0, engine_id=names[i], default_max_tokens=32,
                                kv_events_endpoint="tcp://*:0" if kv_events else None,
                                kv_events_replay_endpoint="tcp://*:0" if kv_events else None)
        return spawn_emulator(config)

    engines: list[Engine] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
            futures = [pool.submit(start, i) for i in range(len(specs))]
        failures = []
        for i, future in enumerate(futures):
            try:
                engines.append(Engine(names[i], specs[i], future.result()))
            except Exception as exc:  # noqa: BLE001 - re-raised below once all started ones are kept for cleanup
                failures.append(exc)
        if failures:
            raise failures[0]
        yield engines
    finally:
        for engine in engines:
            engine.process.stop()


def _names(specs: Sequence[EngineSpec]) -> list[str]:
    counts: dict[str, int] = {}
    out = []
    for spec in specs:
        short = {"prefill": "p", "decode": "d", "mixed": "m"}[spec.role]
        out.append(f"{short}{counts.get(short, 0)}")
        counts[short] = counts.get(short, 0) + 1
    return out


def router_config(engines: Sequence[Engine], policy: str, *, profile: str = "llama3-8b-h100", time_scale: float = 0.05,
                  cache_tokens: int | None = None, seed: int = 0, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Router config for ``engines``: roles, flavors, bootstrap ports, and rates taken from
    the performance profile, expressed in wall-clock seconds at ``time_scale``."""
    prof = get_profile(profile)
    timing = profile_timing(prof, time_scale)
    cache = cache_tokens or prof.default_cache_tokens
    instances = []
    for e in engines:
        inst: dict[str, Any] = {"url": e.url, "name": e.name, "role": e.spec.role, "flavor": e.spec.flavor,
                                "model": "demo-model", "cache_tokens": cache, "labels": {"zone": "z1"},
                                "prefill_tokens_per_s": timing["prefill_tokens_per_s"],
                                "kv_bytes_per_token": prof.kv_bytes_per_token}
        if e.spec.role == "prefill" and e.spec.flavor == "sglang":
            inst["bootstrap_port"] = e.process.bootstrap_port
        instances.append(inst)
    config: dict[str, Any] = {
        "instances": instances,
        "policy": {"name": policy, "seed": seed, "ttft": {
            "prefill_tokens_per_s": timing["prefill_tokens_per_s"],
            "attention_s_per_token2": timing["attention_s_per_token2"],
            "request_overhead_s": timing["request_overhead_s"],
            "decode_interference_s": timing["decode_step_per_request_s"],
            "decode_step_s": timing["decode_step_base_s"],
        }},
        "pd": {
            "kv_bytes_per_token": prof.kv_bytes_per_token,
            "links": {"same_zone_gbps": prof.link_gbps / time_scale, "setup_s": 0.0005 * time_scale},
            "decode_step_base_s": timing["decode_step_base_s"],
            "decode_step_per_request_s": timing["decode_step_per_request_s"],
            "decode_step_per_kv_token_s": timing["decode_step_per_kv_token_s"],
            "tbt_target_s": 0.1 * time_scale,
        },
        "health": {"interval_s": 2.0},
    }
    for key, value in (extra or {}).items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def profile_timing(prof: PerfProfile, time_scale: float) -> dict[str, float]:
    """Fit the router's TTFT model to a performance profile: t(n) = c + n/r + b·n²/2."""
    c = prof.step_overhead_s
    n1, n2 = 2048, 16384
    t1, t2 = prefill_time(prof, n1) - c, prefill_time(prof, n2) - c
    # two equations t = n/r + b n^2/2 -> solve for 1/r and b
    b = 2 * (t2 / n2 - t1 / n1) / (n2 - n1)
    inv_r = t1 / n1 - b * n1 / 2
    base = decode_step_time(prof, 1, 0)
    return {
        "prefill_tokens_per_s": 1.0 / (inv_r * time_scale),
        "attention_s_per_token2": max(0.0, b) * time_scale,
        "request_overhead_s": c * time_scale,
        "decode_step_base_s": base * time_scale,
        "decode_step_per_request_s": max(0.0, (decode_step_time(prof, 65, 0) - base) / 64) * time_scale,
        "decode_step_per_kv_token_s": max(0.0, (decode_step_time(prof, 1, 200_000) - base) / 200_000) * time_scale,
    }


@dataclass
class RouterProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_path: str

    def stop(self) -> None:
        stop_process(self.process)
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)


@contextlib.contextmanager
def router_process(config: dict[str, Any], ready_timeout: float = 30.0, args: Sequence[str] = (),
                   source: str | None = None) -> Iterator[RouterProcess]:
    """``pd-router serve`` as a subprocess on a free loopback port, until /ready answers 200;
    with ``source``, the ``router`` package of that directory (another checkout) instead of ours."""
    fd, config_path = tempfile.mkstemp(prefix="pd-router-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(config, fh)
        handle = retry_port_race(lambda: _start_router(config_path, ready_timeout, args, source))
        try:
            yield handle
        finally:
            handle.stop()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(config_path)


def _start_router(config_path: str, ready_timeout: float, args: Sequence[str], source: str | None) -> RouterProcess:
    log_fd, log_path = tempfile.mkstemp(prefix="pd-router-", suffix=".log")
    port = free_port("127.0.0.1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PD_ROUTER_")}
    if source is not None:  # ``python -m router`` resolves the package from the working directory first
        env["PYTHONPATH"] = source
    with os.fdopen(log_fd, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "router", "serve", "--config", config_path, "--port", str(port),
                                 "--log-level", "warning", *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=source)
    handle = RouterProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        with httpx.Client(timeout=1.0, trust_env=False) as client:

            def ready() -> bool:
                try:
                    return client.get(handle.url + "/ready").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_ready(ready, proc, ready_timeout,
                       lambda why: startup_error("router", why, read_tail(log_path, 2000)), interval=0.1)
    except BaseException:
        handle.stop()
        raise
    return handle


def engine_stats(engines: Sequence[Engine]) -> dict[str, dict[str, Any]]:
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        return {e.name: client.get(e.url + "/emulator/stats", params={"recent": 0}).json() for e in engines}


def reset_engines(engines: Sequence[Engine]) -> None:
    """Empty every engine's prefix cache, so each measured run starts cold."""
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        for e in engines:
            client.post(e.url + "/emulator/reset_prefix_cache").raise_for_status()
