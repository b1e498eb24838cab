"""Record a real engine's KV-event frames (ZMQ SUB; vLLM's publisher binds ``tcp://*:PORT``).

Kept raw: ``[topic, 8-byte big-endian sequence, msgpack payload]`` exactly as received,
so a saved fixture tests a decoder against the real bytes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq


class FrameRecorder:
    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._frames: list[list[bytes]] = []
        self._thread = threading.Thread(target=self._run, name="kv-frames", daemon=True)

    def __enter__(self) -> "FrameRecorder":
        self._sock.connect(self._endpoint)
        self._thread.start()
        time.sleep(0.5)  # PUB/SUB drops what is published before the subscription lands
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        self._ctx.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(100):
                frame = self._sock.recv_multipart()
                with self._lock:
                    self._frames.append(frame)

    @property
    def frames(self) -> list[list[bytes]]:
        with self._lock:
            return list(self._frames)

    def wait_for(self, done: Callable[[list[list[bytes]]], bool], timeout_s: float) -> list[list[bytes]]:
        deadline = time.monotonic() + timeout_s
        while not done(frames := self.frames):
            if time.monotonic() > deadline:
                raise AssertionError(f"KV events not seen in {timeout_s}s ({len(frames)} frames)")
            time.sleep(0.05)
        return frames


def decode(frame: list[bytes]) -> tuple[bytes, int, list[Any]]:
    """(topic, sequence, batch) of one frame; the batch is ``[timestamp, events, dp_rank?]``."""
    topic, seq, payload = frame
    return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False, strict_map_key=False)


def events(frames: list[list[bytes]]) -> list[dict[str, Any]]:
    return [event for frame in frames for event in decode(frame)[2][1]]


def save(frames: list[list[bytes]], path: Path, about: dict[str, Any]) -> None:
    doc = {"about": about, "frames": [
        {"topic": f[0].decode(), "seq": int.from_bytes(f[1], "big"), "payload_b64": base64.b64encode(f[2]).decode()}
        for f in frames]}
    path.write_text(json.dumps(doc, indent=1) + "\n")
