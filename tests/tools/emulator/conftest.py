"""Fixtures: in-thread emulators on free ports, stopped by the test that made them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from router.tools.emulator import EmulatorConfig
from router.tools.emulator.launch import EmulatorHandle, start_in_thread

FAST = 0.01
"""Time scale for HTTP tests: 100x faster than the modelled GPU."""

StartFn = Callable[..., EmulatorHandle]


@pytest.fixture
def start_emulator() -> Iterator[StartFn]:
    """``start_emulator(**config_fields) -> handle``; all stopped at teardown."""
    handles: list[EmulatorHandle] = []

    def start(**fields: object) -> EmulatorHandle:
        fields.setdefault("time_scale", FAST)
        handle = start_in_thread(EmulatorConfig(**fields))  # type: ignore[arg-type]
        handles.append(handle)
        return handle

    yield start
    for handle in reversed(handles):
        handle.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30.0) as c:
        yield c

