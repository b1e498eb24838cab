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
from router.tools.emulator.perf import PerfProfile, kv_transfer_time
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.stats import StatsRecorder

log = logging.getLogger(__name__)


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

    async def receive_kv(self, request: EngineRequest, local_hit: int) -> None:
        """Wait the modelled transfer time, then mark the prompt KV as present.

        All prompt tokens but the last arrive; the decode computes that last
        token itself so its first output comes from a real forward pass.
        """
        rt = self.rt
        ready = request.prompt_len - 1
        moved = max(0, ready - local_hit)
        seconds = kv_transfer_time(rt.profile, moved, rt.kv_bandwidth_gbps,
                                   rt.config.kv_transfer_latency_s)
        if seconds > 0 and rt.sleep_scale() > 0:
            await asyncio.sleep(seconds * rt.sleep_scale())
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
