"""The byte stream between the router and its ingestion sidecar.

Frames are ``[4-byte little-endian body length][1-byte kind][body]``. The sidecar sends
table deltas (``DELTA``, binary: a fixed header with the generation of the instance's
subscription, the table's instance name, then four packed uint64 key arrays, so the loop
decodes them with ``array.frombytes`` and applies them with set operations), a few times
a second its counters (``STATS``, JSON; always after the deltas they count), and per
source ``OPENED`` or ``ERROR`` (JSON): whether its socket could be opened. With shared
tables (``router.state.shared_mirror``) there are no deltas: a ``SEGMENT`` frame (JSON:
instance, rank, generation) carries, as ancillary data (``SCM_RIGHTS``), the file
descriptor of a table's new shared-memory segment. The router
sends JSON commands (``CONFIG`` first, then ``ADD`` per source with its subscription's
generation, ``REMOVE`` per instance that left) on the sidecar's stdin with the same
framing.
"""

from __future__ import annotations

import json
import struct
from array import array
from typing import Any, NamedTuple

from router.state.precise_mirror import TableDelta

DELTA, STATS, OPENED, ERROR, CONFIG, ADD, REMOVE, SEGMENT = b"D", b"S", b"O", b"E", b"C", b"A", b"R", b"G"

_FRAME = struct.Struct("<Ic")
_DELTA = struct.Struct("<HIIBBQQIIII")  # name length, rank, generation, fresh, reset, size, overflow, 4 array lengths
_MAX_FRAME = 1 << 28


class ChannelError(ValueError):
    """Bytes that are not a frame of this protocol (the peer is not the sidecar)."""


def frame(kind: bytes, body: bytes) -> bytes:
    return _FRAME.pack(len(body), kind) + body


def json_frame(kind: bytes, obj: Any) -> bytes:
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def encode_delta(instance: str, rank: int, delta: TableDelta, gen: int = 0) -> bytes:
    """One table's delta; ``gen`` is the instance's subscription generation (the router
    drops a delta of a subscription it has since closed)."""
    name = instance.encode()
    arrays = (delta.added_gpu, delta.removed_gpu, delta.added_offload, delta.removed_offload)
    head = _DELTA.pack(len(name), rank, gen, delta.fresh, delta.reset, delta.size, delta.overflow, *map(len, arrays))
    return frame(DELTA, b"".join((head, name, *(a.tobytes() for a in arrays))))


class DeltaFrame(NamedTuple):
    instance: str
    rank: int
    gen: int
    delta: TableDelta


def decode_delta(body: bytes) -> DeltaFrame:
    n_name, rank, gen, fresh, reset, size, overflow, *lengths = _DELTA.unpack_from(body)
    pos = _DELTA.size
    instance = bytes(body[pos:pos + n_name]).decode()
    pos += n_name
    arrays: list[array[int]] = []
    for n in lengths:
        keys = array("Q")
        keys.frombytes(body[pos:pos + 8 * n])
        arrays.append(keys)
        pos += 8 * n
    if pos != len(body):
        raise ChannelError("a delta frame's length does not match its arrays")
    return DeltaFrame(instance, rank, gen, TableDelta(bool(fresh), size, overflow, bool(reset), *arrays))


class FrameReader:
    """Splits a byte stream into ``(kind, body)`` frames as bytes arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[bytes, bytes]] = []
        pos, end = 0, len(buf)
        while end - pos >= _FRAME.size:
            length, kind = _FRAME.unpack_from(buf, pos)
            if length > _MAX_FRAME:
                raise ChannelError(f"a frame of {length} bytes")
            start = pos + _FRAME.size
            if end - start < length:
                break
            out.append((kind, bytes(buf[start:start + length])))
            pos = start + length
        del buf[:pos]
        return out
