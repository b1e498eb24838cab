"""The emulator's engine reports what its prefix cache stores, evicts and drops, and its
publisher frames it as vLLM does (decoded here by the router's own decoder)."""

from __future__ import annotations

import msgpack
import pytest

from router.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, decode_payload
from router.tools.emulator.engine import Engine, EngineConfig
from router.tools.emulator.kv_events import KVEventLog, encode_batch
from router.tools.emulator.kvcache import block_hashes
from router.tools.emulator.perf import get_profile
from router.tools.emulator.request import EngineRequest


def engine(num_blocks: int = 16) -> tuple[Engine, KVEventLog]:
    e = Engine(EngineConfig(num_blocks=num_blocks, block_size=4), get_profile("llama3-8b-h100"))
    e.kv.events = KVEventLog(4)
    return e, e.kv.events


def run(e: Engine, prompt: list[int], rid: str, now: float = 0.0) -> float:
    e.add_request(EngineRequest(rid, prompt, 1), now)
    while e.has_work():
        now += e.step(now).duration
    return now


def test_stored_blocks_chain_by_parent_and_carry_their_tokens() -> None:
    e, log = engine()
    prompt = list(range(100, 118))  # 4 full blocks + 2 tokens
    run(e, prompt, "r1")
    events = log.take()
    hashes = block_hashes(prompt, 4)
    stored = [ev for ev in events if ev[0] == "BlockStored"]
    assert [h for ev in stored for h in ev[1]] == hashes
    assert stored[0][2] is None and stored[0][3] == prompt[: 4 * len(stored[0][1])]
    # the same prefix again publishes nothing new (hit), a longer one only its new blocks
    run(e, prompt + list(range(6)), "r2", 1.0)
    (again,) = [ev for ev in log.take() if ev[0] == "BlockStored"]
    assert again[2] == hashes[-1] and again[3] == (prompt + list(range(6)))[16:24]


def test_evictions_and_a_full_reset_are_reported() -> None:
    e, log = engine(num_blocks=6)
    run(e, list(range(20)), "r1")
    run(e, list(range(500, 520)), "r2", 1.0)  # needs the room: the first prompt's blocks go
    removed = [h for ev in log.take() if ev[0] == "BlockRemoved" for h in ev[1]]
    assert removed and set(removed) <= set(block_hashes(list(range(20)), 4))
    e.reset_prefix_cache()
    assert [ev[0] for ev in log.take()] == ["AllBlocksCleared"]


@pytest.mark.parametrize("positional", [False, True])
def test_both_encodings_decode_with_the_routers_decoder(positional: bool) -> None:
    events = [("BlockStored", [1, 2], None, list(range(8)), 4), ("BlockRemoved", [2], None, [], 0),
              ("AllBlocksCleared", [], None, [], 0)]
    payload = encode_batch(events, positional, ts=5.0)
    raw = msgpack.unpackb(payload)
    assert isinstance(raw[1][0], list if positional else dict)
    batch = decode_payload(payload)
    assert batch.events == [BlockStored((1, 2), None, list(range(8)), 4, "GPU", None), BlockRemoved((2,), "GPU"),
                            AllBlocksCleared()]
