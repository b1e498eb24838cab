"""The store tier of residency: what the router believes a shared KV store holds.

Why: with a store behind the engines (Mooncake Store, LMCache remote), what was computed
anywhere can be loaded anywhere, so every prefix the router sent to an engine is, as far as
it knows, in the store too. The belief is a residency index with one holder, bounded like
an instance's: at most ``capacity`` block keys (the store's capacity over the router's block
size, and never more than ``max_entries``), least recently used first out, each entry
expiring after ``ttl_s``; its LRU position gives a confidence, as for instances. It lives in
each router process (replicas each learn from their own traffic; a prefix another replica
stored is priced as a recompute until this one routes it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.config.kvstore import KVStoreConfig
from router.state.residency import ResidencyIndex

_STORE = "kv_store"


@dataclass(frozen=True, slots=True)
class StoreHit:
    """The leading blocks of one request the store holds, and what loading them costs."""

    blocks: int
    confidence: float
    bytes_per_s: float
    bytes_per_token: int  # the store's default; an instance's own kv_bytes_per_token wins
    setup_s: float


class StoreTier:
    def __init__(self, capacity: int, bytes_per_s: float, bytes_per_token: int, setup_s: float = 0.0,
                 ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1 or bytes_per_s <= 0 or bytes_per_token < 1:
            raise ValueError("a store tier needs a capacity, a bandwidth and bytes per token")
        self.capacity = capacity
        self._index = ResidencyIndex(ttl_s)
        self._bytes_per_s, self._bytes_per_token, self._setup_s = bytes_per_s, bytes_per_token, setup_s
        self._clock = clock

    def hit(self, keys: Sequence[int]) -> StoreHit | None:
        """What the store holds of ``keys``, or None when nothing (the request prices as without a store)."""
        blocks = self._index.matched(keys, (_STORE,), self._clock())[_STORE]
        if not blocks:
            return None
        confidence = self._index.confidence(_STORE, keys[blocks - 1])
        return StoreHit(blocks, confidence, self._bytes_per_s, self._bytes_per_token, self._setup_s)

    def record(self, keys: Sequence[int]) -> None:
        """``keys`` were computed (or loaded) somewhere: the engine writes them to the store."""
        if keys:
            self._index.record(_STORE, keys, self.capacity, self._clock())

    def __len__(self) -> int:
        return int(round(self._index.fill(_STORE) * self.capacity))


def build_store_tier(kv_store: KVStoreConfig, pd_bytes_per_token: int, block_tokens: int,
                     clock: Callable[[], float] = time.monotonic) -> StoreTier | None:
    """The tier ``kv_store`` describes, or None when the engines share no store."""
    if not kv_store.enabled:
        return None
    capacity = max(1, min(kv_store.max_entries, kv_store.capacity_tokens // max(1, block_tokens)))
    return StoreTier(capacity, kv_store.bandwidth_gbps * 1e9 / 8, kv_store.token_bytes(pd_bytes_per_token),
                     kv_store.setup_s, kv_store.ttl_s, clock)
