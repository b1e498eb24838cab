"""Fixtures for the fault tests: in-thread emulators and a router in front of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from router.config.model import load_config
from router.gateway.app import create_app
from router.tools.emulator import EmulatorConfig
from router.tools.emulator.launch import EmulatorHandle, start_in_thread
from router.tools.emulator.store_server import StoreConfig, StoreHandle, start_store_in_thread
from servers import serve_app

TOKEN = "s3cret"


@pytest.fixture
def emulators() -> Iterator[Callable[..., EmulatorHandle]]:
    """``emulators(**EmulatorConfig fields) -> handle``; all stopped at teardown."""
    handles: list[EmulatorHandle] = []

    def start(**fields: Any) -> EmulatorHandle:
        fields.setdefault("time_scale", 0.01)
        fields.setdefault("model", "m")
        handle = start_in_thread(EmulatorConfig(**fields))
        handles.append(handle)
        return handle

    yield start
    for handle in reversed(handles):
        handle.stop()


@contextmanager
def router(instances: list[dict[str, Any]], **overrides: Any) -> Iterator[tuple[str, Any]]:
    """A router (its own uvicorn thread) in front of ``instances``; yields (url, app)."""
    config = load_config(overrides={
        "instances": instances,
        "policy": {"name": "ttft", "seed": 1},
        "server": {"admin_token": TOKEN},
        "health": {"interval_s": 60, **overrides.pop("health", {})},
        **overrides,
    })
    app = create_app(config)
    with ExitStack() as stack:
        yield stack.enter_context(serve_app(app)), app


@pytest.fixture
def kv_store() -> Iterator[StoreHandle]:
    """A shared KV store server (the emulator's), fast enough to stay out of the way."""
    with start_store_in_thread(StoreConfig(time_scale=0.01)) as store:
        yield store


def stats(url: str) -> dict[str, Any]:
    """An emulator's /emulator/stats with its 50 most recent requests."""
    return httpx.get(f"{url}/emulator/stats", params={"recent": 50}).json()
