"""Engine blocks become the router's own chained keys over the same tokens."""

import random

import pytest

from router.kvevents.apply import TableWriter
from router.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored
from router.request.hashing import root_seed, token_block_keys
from router.state.precise import BlockTable, EventResidency


def tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(2**32) for _ in range(n)]


def writer(router_block=16, capacity=10_000):
    table = BlockTable(capacity)
    table.fresh = True
    return TableWriter(table, "m", router_block), table


def test_keys_of_events_equal_request_keys_across_events_linked_by_parent():
    w, table = writer()
    prompt = tokens(16 * 5)
    w.apply([BlockStored((101, 102), None, prompt[:32], 16)])
    w.apply([BlockStored((103, 104, 105), 102, prompt[32:], 16)])  # a later step extends the chain
    expected = token_block_keys(prompt, 16, root_seed("m"), 100)
    assert table.depth(expected, 0.8) == 5
    assert [table.last_key(h) for h in (101, 102, 103, 104, 105)] == expected
    other = token_block_keys(tokens(80, seed=1), 16, root_seed("m"), 100)
    assert table.depth(other, 0.8) == 0


def test_an_engine_block_of_several_router_blocks():
    w, table = writer(router_block=16)
    prompt = tokens(128 * 2)
    w.apply([BlockStored((1, 2), None, prompt, 128)])  # vLLM CPU: 128-token blocks
    expected = token_block_keys(prompt, 16, root_seed("m"), 100)
    assert table.depth(expected, 0.8) == 16


def test_block_size_the_router_block_does_not_divide_is_refused():
    w, table = writer(router_block=16)
    w.apply([BlockStored((1,), None, tokens(24), 24)])
    assert len(table) == 0 and w.counters.refused == 1


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "7", None])
def test_a_token_id_that_is_not_a_uint32_refuses_the_event_and_stores_nothing(bad):
    w, table = writer()
    ids = tokens(32)
    ids[20] = bad
    w.apply([BlockStored((1, 2), None, ids, 16)])
    assert len(table) == 0 and w.counters.refused == 1 and w.counters.stored_blocks == 0
    w.apply([BlockStored((3,), None, tokens(16), 16)])  # the writer goes on
    assert len(table) == 1


def test_unknown_parent_is_an_orphan_and_removal_and_clear_forget():
    w, table = writer()
    prompt = tokens(48)
    w.apply([BlockStored((9,), 777, prompt[:16], 16)])
    assert len(table) == 0 and w.counters.orphans == 1
    w.apply([BlockStored((1, 2, 3), None, prompt, 16)])
    keys = token_block_keys(prompt, 16, root_seed("m"), 100)
    w.apply([BlockRemoved((3,), "GPU")])  # the engine evicted the tail block
    assert table.depth(keys, 0.8) == 2
    w.apply([BlockRemoved((1,), None)])  # and then the head: nothing leads any more
    assert table.depth(keys, 0.8) == 0
    w.apply([AllBlocksCleared()])
    assert len(table) == 0


def test_offloaded_blocks_count_for_less_and_both_tiers_are_tracked():
    w, table = writer()
    prompt = tokens(64)
    keys = token_block_keys(prompt, 16, root_seed("m"), 100)
    w.apply([BlockStored((1, 2, 3, 4), None, prompt, 16)])
    w.apply([BlockStored((3, 4), 2, prompt[32:], 16, medium="CPU")])  # offloaded copies
    w.apply([BlockRemoved((3, 4), "GPU")])  # evicted from GPU, still in CPU memory
    assert table.depth(keys, 0.5) == 2 + 0.5 + 0.5
    w.apply([BlockRemoved((4,), "CPU")])
    assert table.depth(keys, 0.5) == 2.5


def test_a_lora_block_chains_from_the_adapter_name():
    w, table = writer()
    prompt = tokens(32)
    w.apply([BlockStored((1, 2), None, prompt, 16, lora_name="adapter")])
    assert table.depth(token_block_keys(prompt, 16, root_seed("adapter"), 100), 0.8) == 2
    assert table.depth(token_block_keys(prompt, 16, root_seed("m"), 100), 0.8) == 0


def test_same_tokens_under_two_engine_hashes_stay_held_until_both_go():
    w, table = writer()
    prompt = tokens(16)
    keys = token_block_keys(prompt, 16, root_seed("m"), 100)
    w.apply([BlockStored((1,), None, prompt, 16), BlockStored((2,), None, prompt, 16)])  # e.g. two cache salts
    w.apply([BlockRemoved((1,))])
    assert table.depth(keys, 0.8) == 1
    w.apply([BlockRemoved((2,))])
    assert table.depth(keys, 0.8) == 0


def test_table_capacity_forgets_the_oldest_stored():
    w, table = writer(capacity=16)
    a, b = tokens(16 * 16, seed=1), tokens(16 * 4, seed=2)
    w.apply([BlockStored(tuple(range(100, 116)), None, a, 16)])
    w.apply([BlockStored(tuple(range(200, 204)), None, b, 16)])
    assert len(table) == 16 and table.overflow == 4
    assert table.depth(token_block_keys(a, 16, root_seed("m"), 100), 0.8) == 0  # its head went first
    assert table.depth(token_block_keys(b, 16, root_seed("m"), 100), 0.8) == 4


def test_residency_matched_leaves_out_stale_instances_and_takes_the_best_rank():
    res = EventResidency(1000)
    prompt = tokens(48)
    keys = token_block_keys(prompt, 16, root_seed("m"), 100)
    r0, r1 = res.table("a", 0), res.table("a", 1)
    TableWriter(r0, "m", 16).apply([BlockStored((1,), None, prompt[:16], 16)])
    TableWriter(r1, "m", 16).apply([BlockStored((5, 6, 7), None, prompt, 16)])
    res.table("b")
    r0.fresh = r1.fresh = True
    assert res.matched(keys, ["a", "b", "c"]) == {"a": 3}  # b is stale (never synced), c has no events
    r0.fresh = False
    assert res.matched(keys, ["a"]) == {}


def test_the_raw_fast_path_and_the_decoder_build_the_same_table():
    import msgpack

    from router.kvevents.wire import WireError, decode_batch_raw, decode_payload

    prompt = tokens(96)
    raw = [
        {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": prompt[:32],
         "block_size": 16, "medium": "GPU"},
        {"type": "BlockStored", "block_hashes": [b"\x03", b"\x04"], "parent_block_hash": 2, "token_ids": prompt[32:64],
         "block_size": 16},  # bytes hashes: the decoder's path
        ["BlockStored", [5, 6], 4, prompt[64:], 16, None, "CPU"],  # positional: the decoder's path
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
        ["BlockRemoved", [6], "CPU"],
    ]
    payload = msgpack.packb([0.0, raw, 0], use_bin_type=True)
    fast, slow = writer(), writer()
    fast[0].apply_raw(decode_batch_raw(payload)[1])
    slow[0].apply(decode_payload(payload).events)
    keys = token_block_keys(prompt, 16, root_seed("m"), 100)
    assert fast[1].depth(keys, 0.5) == slow[1].depth(keys, 0.5) == 1  # block 2 left the GPU
    assert len(fast[1]) == len(slow[1]) == 4
    assert fast[0].counters == slow[0].counters
    bad = msgpack.packb([0.0, [{"type": "BlockRemoved", "block_hashes": ["x"]}], 0])
    with pytest.raises(WireError):
        fast[0].apply_raw(decode_batch_raw(bad)[1])
