"""Block prefix cache semantics: full blocks, chained hashes, pinning, LRU."""

from __future__ import annotations

import pytest

from router.tools.emulator.kvcache import KVCache, block_hashes

BS = 4


def fill(cache: KVCache, tokens: list[int]) -> list[int]:
    """Allocate and publish every full block of ``tokens``; returns block ids."""
    hashes = block_hashes(tokens, BS)
    hit = cache.match(hashes)
    ids = cache.acquire(hashes[:hit]) + cache.allocate(len(hashes) - hit)
    for bid, h in zip(ids, hashes):
        cache.commit(bid, h)
    return ids


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(11)), BS)) == 2
    assert block_hashes(list(range(3)), BS) == []


def test_chained_hashes_need_the_whole_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)
    b = block_hashes([9, 9, 9, 9, 5, 6, 7, 8], BS)
    assert a[1] != b[1]  # same block content, different prefix
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS, salt="m1")[0] != \
        block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS, salt="m2")[0]


def test_hit_after_identical_prefix_and_miss_after_divergence() -> None:
    cache = KVCache(num_blocks=16, block_size=BS)
    ids = fill(cache, list(range(12)))
    cache.release(ids)
    assert cache.match(block_hashes(list(range(12)), BS)) == 3
    assert cache.match(block_hashes(list(range(8)) + [99, 98, 97, 96], BS)) == 2
    assert cache.match(block_hashes([7] + list(range(1, 12)), BS)) == 0


def test_partial_tail_is_not_cached() -> None:
    cache = KVCache(num_blocks=16, block_size=BS)
    cache.release(fill(cache, list(range(10))))  # 2 full blocks + 2 tokens
    assert cache.cached_blocks == 2
    assert cache.match(block_hashes(list(range(12)), BS)) == 2


def test_lru_eviction_under_pressure_keeps_pinned_blocks() -> None:
    cache = KVCache(num_blocks=4, block_size=BS)
    old = fill(cache, [1] * 8)            # 2 blocks, released -> evictable
    cache.release(old)
    pinned = fill(cache, [2] * 8)         # 2 blocks, still referenced
    assert cache.available == 2
    fresh = cache.allocate(2)             # must evict the released ones
    assert cache.evictions == 2
    assert cache.match(block_hashes([1] * 8, BS)) == 0
    assert cache.match(block_hashes([2] * 8, BS)) == 2
    with pytest.raises(MemoryError):
        cache.allocate(1)
    cache.release(fresh)
    cache.release(pinned)
    assert cache.usage == 0.0


def test_tail_blocks_are_evicted_first() -> None:
    cache = KVCache(num_blocks=3, block_size=BS)
    cache.release(fill(cache, list(range(12))))
    cache.allocate(1)
    # The last block of the sequence went first; the leading prefix survives.
    assert cache.match(block_hashes(list(range(12)), BS)) == 2


def test_usage_reservations_and_reset() -> None:
    cache = KVCache(num_blocks=10, block_size=BS)
    ids = fill(cache, list(range(8)))
    assert cache.usage == pytest.approx(0.2)
    cache.reserve(3)
    assert cache.available == 5
    cache.allocate_reserved()
    assert cache.reserved == 2 and cache.usage == pytest.approx(0.3)
    cache.unreserve(2)
    cache.release(ids)
    assert cache.cached_blocks == 2
    assert cache.reset_prefix_cache() == 2
    assert cache.cached_blocks == 0
