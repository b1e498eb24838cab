"""The C extension's uint64 key set (router/state/_keyset.c) against a Python set: random
add / remove / clear streams from buffers and single keys leave the same members, through
growth, removals shifting probe runs back (wrapping around the array's end), shrinking, the keys 0, 1 and 2**64-1, duplicates in
one buffer; its memory follows what it holds; bad input is refused with the set unchanged."""

from __future__ import annotations

import random
from array import array

import pytest

keyset = pytest.importorskip("router.state._keyset", reason="router.state._keyset is not built here")
KeySet, depth = keyset.KeySet, keyset.depth

EDGE = [0, 1, 2, 3, 2**63, 2**64 - 2, 2**64 - 1]


def draw(rng: random.Random, universe: list[int], n: int) -> list[int]:
    """n keys, mostly from a small universe (so removals hit and slots are reused), some
    random 64-bit ones, the edge keys now and then; duplicates on purpose."""
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(rng.choice(universe) if r < 0.8 else rng.choice(EDGE) if r < 0.85 else rng.getrandbits(64))
    return out


def check(ks, ref: set[int], rng: random.Random) -> None:
    assert len(ks) == len(ref)
    assert set(ks) == ref and sorted(ks.tolist()) == sorted(ref)
    for key in rng.sample(sorted(ref), min(len(ref), 50)) + draw(rng, sorted(ref) or [5], 50):
        assert (key in ks) == (key in ref)
    assert ks.capacity >= 16 and (ks.capacity & (ks.capacity - 1)) == 0
    assert len(ks) - sum(1 for k in (0, 1) if k in ref) <= ks.capacity * 3 // 4


@pytest.mark.parametrize("seed", range(25))
def test_random_streams_leave_the_members_a_python_set_has(seed):
    rng = random.Random(seed)
    universe = [rng.getrandbits(64) for _ in range(rng.choice((20, 300, 3000)))] + EDGE
    ks, ref = KeySet(), set()
    for _ in range(300):
        op = rng.random()
        keys = draw(rng, universe, rng.choice((0, 1, 5, 50, 500)))
        buf = array("Q", keys)
        start = rng.randrange(len(keys) + 1)
        stop = rng.randrange(start, len(keys) + 1)
        if op < 0.4:
            assert ks.add_keys(buf, start, stop) == len(set(keys[start:stop]) - ref)
            ref.update(keys[start:stop])
        elif op < 0.8:
            assert ks.remove_keys(buf, start, stop) == len(set(keys[start:stop]) & ref)
            ref.difference_update(keys[start:stop])
        elif op < 0.88:
            view = memoryview(buf.tobytes()).cast("Q")  # any uint64 buffer, not only array('Q')
            assert ks.add_keys(view) == len(set(keys) - ref)
            ref.update(keys)
        elif op < 0.96:
            for key in keys[:20]:
                if rng.random() < 0.5:
                    ks.add(key)
                    ref.add(key)
                else:
                    ks.discard(key)
                    ref.discard(key)
        elif op < 0.98:
            assert ks.remove_keys(keys) == len(set(keys) & ref)  # a list of ints too
            ref.difference_update(keys)
        else:
            ks.clear()
            ref.clear()
            assert ks.capacity == 16
        check(ks, ref, rng)


def test_churn_keeps_memory_following_what_is_held():
    ks, ref = KeySet(), set()
    rng = random.Random(1)
    live: list[int] = []
    for _ in range(20_000):  # a steady ~500 keys, stored and removed all the time
        key = rng.getrandbits(64)
        ks.add(key)
        live.append(key)
        ref.add(key)
        if len(live) > 500:
            old = live.pop(rng.randrange(len(live)))
            ks.discard(old)
            ref.discard(old)
    assert set(ks) == ref and ks.capacity <= 2048  # never more than 4x what is held at the peak
    ks.add_keys(array("Q", range(2, 200_002)))  # grows ...
    assert len(ks) == len(ref) + 200_000 and ks.capacity <= 4 * len(ks)
    assert ks.__sizeof__() >= 8 * ks.capacity
    ks.remove_keys(array("Q", range(2, 200_002)))  # ... and shrinks back
    assert set(ks) == ref and ks.capacity <= 2048


