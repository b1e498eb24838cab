"""The emulator's KV events, on vLLM's wire: what its prefix cache stores and evicts.

``KVEventLog`` collects what the cache does (the engine stays free of I/O); the
``KVEventPublisher`` sends it as vLLM does: a ZMQ PUB (binding for ``tcp://*:PORT`` or
ipc, connecting when the endpoint names a host), messages ``[topic, 8-byte big-endian
sequence, msgpack batch]`` with the batch ``[ts, [events], data_parallel_rank]``, events
as maps tagged by ``type`` (vLLM 0.32) or, on request, as positional arrays (older vLLM).
An optional replay ROUTER socket answers ``[start sequence]`` with every buffered batch
from there on (``[topic, sequence, payload]``), then sequence -1. The encoding here is written from the wire description,
independently of the router's decoder, so the tests of one check the other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

# (kind, block hashes, parent hash, token ids, block size)
RawEvent = tuple[str, list[int], int | None, list[int], int]
_END = (-1).to_bytes(8, "big", signed=True)


class KVEventLog:
    """Events the cache produced since the last ``take``; adjacent removals merge."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.on_first: Callable[[], None] | None = None
        self._events: list[RawEvent] = []

    def _add(self, event: RawEvent) -> None:
        if not self._events and self.on_first is not None:
            self.on_first()
        self._events.append(event)

    def stored(self, hashes: list[int], parent: int | None, tokens: list[int]) -> None:
        self._add(("BlockStored", hashes, parent, tokens, self.block_size))

    def removed(self, block_hash: int) -> None:
        if self._events and self._events[-1][0] == "BlockRemoved":
            self._events[-1][1].append(block_hash)
        else:
            self._add(("BlockRemoved", [block_hash], None, [], 0))

    def cleared(self) -> None:
        self._add(("AllBlocksCleared", [], None, [], 0))

    def take(self) -> list[RawEvent]:
        events, self._events = self._events, []
        return events


def encode_event(event: RawEvent, positional: bool) -> Any:
    kind, hashes, parent, tokens, block_size = event
    if kind == "BlockStored":
        if positional:  # tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
            return [kind, hashes, parent, tokens, block_size, None, "GPU", None]
        return {"type": kind, "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}
    if kind == "BlockRemoved":
        return [kind, hashes, "GPU"] if positional else {"type": kind, "block_hashes": hashes, "medium": "GPU"}
    return [kind] if positional else {"type": kind}


def encode_batch(events: list[RawEvent], positional: bool = False, ts: float | None = None,
                 dp_rank: int | None = 0) -> bytes:
    batch = [time.time() if ts is None else ts, [encode_event(e, positional) for e in events], dp_rank]
    return msgpack.packb(batch, use_bin_type=True)


def publisher_binds(endpoint: str) -> bool:
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
    return host in ("*", "0.0.0.0", "") or "::" in host


class KVEventPublisher:
    """Publishes a ``KVEventLog`` on ZMQ from the emulator's event loop."""

    def __init__(self, events: KVEventLog, endpoint: str, *, topic: str = "", replay_endpoint: str | None = None,
                 positional: bool = False, buffer_steps: int = 10_000, dp_rank: int = 0) -> None:
        self.events = events
        self.endpoint = endpoint
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.positional = positional
        self.dp_rank = dp_rank
        self.seq = 0
        self.dropped_next = 0  # test hook: skip sending this many batches (they stay replayable)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._scheduled = False

    def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self.endpoint = self._open(self._pub, self.endpoint)
        if self.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = self._open(self._replay, self.replay_endpoint, always_bind=True)
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay(), name="emulator-kv-replay")
        loop = asyncio.get_running_loop()

        def schedule() -> None:
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self.flush)

        self.events.on_first = schedule

    @staticmethod
    def _open(sock: zmq.asyncio.Socket, endpoint: str, always_bind: bool = False) -> str:
        """Bind or connect by vLLM's rule; a bound ``:0`` port becomes the one ZMQ picked."""
        if not (always_bind or publisher_binds(endpoint)):
            sock.connect(endpoint)
            return endpoint
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
            port = sock.bind_to_random_port(f"tcp://{host}")
            return f"tcp://{host}:{port}"
        sock.bind(endpoint)
        return endpoint

    def flush(self) -> None:
        """Send what the log holds as one batch (called once per loop turn with events)."""
        self._scheduled = False
        events = self.events.take()
        if not events or self._pub is None:
            return
        payload = encode_batch(events, self.positional, dp_rank=self.dp_rank)
        seq, self.seq = self.seq, self.seq + 1
        self._buffer.append((seq, payload))
        if self.dropped_next > 0:
            self.dropped_next -= 1
            return
        self._pub.send_multipart([self.topic.encode(), seq.to_bytes(8, "big"), payload], copy=False)

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            ident, rest = frames[0], [f for f in frames[1:] if f != b""]
            if not rest or len(rest[0]) != 8:
                continue
            start = int.from_bytes(rest[0], "big", signed=True)
            topic = self.topic.encode()
            for seq, payload in list(self._buffer):  # as vLLM 0.32: [topic, seq, payload], end with an empty topic
                if seq >= start:
                    await self._replay.send_multipart([ident, b"", topic, seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([ident, b"", b"", _END, b""])

    async def stop(self) -> None:
        self.events.on_first = None
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def sources(self) -> dict[str, dict[str, Any]]:
        """The ``GET /kv_event_sources`` answer in vLLM 0.32's shape: the publisher config
        keyed by DP rank (a JSON object, so the rank is a string)."""
        return {str(self.dp_rank): {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                                    "replay_endpoint": self.replay_endpoint,
                                    "buffer_steps": self._buffer.maxlen, "topic": self.topic}}
