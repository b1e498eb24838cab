"""Paged KV cache with block-level prefix caching (the vLLM model).

Why these rules: the router's whole value is predicting where a prompt's
prefix is cached, so the emulator must cache exactly like the real engines:

* KV lives in fixed-size blocks (default 16 tokens); a request owns
  ``ceil(kv_tokens / block_size)`` physical blocks.
* Only *full* blocks are cacheable. A full block is identified by a chained
  hash: ``h_i = xxh3(tokens of block i, seed=h_{i-1})``, so a block only
  matches when its whole prefix matches too.
* A prefix hit is the run of leading full blocks whose hashes are present
  when the request is scheduled.
* Blocks referenced by a running (or held) request are pinned; a block whose
  reference count drops to zero stays cached but becomes evictable, in LRU
  order (a request's tail blocks are released first so they go first).
* Allocation takes never-used/free blocks first and evicts the least recently
  released cached blocks when it must.

Capacity is counted in blocks. ``reserve`` lets the scheduler promise blocks
for a request's future decode tokens without allocating them yet, so admitted
requests never need preemption.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from router.tools.emulator.kv_events import KVEventLog


def block_hashes(tokens: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """Chained hashes of every full block of ``tokens``.

    ``salt`` (the model name) keeps different models' caches apart, like
    real engines that hash with a per-model seed.
    """
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    raw = memoryview(array("q", tokens[: n_full * block_size]).tobytes())
    stride = block_size * 8
    parent = xxhash.xxh3_64_intdigest(salt.encode("utf-8"))
    out: list[int] = []
    digest = xxhash.xxh3_64_intdigest
    for i in range(n_full):
        parent = digest(raw[i * stride:(i + 1) * stride], seed=parent)
        out.append(parent)
    return out


class KVCache:
    """Block allocator + prefix cache. All counts are blocks unless named tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("need at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.reserved = 0
        self.evictions = 0
        self.events: KVEventLog | None = None  # told of every block published, evicted or dropped

    # -- queries -------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` currently cached (no side effects)."""
        by_hash = self._by_hash
        n = 0
        for h in hashes:
            if h not in by_hash:
                break
            n += 1
        return n

    def count_evictable(self, hashes: Iterable[int]) -> int:
        """How many of these cached blocks are unreferenced (still reclaimable)."""
        ref = self._ref
        by_hash = self._by_hash
        return sum(1 for h in hashes if ref[by_hash[h]] == 0)

    @property
    def available(self) -> int:
        """Blocks that could be handed out now without breaking reservations."""
        return len(self._free) + len(self._evictable) - self.reserved

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by running or held requests."""
        return self.num_blocks - len(self._free) - len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks pinned by requests (vLLM's kv_cache_usage_perc)."""
        return self.used_blocks / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._by_hash)

    def block_hash(self, block_id: int) -> int | None:
        return self._hash[block_id]

    # -- mutations -----------------------------------------------------------

    def acquire(self, hashes: Sequence[int]) -> list[int]:
        """Pin the cached blocks for ``hashes`` (all must be cached)."""
        ids: list[int] = []
        for h in hashes:
            bid = self._by_hash[h]
            if self._ref[bid] == 0:
                del self._evictable[bid]
            self._ref[bid] += 1
            ids.append(bid)
        return ids

    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` fresh blocks, evicting LRU cached blocks if needed."""
        if n > len(self._free) + len(self._evictable):
            raise MemoryError(f"need {n} blocks, only "
                              f"{len(self._free) + len(self._evictable)} reclaimable")
        ids: list[int] = []
        for _ in range(n):
            if self._free:
                bid = self._free.pop()
            else:
                bid, _unused = self._evictable.popitem(last=False)
                old = self._hash[bid]
                if old is not None:
                    del self._by_hash[old]
                    self._hash[bid] = None
                    if self.events is not None:
                        self.events.removed(old)
                self.evictions += 1
            self._ref[bid] = 1
            ids.append(bid)
        return ids

    def reserve(self, n: int) -> None:
        self.reserved += n

    def unreserve(self, n: int) -> None:
        self.reserved -= n

    def allocate_reserved(self) -> int:
        """Turn one reserved block into an allocated one."""
        self.reserved -= 1
        return self.allocate(1)[0]

    def commit(self, block_id: int, block_hash: int) -> bool:
        """Publish a just-filled full block so later requests can hit it.

        If an identical block was published meanwhile (two requests computed
        the same prefix concurrently) this copy simply stays private (False).
        """
        if block_hash not in self._by_hash and self._hash[block_id] is None:
            self._by_hash[block_hash] = block_id
            self._hash[block_id] = block_hash
            return True
        return False

    def release(self, block_ids: Sequence[int]) -> None:
        """Unpin blocks; tail blocks first so they are evicted first."""
        ref = self._ref
        for bid in reversed(block_ids):
            ref[bid] -= 1
            if ref[bid] == 0:
                if self._hash[bid] is None:
                    self._free.append(bid)
                else:
                    self._evictable[bid] = None

    def reset_prefix_cache(self) -> int:
        """Forget every unreferenced cached block; returns how many."""
        dropped = 0
        events = self.events
        emptied = len(self._evictable) == len(self._by_hash)  # every cached block goes
        while self._evictable:
            bid, _unused = self._evictable.popitem(last=False)
            old = self._hash[bid]
            if old is not None:
                del self._by_hash[old]
                self._hash[bid] = None
                if events is not None and not emptied:
                    events.removed(old)
            self._free.append(bid)
            dropped += 1
        if events is not None and emptied:
            events.cleared()  # nothing cached is left: one event says it, as vLLM's after a reset
        return dropped