_M = 2**64 - 1


def unmix(h: int) -> int:
    """The key whose murmur3-finalizer mix (the table's index hash) is ``h``."""
    h ^= h >> 33
    h = (h * pow(0xC4CEB9FE1A85EC53, -1, 2**64)) & _M
    h ^= h >> 33
    h = (h * pow(0xFF51AFD7ED558CCD, -1, 2**64)) & _M
    return h ^ (h >> 33)


@pytest.mark.parametrize("seed", range(40))
def test_removals_inside_colliding_runs_that_wrap_keep_every_other_key_findable(seed):
    """Keys made to share home slots at the end of a 16-slot array, so their probe runs
    wrap to its start: whatever order they are removed in, a removal shifts back exactly
    the keys that may move and every key still held is found (a wrong shift loses one)."""
    rng = random.Random(seed)
    homes = [rng.choice((13, 14, 15, 0, 1)) for _ in range(rng.randrange(4, 12))]
    keys = [unmix((rng.getrandbits(40) << 4) | home) for home in homes]
    keys = [k for k in dict.fromkeys(keys) if k > 1]
    ks, ref = KeySet(), set()
    ks.add_keys(array("Q", keys))
    ref.update(keys)
    assert ks.capacity == 16
    for key in rng.sample(keys, len(keys)):
        ks.discard(key)
        ref.discard(key)
        assert all((k in ks) == (k in ref) for k in keys) and len(ks) == len(ref)
        if rng.random() < 0.3:  # re-adds land in the shifted runs
            back = rng.choice(keys)
            ks.add(back)
            ref.add(back)
    assert set(ks) == ref


def test_sequential_and_colliding_keys_still_spread():
    """Keys that differ only in high bits, or are consecutive, all stay findable (the table
    is indexed by a mix of the key, not its low bits)."""
    keys = [i << 40 for i in range(5000)] + list(range(10_000, 15_000))
    ks = KeySet(array("Q", keys))
    assert len(ks) == 10_000 and all(k in ks for k in keys) and (1 << 39) not in ks


def test_depth_counts_the_leading_run_like_the_tables_do():
    gpu, offload = KeySet([1, 2, 3, 0]), KeySet([4, 5, 2**64 - 1])
    for keys, want in (([1, 2, 3, 4, 5, 9, 1], 3 + 2 * 0.75), ([0, 2**64 - 1], 1.75), ([9, 1], 0.0), ([], 0.0),
                       ([1, -1, 2], 1.0), ([1, 2**64, 2], 1.0)):
        assert depth(keys, gpu, offload, 0.75) == want
        if all(0 <= k < 2**64 for k in keys):
            assert depth(array("Q", keys), gpu, offload, 0.75) == want
    assert depth((1, 2), gpu, offload, 0.5) == 2.0  # any sequence of ints


def test_bad_input_is_refused_and_leaves_the_set_as_it_was():
    ks = KeySet([5, 6])
    for bad in (array("q", [1]), array("I", [1]), b"12345678", memoryview(b"x" * 16).cast("d")):
        with pytest.raises(TypeError):
            ks.add_keys(bad)
    with pytest.raises(TypeError):
        ks.add_keys([7, "8"])  # 7 went in before the bad item; nothing else changed
    with pytest.raises(OverflowError):
        ks.add(-1)
    with pytest.raises(OverflowError):
        ks.add_keys([2**64])
    with pytest.raises(IndexError):
        ks.add_keys(array("Q", [1, 2]), 2, 1)
    with pytest.raises(TypeError):
        ks.add_keys([1, 2], 0, 1)  # bounds need a buffer
    with pytest.raises(TypeError):
        depth([1], ks, set(), 0.8)
    with pytest.raises(TypeError):
        "x" in ks  # noqa: B015
    assert sorted(ks) == [5, 6, 7] and -1 not in ks and 2**70 not in ks
    ks.discard(-1)
    ks.discard(2**64)
    assert ks.add_keys(array("Q", [9]), 0, 99) == 1  # stop past the end: up to the end
    assert sorted(ks) == [5, 6, 7, 9]
