"""Prefill rates corrected from the engines' own /metrics, through the router with emulated engines.

The traffic in these tests goes straight to the engines, never through the router: only the
engines' histograms can tell the router anything, as with traffic from other routers or an
instance the router's beliefs keep it away from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from router.config.model import load_config
from router.gateway.app import create_app
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import EmulatorHandle, start_in_thread
from router.tools.emulator.perf import decode_step_time, get_profile
from router.tools.localrun import profile_timing
from servers import serve_app

TOKEN = "t"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SCALE = 1.0  # model seconds = wall seconds: a 800-token prefill takes ~30 ms, well above HTTP overheads
EMU = EmulatorConfig(model="m", time_scale=SCALE, block_size=16, cache_tokens=262144, max_model_len=8192)
TIMING = profile_timing(get_profile(EMU.profile), SCALE)
TRUE_RATE = TIMING["prefill_tokens_per_s"]  # the emulator's prefill rate, in the router's own cost model
# the router is told everything but the rate, so the rate is what calibration must find
KNOWN = {"attention_s_per_token2": TIMING["attention_s_per_token2"], "request_overhead_s": TIMING["request_overhead_s"]}


@contextmanager
def routed(*emulators: EmulatorConfig, rate: float, **overrides: Any) -> Iterator[tuple[str, list[EmulatorHandle]]]:
    with ExitStack() as stack:
        handles = [stack.enter_context(start_in_thread(c)) for c in emulators]
        policy = {"seed": 1, "ttft": {"prefill_tokens_per_s": rate, **KNOWN}}
        config = load_config(overrides={
            "instances": [{"url": h.url, "name": f"e{i}", "model": "m"} for i, h in enumerate(handles)],
            "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, "policy": policy,
            "engines": {"metrics_interval_s": 0.1}, **overrides})
        yield stack.enter_context(serve_app(create_app(config))), handles


def instance(url: str, name: str) -> dict[str, Any]:
    docs = httpx.get(f"{url}/debug/instances", headers=AUTH).json()["instances"]
    found: dict[str, Any] = next(d for d in docs if d["id"] == name)
    return found


def direct(handle: EmulatorHandle, n: int, tag: str) -> None:
    """``n`` distinct prompts (no prefix-cache hits) sent to the engine itself, one at a time."""
    for i in range(n):
        r = httpx.post(f"{handle.url}/v1/completions", timeout=30,
                       json={"model": "m", "prompt": f"{tag} {i} " + " ".join(f"w{i}x{j}" for j in range(600)),
                             "max_tokens": 2})
        assert r.status_code == 200, r.text


def wait_for_rate(url: str, name: str, low: float, high: float, timeout_s: float = 10.0) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        rate = float(instance(url, name)["prefill_tokens_per_s"])
        if low <= rate <= high:
            return rate
        assert time.monotonic() < deadline, f"rate {rate:.0f} never reached [{low:.0f}, {high:.0f}]"
        time.sleep(0.05)


def generations(handle: EmulatorHandle) -> int:
    return int(httpx.get(f"{handle.url}/emulator/stats").json()["http"]["generation_requests"])


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("wrong", [2.5, 1 / 2.5])
def test_a_wrong_default_rate_converges_to_the_engines_own_without_routed_traffic(flavor: str, wrong: float) -> None:
    with routed(EMU.replace(flavor=flavor), rate=TRUE_RATE * wrong) as (url, (emu,)):
        assert instance(url, "e0")["calibration_factor"] == 1.0
        direct(emu, 8, "bypass")  # four windows of two prefills at most
        # the TTFT form (SGLang) also counts the server's own HTTP and scheduling time: a looser bound
        tolerance = 0.2 if flavor == "vllm" else 0.35
        rate = wait_for_rate(url, "e0", TRUE_RATE * (1 - tolerance), TRUE_RATE * (1 + tolerance))
        assert generations(emu) == 8  # nothing went through the router
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_calibration_factor{engine="e0"}' in metrics
        assert 'pd_router_engine_prefill_tokens_per_s{engine="e0"}' in metrics
        assert abs(rate - TRUE_RATE) < abs(TRUE_RATE * wrong - TRUE_RATE)


def test_without_engine_calibration_the_wrong_rate_stays() -> None:
    with routed(EMU, rate=TRUE_RATE * 2.5, engines={"metrics_interval_s": 0.1, "calibration": {"enabled": False}}) as (
            url, (emu,)):
        direct(emu, 6, "bypass")
        time.sleep(0.5)  # several polls
        assert instance(url, "e0")["calibration_factor"] == 1.0


def test_a_stale_factor_that_kept_an_instance_away_is_remeasured_from_the_engine() -> None:
    # per-instance factors, and no time-based relaxation within the test: only the engine corrects it
    calibration = {"scope": "instance", "stale_after_s": 3600}  # otherwise the defaults (warm-up mean of 8, ...)
    with routed(EMU.replace(max_num_seqs=1), EMU.replace(max_num_seqs=1, engine_id="emu1"), rate=TRUE_RATE,
                calibration=calibration) as (url, handles):
        slow = handles[1]
        httpx.post(f"{slow.url}/emulator/faults", json={"slowdown": 4.0}).raise_for_status()
        direct(slow, 4, "while slow")
        wait_for_rate(url, "e1", 0, TRUE_RATE / 2.5)  # measured slow by the engine alone
        httpx.post(f"{slow.url}/emulator/faults", json={"reset": True}).raise_for_status()

        before = generations(slow)
        for i in range(6):  # one at a time: the idle e0 always looks faster than the "slow" e1
            r = httpx.post(f"{url}/v1/completions", timeout=30,
                           json={"model": "m", "prompt": f"routed {i} " + "tok " * 500, "max_tokens": 2})
            assert r.status_code == 200
        assert generations(slow) == before  # the stale belief keeps the router away from e1

        # someone else's traffic: the engine's histograms measure it (the warm-up mean of 8 first-byte
        # measurements' worth, at 0.5 per prefill, still holds the slow ones, so it takes a few dozen)
        direct(slow, 30, "recovered")
        wait_for_rate(url, "e1", TRUE_RATE * 0.75, TRUE_RATE * 1.25)

        before = generations(slow)
        burst = [threading.Thread(target=httpx.post, args=(f"{url}/v1/completions",), daemon=True, kwargs={
            "timeout": 60, "json": {"model": "m", "prompt": f"burst {i} " + "tok " * 500, "max_tokens": 2}})
            for i in range(8)]
        for t in burst:
            t.start()
        for t in burst:
            t.join(timeout=60)
        assert generations(slow) > before  # e1 gets its share again


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_the_engines_decode_step_is_learned_from_its_inter_token_latency(flavor: str) -> None:
    """Tokens generated on the engine (not through the router) set the step the router prices
    waits for KV room with; a router told not to read it keeps the configured one."""
    step = decode_step_time(get_profile(EMU.profile), 1, 600) * SCALE  # one request decoding alone
    for enabled in (True, False):
        engines = {"metrics_interval_s": 0.1, "decode_step": {"enabled": enabled, "min_window_s": 0.2}}
        with routed(EMU.replace(flavor=flavor), rate=TRUE_RATE, engines=engines) as (url, (emu,)):
            assert instance(url, "e0")["decode_step_s"] is None
            r = httpx.post(f"{emu.url}/v1/completions", timeout=30, json={"model": "m", "prompt": "w " * 500,
                                                                          "max_tokens": 80})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + (10 if enabled else 1)
            while (learned := instance(url, "e0")["decode_step_s"]) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            batch = instance(url, "e0")["decode_step_batch"]
            metrics = httpx.get(f"{url}/metrics").text
        if enabled:
            assert learned == pytest.approx(step, rel=0.15), (learned, step)
            assert batch == pytest.approx(1.0)  # the one request decoding, scraped as it ran
            assert 'pd_router_engine_decode_step_seconds{engine="e0"}' in metrics
        else:
            assert learned is None and "pd_router_engine_decode_step_seconds{" not in metrics
