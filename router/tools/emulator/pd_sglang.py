"""SGLang-shaped PD handoff through a bootstrap rendezvous.

The router sends the *same* body, carrying ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room``, to a prefill and a decode engine
at once. The prefill engine listens on its bootstrap port; the decode
connects there and announces its room. As in SGLang, the prefill waits for
its decode partner before prefilling; once prefill is done it tells the
decode the KV is ready, the decode waits the modelled transfer time and then
decodes. KV streams chunk by chunk while the prefill runs (SGLang's default overlap), so
the decode waits only for what could not move meanwhile: the last chunk at least. A partner that never shows up times out on both sides (HTTP 504).

Wire protocol (JSON lines over TCP, emulator to emulator only):
decode -> prefill ``{"room", "engine_id", "prompt_len", "prompt_digest"}``;
prefill -> decode ``{"status": "paired"}`` then ``{"status": "ready", ...}``
or ``{"status": "error", "message"}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Protocol

from router.tools.emulator.openai_schema import ApiError, BootstrapTarget
from router.tools.emulator.pd_common import Leg, PdFailure, PdHost, prompt_digest
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.stats import PdCounters

log = logging.getLogger(__name__)


def prefill_seconds(request: EngineRequest) -> float:
    """Model seconds the prefill computed for (first scheduled to first token): the time
    SGLang streams finished chunks' KV to the decode while later chunks still compute."""
    if request.schedule_time is None or request.first_token_time is None:
        return 0.0
    return max(0.0, request.first_token_time - request.schedule_time)


