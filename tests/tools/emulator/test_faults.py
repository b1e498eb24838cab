"""Every fault mode is visible from a client."""

from __future__ import annotations

import time

import httpx
import pytest

from router.tools.emulator import EmulatorConfig, FaultConfig
from router.tools.emulator.faults import CRASH_EXIT_CODE
from router.tools.emulator.launch import spawn_emulator

from .conftest import StartFn

BODY = {"prompt": "faults are features in an emulator " * 4, "max_tokens": 20}


def test_error_rate_returns_503(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(faults=FaultConfig(error_rate=1.0))
    resp = client.post(f"{emu.url}/v1/completions", json=BODY)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
    client.post(f"{emu.url}/emulator/faults", json={"error_rate": 0.5})
    codes = [client.post(f"{emu.url}/v1/completions", json={**BODY, "max_tokens": 1})
             .status_code for _ in range(40)]
    assert 5 <= codes.count(503) <= 35 and codes.count(200) == 40 - codes.count(503)


def test_stall_hangs_then_answers(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(faults=FaultConfig(stall_rate=1.0, stall_seconds=0.6))
    t0 = time.monotonic()
    resp = client.post(f"{emu.url}/v1/completions", json={**BODY, "max_tokens": 1})
    assert resp.status_code == 200 and time.monotonic() - t0 >= 0.55
    client.post(f"{emu.url}/emulator/faults", json={"stall_seconds": 0.0})  # forever
    with pytest.raises(httpx.ReadTimeout):
        client.post(f"{emu.url}/v1/completions", json=BODY, timeout=0.5)
    client.post(f"{emu.url}/emulator/faults", json={"reset": True})
    assert client.post(f"{emu.url}/v1/completions", json=BODY).status_code == 200


def test_die_after_tokens_drops_stream_and_body(start_emulator: StartFn,
                                                client: httpx.Client) -> None:
    emu = start_emulator(faults=FaultConfig(die_after_tokens=3))
    received = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", f"{emu.url}/v1/completions",
                           json={**BODY, "stream": True}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    received.append(line)
    assert len(received) == 3 and not any("[DONE]" in r for r in received)
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(f"{emu.url}/v1/completions", json=BODY)
    stats = client.get(f"{emu.url}/emulator/stats").json()
    assert stats["http"]["injected_drops"] == 2
    assert stats["requests"]["running"] == 0 and stats["kv"]["used_blocks"] == 0


def test_slowdown_factor(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(time_scale=0.05)
    body = {**BODY, "max_tokens": 60}

    def timed() -> float:
        t0 = time.monotonic()
        assert client.post(f"{emu.url}/v1/completions", json=body).status_code == 200
        return time.monotonic() - t0

    base = min(timed() for _ in range(3))  # a host stall only lengthens a run: the least is the engine
    client.post(f"{emu.url}/emulator/faults", json={"slowdown": 6.0})
    slow = timed()
    assert slow > 2 * base, (base, slow)  # steps 6x slower; HTTP and loop overhead do not scale
    bad = client.post(f"{emu.url}/emulator/faults", json={"slowdown": -1})
    assert bad.status_code == 400


def test_unhealthy_flag(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    client.post(f"{emu.url}/emulator/faults", json={"unhealthy": True})
    assert client.get(f"{emu.url}/health").status_code == 503
    bad = client.post(f"{emu.url}/emulator/faults", json={"no_such_fault": 1})
    assert bad.status_code == 400


def test_crash_kills_the_process(client: httpx.Client) -> None:
    proc = spawn_emulator(EmulatorConfig(time_scale=0.01))
    try:
        assert client.post(f"{proc.url}/v1/completions", json=BODY).status_code == 200
        client.post(f"{proc.url}/emulator/faults", json={"crash_on_request": True})
        with pytest.raises(httpx.TransportError):
            client.post(f"{proc.url}/v1/completions", json=BODY)
        assert proc.process.wait(10) == CRASH_EXIT_CODE
        with pytest.raises(httpx.ConnectError):
            client.get(f"{proc.url}/health")
    finally:
        proc.stop()
