"""Constants and small helpers shared by the real-vLLM fixtures and tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
