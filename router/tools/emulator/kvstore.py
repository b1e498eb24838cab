"""A shared KV store (Mooncake Store / LMCache remote backend style), pure and clock-agnostic.

Why: reuse is the cheapest handoff of all — KV computed once anywhere can be loaded by any
engine instead of being computed again. The store holds blocks by content (the engines'
chained block hashes, so a block only matches with its whole prefix), up to a capacity in
tokens, evicting the least recently used block. Engines write what they compute (prefill
and colocated engines their prompt blocks, decode engines the blocks they generate) and,
at admission, load the leading blocks they lack that the store holds; the load moves
``tokens x KV bytes per token`` over the store's bandwidth, shared by concurrent loads
(links.py), while the engine computes the rest of the prompt.

Writes are free here (they leave the engine asynchronously, off the critical path, as
LMCache's and Mooncake's do); only loads cost time. The HTTP emulator serves one store to
many engines (store_server.py); the replay holds one in process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass
class StoreCounters:
    """Monotonic totals of one store, in calls, blocks or bytes."""

    lookups: int = 0
    hit_lookups: int = 0
    """Lookups that found at least one leading block."""
    hit_blocks: int = 0
    loads: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    writes: int = 0
    written_blocks: int = 0
    """Blocks newly stored (a block already held is only refreshed)."""
    evicted_blocks: int = 0


class KVStore:
    """Content-addressed blocks with LRU eviction; counts are blocks unless named tokens."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        if block_size < 1 or capacity_tokens < block_size:
            raise ValueError("the store must hold at least one block of at least one token")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.counters = StoreCounters()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> int:
        """Leading ``hashes`` held (no side effects)."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def lookup(self, hashes: Sequence[int]) -> int:
        """Leading ``hashes`` held, counted and refreshed (a lookup precedes a load)."""
        n = self.match(hashes)
        c = self.counters
        c.lookups += 1
        if n:
            c.hit_lookups += 1
            c.hit_blocks += n
            for h in reversed(hashes[:n]):  # head last: the deepest blocks stay the oldest
                self._blocks.move_to_end(h)
        return n

    def loaded(self, blocks: int, nbytes: int) -> None:
        """An engine finished loading ``blocks`` (``nbytes``) from here."""
        c = self.counters
        c.loads += 1
        c.loaded_blocks += blocks
        c.loaded_bytes += nbytes

    def put(self, hashes: Sequence[int]) -> int:
        """Store a prefix's blocks (a chain from its first block); returns how many were new."""
        blocks = self._blocks
        new = 0
        for h in reversed(hashes):  # tail first, so LRU drops a prefix's deepest blocks first
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                new += 1
        c = self.counters
        c.writes += 1
        c.written_blocks += new
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
            c.evicted_blocks += 1
        return new

    def reset(self) -> int:
        dropped = len(self._blocks)
        self._blocks.clear()
        return dropped

    def stats(self) -> dict[str, object]:
        return {"block_size": self.block_size, "capacity_blocks": self.capacity_blocks,
                "blocks": len(self._blocks), **asdict(self.counters)}
