"""Constants and small helpers shared by the real-vLLM fixtures and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.config.model import RouterConfig, load_config
from router.tools.realvllm import VllmEngine

TOKEN = "real"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NUM_BLOCKS = 64  # x 128 tokens: small enough that a handful of long prompts evicts
BLOCK = 128  # the CPU build's KV block size
# Sent straight to engine 0 before the precise router starts: the router can know it only by
# resyncing from the engine's replay buffer.
BEFORE_ROUTER = ("Tenant 9 handbook, cached before the router started: returns, refunds and exchanges "
                 "are handled by the desk within thirty days of delivery. ") * 12


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def total(client: httpx.Client, engine: VllmEngine, name: str, **labels: str) -> float:
    found = series(client.get(f"{engine.url}/metrics").text, name)
    return sum(v for lab, v in found if all(lab.get(k) == want for k, want in labels.items()))


def precise_config(engines: list[VllmEngine], tiny_model: Path, **kv_events: Any) -> RouterConfig:
    """A token-mode router (the model's own tokenizer.json, the engines' 128-token blocks)
    reading both engines' KV events, found through their ``/kv_event_sources``;
    ``kv_events`` adds to that section (``sidecar=True``)."""
    return load_config(overrides={
        "instances": [{"url": e.url, "name": f"vllm{i}"} for i, e in enumerate(engines)],
        "server": {"admin_token": TOKEN},
        "health": {"interval_s": 2},
        "engines": {"metrics_interval_s": 0.5},
        "policy": {"seed": 1},
        "hashing": {"mode": "tokens", "tokens": {"source": "file", "path": str(tiny_model / "tokenizer.json"),
                                                 "block_size": 128}},
        "kv_events": {"enabled": True, "discover_interval_s": 1, **kv_events},
    })
