"""The captured real vLLM 0.32 KV-event frames (tests/fixtures) say what the decoder must handle."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack

DOC = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.32-kv-events.json").read_text())


def batches() -> list[tuple[int, list]]:
    return [(f["seq"], msgpack.unpackb(base64.b64decode(f["payload_b64"]), raw=False, strict_map_key=False))
            for f in DOC["frames"]]


def test_frames_are_map_encoded_events_in_a_positional_batch() -> None:
    seqs = [seq for seq, _ in batches()]
    assert seqs == list(range(len(seqs)))  # a fresh publisher counts from 0, no gaps
    kinds = set()
    for _, batch in batches():
        ts, events, rank = batch  # [timestamp, events, data_parallel_rank]
        assert isinstance(ts, float) and rank == 0
        for event in events:
            kinds.add(event["type"])
            if event["type"] == "BlockStored":
                assert event["block_size"] == 128 and len(event["token_ids"]) == 128 * len(event["block_hashes"])
                assert all(isinstance(h, int) and 0 <= h < 2**64 for h in event["block_hashes"])
    assert kinds == {"BlockStored", "BlockRemoved"}


def test_an_extension_chains_to_its_prefix() -> None:
    stored = [e for _, b in batches() for e in b[1] if e["type"] == "BlockStored"]
    root, child = stored[0], stored[1]
    assert root["parent_block_hash"] is None and len(root["block_hashes"]) == 2
    assert child["parent_block_hash"] == root["block_hashes"][-1]
    assert child["token_ids"][:5] == [(256 + i) * 7 % 2000 + 3 for i in range(5)]