class DecodePeer:
    """The prefill side's handle on one connected decode request."""

    def __init__(self, hello: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        self.hello = hello
        self._writer = writer

    def send(self, message: dict[str, object], close: bool = False) -> None:
        if self._writer.is_closing():
            return
        self._writer.write(json.dumps(message).encode() + b"\n")
        if close:
            self._writer.close()

    def fail(self, message: str) -> None:
        self.send({"status": "error", "message": message}, close=True)


class BootstrapServer:
    """Prefill side: pairs incoming decode connections with prefill requests."""

    def __init__(self, timeout_s: float, counters: PdCounters) -> None:
        self._timeout_s = timeout_s
        self._counters = counters
        self._server: asyncio.Server | None = None
        self._pending: dict[int, DecodePeer] = {}
        self._waiting: dict[int, asyncio.Future[DecodePeer]] = {}

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._on_connect, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        for peer in self._pending.values():
            peer.fail("prefill engine shutting down")
        self._pending.clear()
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), self._timeout_s)
            hello = json.loads(line)
            room = int(hello["room"])
        except (TimeoutError, ValueError, KeyError, TypeError):
            writer.close()
            return
        peer = DecodePeer(hello, writer)
        waiter = self._waiting.pop(room, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(peer)
            return
        old = self._pending.pop(room, None)
        if old is not None:
            old.fail(f"another decode claimed room {room}")
        self._pending[room] = peer
        asyncio.get_running_loop().call_later(self._timeout_s, self._expire, room, peer)

    def _expire(self, room: int, peer: DecodePeer) -> None:
        if self._pending.get(room) is peer:
            del self._pending[room]
            self._counters.bootstrap_timeouts += 1
            peer.fail(f"no prefill request for room {room} within {self._timeout_s}s")

    async def pair(self, room: int) -> DecodePeer:
        """Wait for the decode of ``room``; PdFailure(504) after the timeout."""
        peer = self._pending.pop(room, None)
        if peer is None:
            waiter: asyncio.Future[DecodePeer] = asyncio.get_running_loop().create_future()
            self._waiting[room] = waiter
            try:
                peer = await asyncio.wait_for(waiter, self._timeout_s)
            except TimeoutError:
                self._counters.bootstrap_timeouts += 1
                raise PdFailure(f"no decode connected for bootstrap room {room} within "
                                f"{self._timeout_s}s", status=504) from None
            finally:
                if self._waiting.get(room) is waiter:
                    del self._waiting[room]
        self._counters.bootstrap_paired += 1
        peer.send({"status": "paired"})
        return peer


class SglangHost(PdHost, Protocol):
    """An engine that can play an SGLang leg: a prefill one also runs the bootstrap listener."""

    @property
    def bootstrap(self) -> BootstrapServer | None: ...


class SglangPrefillLeg(Leg):
    """Pair with the decode, prefill (one token), then signal KV ready."""

    name = "sglang-prefill"
    rt: SglangHost

    def __init__(self, runtime: SglangHost, targets: list[BootstrapTarget]) -> None:
        super().__init__(runtime)
        self.targets = targets
        self.peers: list[DecodePeer] = []

    async def prepare(self, requests: list[EngineRequest]) -> None:
        bootstrap = self.rt.bootstrap
        assert bootstrap is not None
        results = await asyncio.gather(*(bootstrap.pair(t.room) for t in self.targets),
                                       return_exceptions=True)
        self.peers = [p for p in results if isinstance(p, DecodePeer)]
        failures = [f for f in results if isinstance(f, BaseException)]
        if failures:
            for peer in self.peers:
                peer.fail("a sibling room of this batch failed to pair")
            self.peers = []
            failure = failures[0]
            status = failure.status if isinstance(failure, PdFailure) else 500
            raise ApiError(status, f"bootstrap failed: {failure}", "KVTransferError")
        for request in requests:
            request.max_tokens = 1  # a PD prefill only produces the first token

    async def finalize(self, requests: list[EngineRequest]) -> dict[str, object]:
        for peer, request in zip(self.peers, requests):
            peer.send({"status": "ready", "engine_id": self.rt.engine_id,
                       "prompt_len": request.prompt_len,
                       "prompt_digest": prompt_digest(request.prompt),
                       "prefill_s": prefill_seconds(request)}, close=True)
        self.peers = []
        return {}

    def abort(self, requests: list[EngineRequest]) -> None:
        for peer in self.peers:
            peer.fail("prefill request aborted")
        self.peers = []


class SglangDecodeLeg(Leg):
    """Connect to the prefill's bootstrap port, wait for KV, then decode."""

    name = "sglang-decode"
    rt: SglangHost

    def __init__(self, runtime: SglangHost, targets: list[BootstrapTarget]) -> None:
        super().__init__(runtime)
        self.targets = targets

    async def prepare(self, requests: list[EngineRequest]) -> None:
        results = await asyncio.gather(
            *(self._one(r, t) for r, t in zip(requests, self.targets)),
            return_exceptions=True)
        for result in results:
            if isinstance(result, PdFailure):
                self.fail_or_fallback(result)
            elif isinstance(result, BaseException):
                raise result

    async def _one(self, request: EngineRequest, target: BootstrapTarget) -> None:
        rt = self.rt
        local_hit = rt.engine.local_hit_tokens(request)
        digest = prompt_digest(request.prompt)
        where = f"{target.host}:{target.port} room {target.room}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port),
                rt.config.bootstrap_timeout_s)
        except (TimeoutError, OSError) as exc:
            raise PdFailure(f"bootstrap {where} unreachable ({exc!r})") from None
        try:
            writer.write(json.dumps({"room": target.room, "engine_id": rt.engine_id,
                                     "prompt_len": request.prompt_len,
                                     "prompt_digest": digest}).encode() + b"\n")
            paired = await self._read(reader, rt.config.bootstrap_timeout_s, where)
            if paired.get("status") != "paired":
                raise PdFailure(f"bootstrap {where}: {paired.get('message', paired)}",
                                status=504)
            ready = await self._read(reader, rt.config.kv_hold_timeout_s, where)
        finally:
            writer.close()
        if ready.get("status") != "ready":
            raise PdFailure(f"bootstrap {where}: {ready.get('message', ready)}")
        if ready.get("prompt_digest") != digest:
            raise PdFailure(f"bootstrap {where}: prefilled prompt differs", status=409)
        overlapped = ready.get("prefill_s")
        await self.receive_kv(request, local_hit,
                              float(overlapped) if isinstance(overlapped, (int, float)) else 0.0)

    @staticmethod
    async def _read(reader: asyncio.StreamReader, timeout: float,
                    where: str) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout)
        except TimeoutError:
            raise PdFailure(f"bootstrap {where}: no answer within {timeout}s",
                            status=504) from None
        except OSError as exc:
            raise PdFailure(f"bootstrap {where}: connection lost ({exc!r})") from None
        if not line:
            raise PdFailure(f"bootstrap {where}: prefill closed the connection")
        try:
            message = json.loads(line)
        except ValueError:
            raise PdFailure(f"bootstrap {where}: bad message {line[:100]!r}") from None
        if not isinstance(message, dict):
            raise PdFailure(f"bootstrap {where}: bad message {line[:100]!r}")
        return message
