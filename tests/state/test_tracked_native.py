"""The sidecar's engine-block table in C (router/state/_tracked.c) against the Python
``TrackedTable``: the same random operation streams (capacity overflow, both tiers, a block
re-stored on its other tier, keys shared across blocks, clears, the edge keys 0, 1 and
2**64-1) leave the same blocks in the same LRU order, the same key counts, the same answers
to every query and the same deltas; its memory follows what it holds; bad input is refused."""

from __future__ import annotations

import random
import sys

import pytest

from router.kvevents.apply import TableWriter
from router.request.hashing import chain_keys, pack_tokens, root_seed, token_block_keys
from router.state.precise import BlockTable
from router.state.precise_mirror import TableDelta, TrackedTable

native = pytest.importorskip("router.state.precise_native")
if not native.NATIVE_TABLES_BUILT:
    pytest.skip("router.state._tracked is not built here (pip install -e . builds it)", allow_module_level=True)
NativeTrackedTable = native.NativeTrackedTable

GPU, OFFLOAD = 1, 2
EDGE = [0, 1, 2, 2**63, 2**64 - 2, 2**64 - 1]


def entries(table: TrackedTable) -> list[tuple[int, tuple[int, ...], int]]:
    return [(h, keys, tiers) for h, (keys, tiers) in table._blocks.items()]


