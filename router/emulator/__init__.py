"""GPU-free emulator of vLLM / SGLang engines for end-to-end router tests.

Public entry points (imported lazily so ``pd-router`` starts fast):

* ``EmulatorConfig`` / ``FaultConfig``: what to emulate.
* ``build_app(config)``: the ASGI app of one engine.
* ``start_in_thread(config) -> EmulatorHandle``, ``serve_emulator(config)``
  (async context manager), ``spawn_emulator(config) -> EmulatorProcess``.
* ``build_engine(config)``, ``Engine``, ``EngineRequest``, ``run_virtual``:
  the clock-free engine model for virtual-time replay.
"""

from __future__ import annotations

import importlib
from typing import Any

from router.emulator.config import EmulatorConfig, FaultConfig

_LAZY = {
    "build_app": "router.emulator.server",
    "EmulatorHandle": "router.emulator.launch",
    "EmulatorProcess": "router.emulator.launch",
    "start_in_thread": "router.emulator.launch",
    "serve_emulator": "router.emulator.launch",
    "spawn_emulator": "router.emulator.launch",
    "free_port": "router.emulator.launch",
    "build_engine": "router.emulator.build",
    "Engine": "router.emulator.engine",
    "EngineConfig": "router.emulator.engine",
    "EngineRequest": "router.emulator.request",
    "run_virtual": "router.emulator.vclock",
    "PROFILES": "router.emulator.perf",
    "get_profile": "router.emulator.perf",
    "Tokenizer": "router.emulator.tokenizer",
}

__all__ = ["EmulatorConfig", "FaultConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'router.emulator' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
