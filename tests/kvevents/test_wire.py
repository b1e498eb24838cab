"""Decoding KV-event batches from msgpack bytes shaped as vLLM sends them."""

import msgpack
import pytest

from router.kvevents.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_payload,
    decode_seq,
)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_map_encoded_events_as_vllm_032_sends_them():
    payload = pack([1733.5, [
        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": list(range(32)),
         "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": None,
         "group_idx": 0, "kv_cache_spec_kind": "full_attention", "kv_cache_spec_sliding_window": None},
        {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU", "group_idx": 0},
        {"type": "AllBlocksCleared"},
    ], 0])
    batch = decode_payload(payload)
    assert batch.ts == 1733.5 and batch.dp_rank == 0
    stored, removed, cleared = batch.events
    assert stored == BlockStored((11, 12), None, list(range(32)), 16, "GPU", None)
    assert removed == BlockRemoved((12,), "GPU")
    assert cleared == AllBlocksCleared()


def test_positional_events_of_older_vllm():
    payload = pack([2.0, [
        ["BlockStored", [5], 4, list(range(16)), 16, None],  # before `medium` existed
        ["BlockStored", [6], 5, list(range(16)), 16, None, "CPU", "adapter-a"],
        ["BlockRemoved", [5]],
        ["AllBlocksCleared"],
    ]])
    batch = decode_payload(payload)
    assert batch.dp_rank is None
    assert batch.events[0] == BlockStored((5,), 4, list(range(16)), 16, None, None)
    assert batch.events[1].medium == "CPU" and batch.events[1].lora_name == "adapter-a"
    assert batch.events[2] == BlockRemoved((5,), None)
    assert isinstance(batch.events[3], AllBlocksCleared)


def test_hashes_as_uint64_negative_int64_and_bytes_are_one_identity_each():
    big = 2**64 - 5
    payload = pack([0.0, [
        {"type": "BlockStored", "block_hashes": [big, -5, b"\x01\x02"], "parent_block_hash": b"\xff",
         "token_ids": list(range(48)), "block_size": 16},
    ], None])
    (ev,) = decode_payload(payload).events
    assert ev.block_hashes[0] == ev.block_hashes[1] == big  # -5 as int64 is 2^64-5 as uint64
    assert ev.block_hashes[2] == 0x0102 and ev.parent_block_hash == 0xFF


def test_a_batch_sent_as_a_map_also_decodes():
    batch = decode_payload(pack({"ts": 1.0, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 2}))
    assert batch.dp_rank == 2 and isinstance(batch.events[0], AllBlocksCleared)


@pytest.mark.parametrize("payload", [
    b"\xc1not msgpack",
    pack("a string"),
    pack([1.0, "not a list"]),
    pack([1.0, [{"type": "Nope"}]]),
    pack([1.0, [["BlockStored", [1]]]]),
    pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1] * 16,
                 "block_size": 0}]]),
    pack([1.0, [{"type": "BlockRemoved", "block_hashes": ["not a hash"]}]]),
    pack(["soon", []]),
])
def test_malformed_payloads_raise_wire_error(payload):
    with pytest.raises(WireError):
        decode_payload(payload)


def test_sequence_frames():
    assert decode_seq((7).to_bytes(8, "big")) == 7
    assert decode_seq(b"\xff" * 8) == -1  # the end of a replay
    with pytest.raises(WireError):
        decode_seq(b"\x00\x01")
