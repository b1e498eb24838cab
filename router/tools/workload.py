"""Shared-prefix chat requests (``router.tools.shared_prefix``) and a closed-loop HTTP
driver that measures TTFT, for the demo and the PD benchmark."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from router.tools.shared_prefix import SharedPrefix


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """``requests`` streaming chat requests over a seeded shared-prefix mix, drawn at random.

    Each user message starts with the request's index, so only the tenant's system prompt is
    shared between requests, never a whole prompt.
    """

    groups: int = 6
    users: int = 4
    system_tokens: int = 1250
    question_tokens: int = 90
    max_tokens: int = 24
    requests: int = 120
    seed: int = 0
    model: str = "demo-model"

    @property
    def prompts(self) -> SharedPrefix:
        return SharedPrefix(self.groups, self.users, self.system_tokens, self.question_tokens, self.seed)

    def bodies(self) -> list[dict[str, Any]]:
        """The request bodies, in arrival order (deterministic for a seed)."""
        texts = self.prompts.texts()
        picks = self.prompts.picks()
        return [{"model": self.model, "messages": texts.messages(next(picks), note=f"[{i}] "),
                 "max_tokens": self.max_tokens, "stream": True}
                for i in range(self.requests)]


@dataclass
class RunResult:
    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def percentile(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.ttft_s) if self.ttft_s else float("nan")

    @property
    def ttft_p90(self) -> float:
        return self.percentile(self.ttft_s, 0.9)


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], result: RunResult) -> None:
    started = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                raise RuntimeError(f"HTTP {resp.status_code}: {text[:200]}")
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error']}")
                if first is None:
                    first = time.perf_counter() - started
            if not done:
                raise RuntimeError("stream ended without [DONE]")
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        result.errors += 1
        if len(result.error_samples) < 3:
            result.error_samples.append(str(exc)[:200])
        return
    result.ttft_s.append(first if first is not None else time.perf_counter() - started)
    result.latency_s.append(time.perf_counter() - started)


async def drive(router_url: str, bodies: list[dict[str, Any]], concurrency: int,
                progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Send ``bodies`` through ``router_url`` with ``concurrency`` closed-loop clients."""
    result = RunResult()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:

        async def worker() -> None:
            nonlocal done
            while True:
                try:
                    body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await _one(client, router_url + "/v1/chat/completions", body, result)
                done += 1
                if progress is not None:
                    progress(done, len(bodies))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    return result
