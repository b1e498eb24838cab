"""vLLM's KV-event wire format (SGLang publishes the same), decoded defensively.

A message is three ZMQ frames: ``[topic, sequence (8-byte big-endian), payload]``. The
payload is msgpack of a batch ``[timestamp, [events...], data_parallel_rank?]`` (older
releases; newer ones may send the batch as a map too). Each event is either a positional
array tagged by its first element (``["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, ...]``, vLLM before the change to maps) or a map
with a ``type`` key (vLLM 0.32). Fields added over time are optional on both shapes.

Block hashes are ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, uint64 that a decoder may
see as negative int64) or bytes; both become one non-negative int identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import msgspec

_MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """A frame or payload that is not a KV-event batch."""


@dataclass(slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    medium: str | None = None


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventBatch:
    ts: float
    events: list[Event]
    dp_rank: int | None = None


def block_hash(value: Any) -> int:
    if isinstance(value, bool):
        raise WireError("a block hash must be an int or bytes")
    if isinstance(value, int):
        return value & _MASK64
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(value, "big")
    raise WireError(f"a block hash must be an int or bytes, not {type(value).__name__}")


def _hashes(value: Any) -> tuple[int, ...]:
    if type(value) is not list and not isinstance(value, tuple):
        raise WireError("block_hashes must be a list")
    try:  # the common case, uint64 ints: checked in C by min/max, no per-hash Python call
        if value and min(value) >= 0 and max(value) <= _MASK64:
            return tuple(value)
    except TypeError:  # bytes hashes (or garbage): one by one
        pass
    return tuple(block_hash(v) for v in value)


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise WireError("expected a string")


def _stored(hashes: Any, parent: Any, tokens: Any, block_size: Any, medium: Any, lora_name: Any) -> BlockStored:
    # Token ids are checked where they are packed (apply.py): a second pass here would
    # double the cost of the hottest path. Everything else is checked now.
    if type(tokens) is not list and not isinstance(tokens, tuple):
        raise WireError("token_ids must be a list")
    if type(block_size) is not int or block_size < 1:
        raise WireError("block_size must be a positive int")
    if parent is not None:
        parent = block_hash(parent)
    if medium is not None and type(medium) is not str:
        medium = _opt_str(medium)
    if lora_name is not None and type(lora_name) is not str:
        lora_name = _opt_str(lora_name)
    return BlockStored(_hashes(hashes), parent, tokens, block_size, medium, lora_name)


def _field(items: Sequence[Any], i: int) -> Any:
    return items[i] if len(items) > i else None


def decode_event(raw: Any) -> Event:
    """One event from its map or positional shape."""
    if type(raw) is dict:
        get = raw.get
        kind = get("type")
        if kind == "BlockStored":
            return _stored(get("block_hashes"), get("parent_block_hash"), get("token_ids"), get("block_size"),
                           get("medium"), get("lora_name"))
        if kind == "BlockRemoved":
            return BlockRemoved(_hashes(raw.get("block_hashes")), _opt_str(raw.get("medium")))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared(_opt_str(raw.get("medium")))
        raise WireError(f"unknown event type {kind!r}")
    if isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        if kind == "BlockStored":
            # [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]
            if len(raw) < 5:
                raise WireError("BlockStored needs block_hashes, parent_block_hash, token_ids, block_size")
            return _stored(raw[1], raw[2], raw[3], raw[4], _field(raw, 6), _field(raw, 7))
        if kind == "BlockRemoved":
            if len(raw) < 2:
                raise WireError("BlockRemoved needs block_hashes")
            return BlockRemoved(_hashes(raw[1]), _opt_str(_field(raw, 2)))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared(_opt_str(_field(raw, 1)) if len(raw) > 1 and isinstance(raw[1], str) else None)
        raise WireError(f"unknown event type {kind!r}")
    raise WireError("an event must be a map or a tagged array")


def decode_payload(payload: bytes) -> EventBatch:
    """The batch of one message's payload frame, every event decoded."""
    ts, events, rank = decode_batch_raw(payload)
    return EventBatch(ts, [decode_event(e) for e in events], rank)


def decode_batch_raw(payload: bytes) -> tuple[float, list[Any], int | None]:
    """The batch's timestamp, its events as msgpack decoded them, and its rank
    (``TableWriter.apply_raw`` applies such events without building objects)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"payload is not msgpack: {type(exc).__name__}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], _field(raw, 2)
    else:
        raise WireError("a batch must be [ts, events, dp_rank?]")
    if not isinstance(events, (list, tuple)):
        raise WireError("a batch's events must be a list")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise WireError("a batch's timestamp must be a number")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise WireError("data_parallel_rank must be an int")
    return float(ts), list(events), rank


# -- typed decoding: the hot path ------------------------------------------------------
# msgspec decodes a batch straight into these (C, no dict per event, fields not listed
# here, such as vLLM 0.32's extra_keys or group_idx, skipped unread). One decoder per
# event encoding, as a msgspec union cannot mix maps and arrays. Whatever they refuse
# (bytes hashes, a batch sent as a map, garbage) takes the general path above, which
# accepts what vLLM may send and raises WireError on the rest.
class StoredEvent(msgspec.Struct, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class StoredMap(StoredEvent, tag_field="type", tag="BlockStored"):
    pass


class StoredArray(StoredEvent, tag="BlockStored", array_like=True):
    pass


class RemovedEvent(msgspec.Struct, gc=False):
    block_hashes: list[int]
    medium: str | None = None


class RemovedMap(RemovedEvent, tag_field="type", tag="BlockRemoved"):
    pass


class RemovedArray(RemovedEvent, tag="BlockRemoved", array_like=True):
    pass


class ClearedEvent(msgspec.Struct, gc=False):
    medium: str | None = None


class ClearedMap(ClearedEvent, tag_field="type", tag="AllBlocksCleared"):
    pass


class ClearedArray(ClearedEvent, tag="AllBlocksCleared", array_like=True):
    pass


class _MapEventsBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[StoredMap | RemovedMap | ClearedMap]
    data_parallel_rank: int | None = None


class _ArrayEventsBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[StoredArray | RemovedArray | ClearedArray]
    data_parallel_rank: int | None = None


TypedEvent = StoredMap | StoredArray | RemovedMap | RemovedArray | ClearedMap | ClearedArray
_DECODERS = (msgspec.msgpack.Decoder(_MapEventsBatch), msgspec.msgpack.Decoder(_ArrayEventsBatch))


def decode_batch(payload: bytes) -> tuple[float, list[Any], int | None]:
    """``decode_batch_raw``, with the events as typed structs (``TypedEvent``) when the
    batch is one vLLM or SGLang sends; ``TableWriter.apply_raw`` takes either."""
    for decoder in _DECODERS:
        try:
            batch = decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue
        events: list[Any] = batch.events
        return batch.ts, events, batch.data_parallel_rank
    return decode_batch_raw(payload)


def decode_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence number; -1 (all ones) ends a replay."""
    if len(frame) != 8:
        raise WireError("a sequence frame must be 8 bytes")
    return int.from_bytes(frame, "big", signed=True)
