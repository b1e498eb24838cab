"""``pd-router emulate`` / ``python -m router.tools.emulator`` start real servers."""

from __future__ import annotations

import subprocess
import sys

import httpx

from router.cli import build_parser
from router.tools.emulator import EmulatorConfig, FaultConfig
from router.tools.emulator.flags import config_from_args, config_to_argv
from router.tools.emulator.launch import spawn_emulator
from router.tools.process import free_port


def test_argv_round_trip() -> None:
    config = EmulatorConfig(flavor="sglang", role="prefill", profile="llama3-70b-h100x4",
                            model="m", port=1234, seed=9, time_scale=0.25, cache_tokens=4096,
                            max_batched_tokens=2048, kv_bandwidth_gbps=50.0,
                            pd_fallback="recompute", bootstrap_port=0,
                            faults=FaultConfig(error_rate=0.5, die_after_tokens=4,
                                               stall_seconds=2.0, crash_on_request=True))
    args = build_parser().parse_args(["emulate", *config_to_argv(config)])
    assert args.func is not None
    assert config_from_args(args) == config


def test_emulate_subprocess_answers_health() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "emulate", "--port", str(port),
         "--flavor", "sglang", "--role", "mixed", "--time-scale", "0.01"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(trust_env=False, timeout=1.0) as client:
            for _ in range(300):
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                subprocess.run(["sleep", "0.05"], check=True)
            else:
                raise AssertionError("emulator never became healthy")
            info = client.get(f"http://127.0.0.1:{port}/server_info").json()
            assert info["port"] == port
    finally:
        proc.terminate()
        assert proc.wait(10) in (0, -15)  # uvicorn re-raises SIGTERM after a clean stop


def test_spawn_helper_runs_python_m(client: httpx.Client) -> None:
    with spawn_emulator(EmulatorConfig(time_scale=0.01, model="sub")) as proc:
        resp = client.post(f"{proc.url}/v1/completions",
                           json={"model": "sub", "prompt": "hello", "max_tokens": 2})
        assert resp.status_code == 200
    assert not proc.alive()


def test_stall_seconds_alone_stalls_everything() -> None:
    args = build_parser().parse_args(["emulate", "--fault-stall-seconds", "3"])
    faults = config_from_args(args).faults
    assert faults.stall_rate == 1.0 and faults.stall_seconds == 3.0
