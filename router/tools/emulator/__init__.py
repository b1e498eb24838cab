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

from router.tools.emulator.config import EmulatorConfig, FaultConfig

_LAZY = {
    "build_app": "router.tools.emulator.server",
    "EmulatorHandle": "router.tools.emulator.launch",
    "EmulatorProcess": "router.tools.emulator.launch",
    "start_in_thread": "router.tools.emulator.launch",
    "serve_emulator": "router.tools.emulator.launch",
    "spawn_emulator": "router.tools.emulator.launch",
    "free_port": "router.tools.process",
    "build_engine": "router.tools.emulator.build",
    "Engine": "router.tools.emulator.engine",
    "EngineConfig": "router.tools.emulator.engine",
    "EngineRequest": "router.tools.emulator.request",
    "run_virtual": "router.tools.emulator.vclock",
    "PROFILES": "router.tools.emulator.perf",
    "get_profile": "router.tools.emulator.perf",
    "Tokenizer": "router.tools.emulator.tokenizer",
}

__all__ = ["EmulatorConfig", "FaultConfig", *_LAZY]  # noqa: PLE0604 (the lazy names are strings)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'router.tools.emulator' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
