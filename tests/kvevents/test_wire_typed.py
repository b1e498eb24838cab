"""The typed (msgspec) decoding path gives the tables the general path gives, for both
encodings, the real vLLM 0.32 frames, and the odd values vLLM may send; garbage still
raises WireError."""

import base64
import json
import random
from pathlib import Path

import msgpack
import pytest

from router.kvevents.apply import TableWriter
from router.kvevents.wire import (
    ClearedMap, RemovedArray, StoredArray, StoredMap, WireError, decode_batch, decode_batch_raw, decode_payload,
)
from router.state.precise import BlockTable

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.32-kv-events.json").read_text())


def state(writer: TableWriter):
    t = writer.table
    return dict(t._blocks), dict(t._gpu), dict(t._offload), t.overflow, writer.counters


def three_ways(payloads, block=16, capacity=10_000):
    """The tables after applying ``payloads`` through the typed, the map and the general paths."""
    typed, raw, general = (TableWriter(BlockTable(capacity), "m", block) for _ in range(3))
    for p in payloads:
        typed.apply_raw(decode_batch(p)[1])
        raw.apply_raw(decode_batch_raw(p)[1])
        general.apply(decode_payload(p).events)
    return state(typed), state(raw), state(general)


def test_the_real_vllm_032_frames_decode_typed_and_fill_the_same_table():
    payloads = [base64.b64decode(f["payload_b64"]) for f in FIXTURE["frames"]]
    ts, events, rank = decode_batch(payloads[0])
    assert rank == 0 and ts > 0 and isinstance(events[0], StoredMap)
    assert events[0].block_size == 128 and len(events[0].token_ids) == 256
    typed, raw, general = three_ways(payloads, block=128)
    assert typed == raw == general
    assert typed[4].stored_blocks > 0 and typed[4].removed_blocks > 0


def random_events(rng: random.Random, n: int):
    """vLLM-shaped map events over a few prompt chains: stores (GPU or CPU, LoRA or not,
    extra fields), removals, a clear now and then; hashes as uint64 or negative int64."""
    stored: list[int] = []
    events = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55 or not stored:
            k = rng.randrange(1, 4)
            hashes = [rng.getrandbits(64) for _ in range(k)]
            parent = rng.choice(stored) if stored and rng.random() < 0.6 else None
            events.append({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                           "token_ids": [rng.randrange(50_000) for _ in range(16 * k)], "block_size": 16,
                           "lora_id": None, "medium": rng.choice(["GPU", "CPU", None]),
                           "lora_name": rng.choice([None, None, "adapter"]), "extra_keys": [None] * k,
                           "group_idx": 0, "kv_cache_spec_kind": "full_attention"})
            stored.extend(hashes)
        elif r < 0.97:
            gone = [rng.choice(stored) for _ in range(rng.randrange(1, 3))]
            events.append({"type": "BlockRemoved", "block_hashes": [h - (1 << 64) if h >= 1 << 63 else h for h in gone],
                           "medium": rng.choice(["GPU", "CPU"]), "group_idx": 0})
        else:
            events.append({"type": "AllBlocksCleared"})
    return events


def positional(ev: dict):
    kind = ev["type"]
    if kind == "BlockStored":
        return [kind, ev["block_hashes"], ev["parent_block_hash"], ev["token_ids"], ev["block_size"], ev["lora_id"],
                ev["medium"], ev["lora_name"], "a field from later"]
    if kind == "BlockRemoved":
        return [kind, ev["block_hashes"], ev["medium"]]
    return [kind]


@pytest.mark.parametrize("seed", range(5))
def test_both_encodings_fill_the_same_table_on_every_path(seed):
    events = random_events(random.Random(seed), 400)
    maps = [msgpack.packb([1.0, events[i:i + 8], 0]) for i in range(0, len(events), 8)]
    arrays = [msgpack.packb([1.0, [positional(e) for e in events[i:i + 8]]]) for i in range(0, len(events), 8)]
    assert isinstance(decode_batch(arrays[0])[1][0], (StoredArray, RemovedArray))
    by_maps, by_arrays = three_ways(maps, capacity=30), three_ways(arrays, capacity=30)
    assert by_maps[0] == by_maps[1] == by_maps[2] == by_arrays[0] == by_arrays[1] == by_arrays[2]
    assert by_maps[0][3] > 0 and by_maps[0][4].cleared > 0  # evictions and clears were exercised


def test_bytes_hashes_and_map_batches_take_the_general_path():
    events = [{"type": "BlockStored", "block_hashes": [b"\x01\x02"], "parent_block_hash": None,
               "token_ids": list(range(16)), "block_size": 16}]
    ts, decoded, _ = decode_batch(msgpack.packb([0.0, events]))
    assert type(decoded[0]) is dict
    _, decoded, rank = decode_batch(msgpack.packb({"ts": 1.0, "events": [{"type": "AllBlocksCleared"}],
                                                   "data_parallel_rank": 2}))
    assert rank == 2 and not isinstance(decoded[0], ClearedMap)


@pytest.mark.parametrize("payload", [
    b"\xc1not msgpack",
    msgpack.packb("a string"),
    msgpack.packb([1.0, "not a list"]),
    msgpack.packb([1.0, [{"type": "Nope"}]]),
    msgpack.packb([1.0, [["BlockStored", [1]]]]),
    msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                          "token_ids": [1] * 16, "block_size": 0}]]),
    msgpack.packb([1.0, [["BlockStored", [1], None, [1] * 16, -16]]]),
    msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": ["not a hash"]}]]),
    msgpack.packb([True, []]),
])
def test_garbage_still_raises_wire_error(payload):
    writer = TableWriter(BlockTable(100), "m", 16)
    with pytest.raises(WireError):
        writer.apply_raw(decode_batch(payload)[1])
