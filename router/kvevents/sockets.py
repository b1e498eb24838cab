"""ZMQ sockets of KV-event ingestion, on the event loop (``zmq.asyncio``), never blocking it.

Two topologies, as vLLM's publisher binds for ``tcp://*:PORT`` and connects when its
endpoint names a host:

* connected: one SUB per engine, connected to the engine's PUB; every message on it is
  that engine's;
* bound: one SUB bound by the router, that engines' PUBs connect to; the topic frame
  tells the engines apart (so each needs its own, e.g. ``kv@<instance>``).

Each socket is drained from the event loop's readiness callback for its descriptor, in
slices: a slice lasts as long as the rest of the loop just took, between ``_SLICE_S`` and
``_MAX_SLICE_S``, so ingestion gets an even share of a busy process (events keep up under
heavy routing) and a light one delays each step of a request by a fraction of a
millisecond.
Memory stays bounded by the socket's receive high-water mark: what does not fit is
dropped by ZMQ and shows up as a sequence gap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from router.kvevents.wire import WireError, decode_seq

log = logging.getLogger(__name__)

_SLICE_S = 0.0003
_MAX_SLICE_S = 0.002
_END = -1

Handler = Callable[[bytes, int, bytes], None]
"""(topic, sequence, payload) of one message."""


def split_frames(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """``[topic, seq, payload]`` (or ``[seq, payload]`` from a publisher without topics)."""
    if len(frames) == 3:
        topic, seq, payload = frames
    elif len(frames) == 2:
        topic, (seq, payload) = b"", frames
    else:
        raise WireError(f"a KV-event message has 3 frames, not {len(frames)}")
    return topic, decode_seq(seq), payload


def sub_socket(ctx: zmq.asyncio.Context, hwm: int, topics: list[str]) -> zmq.asyncio.Socket:
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    for topic in topics or [""]:
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    return sock


def _handle(frames: list[bytes], handle: Handler, name: str, on_error: Callable[[], None]) -> None:
    try:
        topic, seq, payload = split_frames(frames)
    except WireError as exc:
        on_error()
        log.warning("kv events on %s: %s", name, exc)
        return
    try:
        handle(topic, seq, payload)
    except Exception:  # noqa: BLE001 - a bad message must not end ingestion
        on_error()
        log.exception("kv events on %s: message %d not applied", name, seq)


class _Reader:
    """Drains one socket from the event loop's own readiness callbacks.

    ZMQ signals readiness on a file descriptor that only says "look at ZMQ_EVENTS": the
    callback receives with non-blocking calls until the socket is empty, in slices
    (module docstring), and continues a long burst with ``call_soon`` so requests run
    between slices. This costs a few microseconds per wake-up, where an awaited
    zmq.asyncio future per message costs as much as applying a 32-event batch."""

    def __init__(self, sock: zmq.Socket[bytes], handle: Handler, name: str, on_error: Callable[[], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._handle = handle
        self._name = name
        self._on_error = on_error
        self._loop = loop
        self._scheduled = False
        self._budget = _SLICE_S
        self._paused_at = 0.0
        self.closed = False

    def readable(self) -> None:
        if self._scheduled or self.closed:  # a queued continuation drains, in its turn
            return
        self._drain()

    def _resume(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        others = time.perf_counter() - self._paused_at  # what the rest of the loop took meanwhile
        self._budget = min(_MAX_SLICE_S, max(_SLICE_S, others))
        self._drain()

    def _drain(self) -> None:
        sock, clock = self._sock, time.perf_counter
        deadline = clock() + self._budget
        self._budget = _SLICE_S
        while int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            _handle(frames, self._handle, self._name, self._on_error)
            if clock() > deadline:
                self._scheduled = True
                self._paused_at = clock()
                self._loop.call_soon(self._resume)
                return


async def receive_loop(sock: zmq.asyncio.Socket, handle: Handler, name: str, on_error: Callable[[], None]) -> None:
    """Hand every message on ``sock`` to ``handle`` until cancelled (see ``_Reader``)."""
    loop = asyncio.get_running_loop()
    plain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)  # the same socket without zmq.asyncio's futures
    reader = _Reader(plain, handle, name, on_error, loop)
    fd = int(plain.getsockopt(zmq.FD))
    loop.add_reader(fd, reader.readable)
    try:
        reader.readable()  # anything queued before the reader was registered
        await loop.create_future()  # until cancelled
    finally:
        reader.closed = True
        loop.remove_reader(fd)


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, timeout_s: float) -> list[tuple[int, bytes]] | None:
    """Ask a publisher's replay (ROUTER) socket for every batch from ``start`` on.

    The request is the 8-byte big-endian start sequence (after an empty delimiter
    frame); the answer is one message per batch, ``[topic, sequence, payload]`` as vLLM
    0.32 sends them (``[sequence, payload]`` from publishers without the topic frame),
    ending with sequence -1."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[tuple[int, bytes]] = []
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0 or not await sock.poll(timeout=left * 1000):
                log.warning("kv event replay from %s timed out after %d batches", endpoint, len(out))
                return None
            frames = await sock.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]  # the ROUTER's delimiter
            if len(frames) == 3:  # vLLM 0.32: [topic, seq, payload]; its end marker has an empty topic
                frames = frames[1:]
            if not frames:
                continue
            seq = decode_seq(frames[0])
            if seq == _END:
                return out
            out.append((seq, frames[1] if len(frames) > 1 else b""))
    except (zmq.ZMQError, WireError) as exc:
        log.warning("kv event replay from %s failed: %s", endpoint, exc)
        return None
    finally:
        sock.close(linger=0)
