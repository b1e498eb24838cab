"""A sidecar's tracked tables and the loop's mirrors: the mirror holds exactly the keys
the full table counts, whatever sequence of stores, removals, evictions and clears."""

import random

import pytest

from router.state.precise import BlockTable
from router.state.precise_mirror import MirrorTable, TrackedTable

GPU, OFFLOAD = 1, 2


def held(table: BlockTable) -> tuple[set[int], set[int]]:
    return set(table._gpu), set(table._offload)


def random_ops(rng: random.Random, reference: BlockTable, tracked: TrackedTable, steps: int):
    """The same random operations on both tables; keys collide across blocks on purpose
    (refcounts), hashes repeat (tier changes, re-stores), the capacity is small (evictions)."""
    for _ in range(steps):
        op = rng.random()
        tier = GPU if rng.random() < 0.7 else OFFLOAD
        if op < 0.5:
            n = rng.randrange(1, 6)
            hashes = [rng.randrange(200) for _ in range(n)]
            keys = [tuple(rng.randrange(300) for _ in range(rng.choice((1, 2)))) for _ in range(n)]
            for table in (reference, tracked):
                table.store_run(hashes, keys, tier)
        elif op < 0.85:
            hashes = [rng.randrange(200) for _ in range(rng.randrange(1, 6))]
            assert reference.remove_run(hashes, tier) == tracked.remove_run(hashes, tier)
        elif op < 0.93:
            h, k = rng.randrange(200), (rng.randrange(300),)
            for table in (reference, tracked):
                table.store(h, k, tier)
        elif op < 0.99:
            h = rng.randrange(200)
            assert reference.remove(h, tier) == tracked.remove(h, tier)
        else:
            reference.clear()
            tracked.clear()


@pytest.mark.parametrize("seed", range(20))
def test_the_mirror_holds_what_the_table_counts_after_every_delta(seed, native_key_sets):
    rng = random.Random(seed)
    reference, tracked, mirror = BlockTable(64), TrackedTable(64), MirrorTable(64, native=native_key_sets)
    assert mirror.native == native_key_sets
    for _ in range(40):
        random_ops(rng, reference, tracked, rng.randrange(0, 30))
        tracked.fresh = rng.random() < 0.8
        delta = tracked.take_delta()
        assert delta is not None  # setting fresh touched it
        mirror.apply(delta)
        assert held(tracked) == held(reference)
        assert mirror.held() == held(reference)
        assert len(mirror) == len(reference) and mirror.overflow == reference.overflow
        assert mirror.fresh == tracked.fresh
        for _ in range(5):
            keys = [rng.randrange(300) for _ in range(rng.randrange(1, 6))]
            assert mirror.depth(keys, 0.8) == reference.depth(keys, 0.8)
            assert mirror.holds(keys[0]) == reference.holds(keys[0])
    assert reference.overflow > 0  # the capacity was exercised


def test_a_key_stored_and_removed_between_deltas_is_not_shipped():
    table = TrackedTable(100)
    table.take_delta()
    table.store_run([1], [(10,)], GPU)
    table.remove_run([1], GPU)
    delta = table.take_delta()
    assert delta is not None and not delta.added_gpu and not delta.removed_gpu
    assert table.take_delta() is None  # nothing since


def test_a_block_carrying_a_key_twice_is_netted_like_any_other():
    table = TrackedTable(1)
    table.take_delta()
    table.store(1, (10, 10), GPU)
    table.store(2, (11,), GPU)  # evicts block 1: key 10 came and went between two deltas
    delta = table.take_delta()
    assert delta is not None and list(delta.added_gpu) == [11] and not delta.removed_gpu


def test_a_shared_key_leaves_the_mirror_only_with_its_last_block():
    table, mirror = TrackedTable(100), MirrorTable(100)
    table.store_run([1, 2], [(10,), (10,)], GPU)  # two engine blocks, one router key (e.g. LoRA salts)
    mirror.apply(table.take_delta())
    table.remove_run([1], GPU)
    mirror.apply(table.take_delta())
    assert mirror.depth([10], 0.8) == 1.0
    table.remove_run([2], GPU)
    mirror.apply(table.take_delta())
    assert mirror.depth([10], 0.8) == 0.0


def test_a_clear_resets_the_mirror_before_what_follows():
    table, mirror = TrackedTable(100), MirrorTable(100)
    table.store_run([1, 2], [(10,), (11,)], GPU)
    mirror.apply(table.take_delta())
    table.clear()
    table.store_run([3], [(12,)], OFFLOAD)
    delta = table.take_delta()
    assert delta.reset
    mirror.apply(delta)
    assert mirror.depth([10], 0.8) == 0.0 and mirror.depth([12], 0.5) == 0.5 and len(mirror) == 1


def test_a_mirror_is_never_written_like_a_table():
    with pytest.raises(TypeError):
        MirrorTable(10).store_run([1], [(1,)], GPU)


def test_the_first_blocks_holders_are_found_in_mirrors_too():
    """Candidate pruning asks ``EventResidency.holders``: with the sidecar on, every table
    is a mirror, and an instance the events say holds the key must be named."""
    from array import array

    from router.state.precise import EventResidency
    from router.state.precise_mirror import TableDelta

    residency = EventResidency(100, factory=MirrorTable)
    residency.table("a").apply(TableDelta(True, 1, 0, False, array("Q", [42])))
    residency.table("b").apply(TableDelta(True, 1, 0, False, added_offload=array("Q", [42])))
    residency.table("c").apply(TableDelta(True, 1, 0, False, array("Q", [7])))
    assert residency.holders(42) == ["a", "b"]