def same_delta(a: TableDelta | None, b: TableDelta | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert (a.fresh, a.size, a.overflow, a.reset) == (b.fresh, b.size, b.overflow, b.reset)
    for name in ("added_gpu", "removed_gpu", "added_offload", "removed_offload"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.typecode == y.typecode == "Q"
        assert sorted(x) == sorted(y), name
        assert len(set(x)) == len(x)


def check(py: TrackedTable, c: NativeTrackedTable, rng: random.Random, hashes: list[int], keys: list[int]) -> None:
    assert len(c) == len(py) and c.overflow == py.overflow and c.fresh == py.fresh
    assert c.entries() == entries(py)
    assert c.held() == (set(py._gpu), set(py._offload))
    for h in rng.sample(hashes, 8):
        assert c.keys_of(h) == py.keys_of(h) and c.last_key(h) == py.last_key(h)
    for _ in range(6):
        probe = [rng.choice(keys) for _ in range(rng.randrange(0, 6))]
        assert c.depth(probe, 0.8) == py.depth(probe, 0.8)
        if probe:
            assert c.holds(probe[0]) == py.holds(probe[0])


def random_op(rng: random.Random, py: TrackedTable, c: NativeTrackedTable, hashes: list[int], keys: list[int]) -> None:
    op, tier = rng.random(), GPU if rng.random() < 0.6 else OFFLOAD
    if op < 0.3:
        n = rng.randrange(1, 7)
        hs = [rng.choice(hashes) for _ in range(n)]
        ks = [tuple(rng.choice(keys) for _ in range(rng.choice((1, 1, 2, 4)))) for _ in range(rng.randrange(n - 1, n + 2))]
        py.store_run(hs, ks, tier)
        c.store_run(hs, ks, tier)
    elif op < 0.55:
        n, per = rng.randrange(0, 7), rng.choice((1, 1, 2, 3))
        hs = [rng.choice(hashes) for _ in range(n)]
        flat = [rng.choice(keys) for _ in range(rng.randrange(0, (n + 1) * per))]
        py.store_flat(hs, flat, per, tier)
        c.store_flat(hs, flat, per, tier)
    elif op < 0.85:
        hs = [rng.choice(hashes) for _ in range(rng.randrange(0, 7))]
        assert c.remove_run(hs, tier) == py.remove_run(hs, tier)
    elif op < 0.91:
        h, ks = rng.choice(hashes), tuple(rng.choice(keys) for _ in range(rng.choice((1, 2))))
        py.store(h, ks, tier)
        c.store(h, ks, tier)
    elif op < 0.97:
        h = rng.choice(hashes)
        assert c.remove(h, tier) == py.remove(h, tier)
    elif op < 0.99:
        py.fresh = c.fresh = rng.random() < 0.7
    else:
        py.clear()
        c.clear()


@pytest.mark.parametrize("seed", range(30))
def test_random_streams_leave_what_the_python_table_has_and_ship_the_same_deltas(seed):
    rng = random.Random(seed)
    capacity = rng.choice((1, 4, 16, 48))
    hashes = [rng.getrandbits(64) for _ in range(rng.choice((20, 80)))] + EDGE
    keys = [rng.getrandbits(64) for _ in range(rng.choice((10, 60, 200)))] + EDGE  # few: shared across blocks
    py, c = TrackedTable(capacity), NativeTrackedTable(capacity)
    assert c.capacity == py.capacity == capacity
    same_delta(c.take_delta(), py.take_delta())  # both touched by their construction
    for _ in range(60):
        for _ in range(rng.randrange(0, 25)):
            random_op(rng, py, c, hashes, keys)
            check(py, c, rng, hashes, keys)
        same_delta(c.take_delta(), py.take_delta())
        same_delta(c.take_delta(), py.take_delta())  # nothing since: both None
    assert py.overflow > 0 or capacity >= 48


@pytest.mark.parametrize("seed", range(12))
def test_the_untracked_table_in_process_answers_as_the_python_block_table(seed):
    """``engine_table`` (no sidecar): the C table made with track=False holds what
    ``BlockTable`` holds, answers every query alike, notes no changes (take refuses) and so
    keeps no change sets at all."""
    rng = random.Random(seed)
    capacity = rng.choice((1, 4, 16, 48))
    hashes = [rng.getrandbits(64) for _ in range(rng.choice((20, 80)))] + EDGE
    keys = [rng.getrandbits(64) for _ in range(rng.choice((10, 60, 200)))] + EDGE
    py, c = TrackedTable(capacity), native.engine_table()(capacity)
    assert isinstance(c, NativeTrackedTable)
    for _ in range(600):
        random_op(rng, py, c, hashes, keys)
        check(py, c, rng, hashes, keys)
    with pytest.raises(TypeError):
        c.take()
    assert native.engine_table(native=False) is BlockTable


def test_the_untracked_table_keeps_no_change_sets():
    untracked, tracked = native.engine_table()(100_000), NativeTrackedTable(100_000)
    for table in (untracked, tracked):
        table.store_flat(list(range(1, 20_001)), list(range(1, 20_001)), 1, GPU)
    assert untracked.held() == tracked.held() and len(untracked) == len(tracked) == 20_000
    # the tracked one noted 20,000 added keys (8 bytes a slot at a load of at most 3/4)
    assert sys.getsizeof(tracked) - sys.getsizeof(untracked) >= 20_000 * 8


def test_a_writer_over_either_table_ships_the_same_deltas_for_vllm_events():
    """TableWriter's real path (chain keys over token ids, engine blocks of 2 router keys,
    parents, orphans, removals, clears) into both tables."""
    rng = random.Random(7)
    py, c = TableWriter(TrackedTable(40), "m", 16), TableWriter(NativeTrackedTable(40), "m", 16)
    stored: list[int] = []
    for step in range(600):
        r = rng.random()
        if r < 0.55 or not stored:
            n = rng.randrange(1, 4)
            hs = [rng.getrandbits(64) for _ in range(n)]
            parent = rng.choice(stored) if stored and rng.random() < 0.6 else (rng.getrandbits(64) if r < 0.05 else None)
            event = {"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent, "block_size": 32,
                     "token_ids": [rng.randrange(50_000) for _ in range(32 * n)],
                     "medium": rng.choice(("GPU", "GPU", "CPU", None))}
            stored += hs
        elif r < 0.58:  # a token id no uint32 holds: refused by both, nothing stored
            event = {"type": "BlockStored", "block_hashes": [rng.getrandbits(64)], "parent_block_hash": None,
                     "block_size": 32, "token_ids": [5] * 31 + [rng.choice((-1, 2**32, 2**70))]}
        elif r < 0.97:
            event = {"type": "BlockRemoved", "block_hashes": rng.sample(stored, min(len(stored), 3)),
                     "medium": rng.choice(("GPU", "CPU"))}
        else:
            event = {"type": "AllBlocksCleared"}
        py.apply_raw([event])
        c.apply_raw([event])
        if step % 7 == 0:
            same_delta(c.table.take_delta(), py.table.take_delta())  # type: ignore[attr-defined]
    assert c.counters == py.counters and c.counters.orphans > 0 and c.counters.refused > 0
    assert c.table.entries() == entries(py.table)  # type: ignore[attr-defined, arg-type]


def test_memory_follows_what_it_holds():
    table = NativeTrackedTable(2000)
    empty = sys.getsizeof(table)
    for i in range(50):  # a full table churned through: a steady size, not a growing one
        base = i * 1000
        table.store_flat(list(range(base, base + 1000)), list(range(base, base + 2000)), 2, GPU)
        if i == 5:
            steady = sys.getsizeof(table)
        table.take_delta()
    assert len(table) == 2000 and table.overflow == 48_000
    assert sys.getsizeof(table) < 1.5 * steady
    table.remove_run(list(range(48_000, 50_000)), GPU)
    table.take_delta()
    assert len(table) == 0 and sys.getsizeof(table) < steady / 2
    table.clear()
    assert sys.getsizeof(table) < 2 * empty


def test_bad_input_is_refused_and_leaves_the_table_usable():
    table = NativeTrackedTable(8)
    with pytest.raises(OverflowError):
        table.store_flat([2**64], [1], 1, GPU)
    with pytest.raises(OverflowError):
        table.store_run([1], [(-1,)], GPU)
    with pytest.raises(TypeError):
        table.store_flat(["a"], [1], 1, GPU)
    with pytest.raises(TypeError):
        table.store_run([1], [1], GPU)  # a block's keys are a tuple
    with pytest.raises(ValueError):
        table.store_run([1], [()], GPU)
    with pytest.raises(ValueError):
        table.store_flat([1], [1], 0, GPU)
    with pytest.raises(ValueError):
        table.remove_run([1], 3)
    with pytest.raises(ValueError):
        NativeTrackedTable(-1)
    with pytest.raises(TypeError):
        table.holds("k")
    assert table.remove_run([-5, 2**70], GPU) == 0  # no such block
    assert table.keys_of(-1) is None and not table.holds(2**64)
    table.store_flat([5], [9], 1, GPU)
    assert table.keys_of(5) == (9,) and table.depth([9, 3], 0.8) == 1.0


def test_keys_chained_in_c_are_the_request_chain():
    """store_tokens hashes with the xxHash library's own XXH3 (from the xxhash package's
    extension): the keys of a request over the same tokens, seeded by a parent's last key."""
    assert native.NATIVE_HASHING, "the xxhash package's extension no longer exports XXH3_64bits_withSeed"
    rng = random.Random(3)
    table = NativeTrackedTable(100)
    tokens = [rng.randrange(2**32) for _ in range(32 * 5 + 7)]  # 5 engine blocks of 32, a partial one
    root = root_seed("m", 0)
    writer = TableWriter(table, "m", 16)
    assert table.store_tokens([11, 12, 13, 14, 15, 16], tokens, 32, 2, writer.root(None), GPU) == 5
    request = token_block_keys(tokens, 16, root, 100)
    assert [k for h in (11, 12, 13, 14, 15) for k in table.keys_of(h)] == request[:10]
    assert table.keys_of(16) is None and table.last_key(15) == request[9]
    child = [rng.randrange(50_000) for _ in range(16)]
    assert table.store_tokens([21], child, 16, 1, table.last_key(15), OFFLOAD) == 1
    assert table.keys_of(21) == tuple(token_block_keys(tokens[:160] + child, 16, root, 100)[10:])
    assert table.keys_of(21) == tuple(chain_keys(pack_tokens(child), 64, 1, request[9]))


def test_a_token_id_no_uint32_holds_stores_nothing():
    table = NativeTrackedTable(100)
    table.take_delta()
    for bad in (-1, 2**32, 2**64, 1.5, "7", None):
        with pytest.raises((OverflowError, TypeError)):
            table.store_tokens([1, 2], [3] * 16 + [bad] + [4] * 15, 16, 1, 9, GPU)
    with pytest.raises(OverflowError):
        table.store_tokens([2**64], [3] * 16, 16, 1, 9, GPU)  # every hash checked before any store
    assert len(table) == 0 and table.take_delta() is None
    with pytest.raises(ValueError):
        table.store_tokens([1], [3] * 16, 16, 3, 9, GPU)  # per must divide the block
    assert table.store_tokens([1, 2], [3] * 16 + [7] * 15, 16, 1, 9, GPU) == 1  # the partial block is not one
