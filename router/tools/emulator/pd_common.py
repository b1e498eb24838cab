"""Shared pieces of both PD handoff protocols.

A request's PD role ("leg") hooks into the generation handler at three
points: ``prepare`` before the engine sees it (pair with the peer, pull KV),
``finalize`` after it finished (publish KV, notify the peer; returns extra
top-level response fields) and ``abort`` when it dies halfway. Failures are
never silent: they raise an HTTP error or, with ``--pd-fallback recompute``,
fall back to local prefill and count it.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections.abc import Sequence
from typing import Protocol

import xxhash

from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.engine import Engine
from router.tools.emulator.openai_schema import ApiError
from router.tools.emulator.links import AsyncLink
from router.tools.emulator.perf import PerfProfile
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.stats import StatsRecorder

log = logging.getLogger(__name__)


def overlap_tail_bytes(total: float, last_chunk: float, streamed: float) -> float:
    """Bytes still to move after the prefill ended when ``streamed`` bytes could go while it
    ran: at least the last chunk's (computed last, sent after), at most all of them."""
    return min(total, max(last_chunk, total - streamed))


class PdFailure(Exception):
    """The peer or its KV could not be reached; becomes 502/504 or a fallback."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


def prompt_digest(prompt: Sequence[int]) -> str:
    """Fingerprint both legs compare, so a router mixing up prompts is caught."""
    return xxhash.xxh3_64_hexdigest(array("q", prompt).tobytes())


class PdHost(Protocol):
    """What every leg needs of the engine it runs on; the emulator's runtime provides it.

    A protocol rather than the runtime class because the runtime owns the protocols'
    listeners (bootstrap server, KV holds), which live in the leg modules: the legs must
    not import it back. Each protocol module extends this with what only it needs.
    """

    @property
    def config(self) -> EmulatorConfig: ...
    @property
    def profile(self) -> PerfProfile: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def engine_id(self) -> str: ...
    @property
    def kv_bandwidth_gbps(self) -> float: ...
    @property
    def kv_bytes_per_token(self) -> int: ...
    @property
    def kv_link(self) -> AsyncLink: ...
    @property
    def stats(self) -> StatsRecorder: ...

    def sleep_scale(self) -> float:
        """Wall seconds per model second (time scale x slowdown fault)."""
        ...


class Leg:
    """No PD: a plain request. Subclasses implement one protocol side."""

    name = "none"

    def __init__(self, runtime: PdHost) -> None:
        self.rt = runtime
        self.headers: dict[str, str] = {}

    async def prepare(self, requests: list[EngineRequest]) -> None:
        """Runs before the requests are submitted to the engine."""

    async def finalize(self, requests: list[EngineRequest]) -> dict[str, object]:
        """Runs after every request finished; returns extra response fields."""
        return {}

    def abort(self, requests: list[EngineRequest]) -> None:
        """Runs (synchronously) when the response fails or the client leaves."""

    async def receive_kv(self, request: EngineRequest, local_hit: int,
                         overlapped_s: float = 0.0) -> None:
        """Move the KV D lacks over D's NIC (shared with every other transfer in flight
        on it), then mark the prompt KV as present.

        All prompt tokens but the last arrive; the decode computes that last
        token itself so its first output comes from a real forward pass.
        ``overlapped_s`` is model time the sender already streamed during its prefill
        (SGLang): bytes that fit in it at the nominal link rate are already here, but
        never the last chunk's (``overlap_tail_bytes``).
        """
        rt = self.rt
        ready = request.prompt_len - 1
        moved = max(0, ready - local_hit)
        nbytes: float = moved * rt.kv_bytes_per_token
        if overlapped_s > 0 and nbytes > 0:
            chunk = rt.config.overlap_chunk_tokens or rt.engine.config.max_batched_tokens
            nbytes = overlap_tail_bytes(nbytes, min(moved, chunk) * rt.kv_bytes_per_token,
                                        overlapped_s * rt.kv_bandwidth_gbps * 1e9 / 8)
        scale = rt.sleep_scale()
        if moved > 0 and scale > 0:
            await asyncio.sleep(rt.config.kv_transfer_latency_s * scale)
            await rt.kv_link.send(nbytes)
        request.kv_ready_tokens = ready
        rt.stats.pd.kv_pulls += 1

    def fail_or_fallback(self, failure: PdFailure) -> None:
        """Raise the failure as an HTTP error, or record a local recompute."""
        rt = self.rt
        rt.stats.pd.kv_pull_failures += 1
        if rt.config.pd_fallback == "recompute":
            rt.stats.pd.fallback_recomputes += 1
            self.headers["x-emulator-pd-fallback"] = "recompute"
            log.warning("PD KV unavailable (%s); recomputing prefill locally", failure)
            return
        raise ApiError(failure.status, f"KV transfer failed: {failure}", "KVTransferError")
