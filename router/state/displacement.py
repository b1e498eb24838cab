"""What a copy costs an instance's cache: the LRU displacement model behind placement's
price (router/scheduling/placement.py, ``cache_room``).

A block pushed out of a full cache is missed later if its prefix is asked for again before
it would have aged out, and each such miss brings it back by evicting another block, which
may be asked for again in turn. Per instance, the blocks it evicted for room are kept in a
ghost list (the last ``cap`` of them, so the window is about one cache's turnover); when a
request is then recorded anywhere without holding one of them (a miss, wherever the router
sent it), the evicting instance is credited with a re-use. The decaying share ``q`` of its
evicted blocks re-used that way is the chance that what it evicts is needed again, measured
from the prefixes' own demand, not assumed; the cascade costs ``q + q^2 + ... = q / (1 - q)``
re-prefills per displaced block.

Under light pressure what is evicted is cold (one-off suffixes: q near 0, copies are cheap,
spreading wins); under heavy pressure it comes back (q near 1: keep a prefix at home).
Blocks the instance has free are displaced for nothing.

A re-use counts wherever the request went: counting only returns to the evicting instance
would measure the policy (a router that spreads misses never returns) instead of the demand.

Bounded: one ghost list for the pool, first in first out, holding at most twice the
instances' capacities together (trimmed in bulk to once); a block evicted by two instances is credited to the later one.
On the decision path (every booking records its prompt): the lookup is one C-level set
intersection of the prompt's missing blocks with the ghost list, and the evicted blocks
join it in one update, so a 500-block record stays a small multiple of the LRU's own work.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import islice, repeat
from types import MappingProxyType

# With no eviction seen yet, nothing evicted is known to come back (placement then prices a
# copy at its compute alone, as it did before this model); the prior weighs as one cache's
# worth of evictions. The measured share is held below 0.9 (at most 9 re-prefills per
# token): a cache whose every eviction returns would otherwise price a copy at infinity.
PRIOR_REUSE, MAX_REUSE = 0.0, 0.9
WINDOW_CAPS = 4  # the counts forget over this many caches' worth of evictions
FULL_ROOM: tuple[int, float] = (0, 0.0)  # (free blocks, re-prefills per displaced token) when unmeasured


class Displacement:
    def __init__(self) -> None:
        self._ghosts: dict[int, str] = {}  # block evicted for room -> by whom, oldest first
        self._caps: dict[str, int] = {}  # instance -> its capacity in blocks: the ghost list holds their sum
        self._evicted: dict[str, float] = {}  # decaying count of blocks evicted for room
        self._reused: dict[str, float] = {}  # decaying count of those asked for again while in the ghost list
        self._free: dict[str, int] = {}  # instance -> free blocks at its last record
        self._room: dict[str, tuple[int, float]] = {}  # instance -> (free blocks, re-prefills per displaced token)

    def rooms(self) -> Mapping[str, tuple[int, float]]:
        """Per instance, (free blocks, re-prefills per displaced token): read-only and live;
        an instance never recorded is absent (FULL_ROOM)."""
        return MappingProxyType(self._room)

    def asked(self, missing: Iterable[int]) -> None:
        """A request is being recorded without holding these blocks: credit every instance
        that evicted one of them recently."""
        ghosts = self._ghosts
        if not ghosts:
            return
        found = ghosts.keys() & missing
        if not found:
            return
        reused = self._reused
        for inst, count in Counter(map(ghosts.pop, found)).items():
            reused[inst] = reused.get(inst, 0.0) + count
            self._update(inst)

    def evicted(self, instance: str, keys: list[int], cap: int, free: int) -> None:
        """``instance`` evicted ``keys`` for room (possibly none) and has ``free`` blocks of ``cap`` left."""
        self._free[instance] = free
        if keys:
            ghosts = self._ghosts
            ghosts.update(zip(keys, repeat(instance)))
            self._caps[instance] = cap
            limit = sum(self._caps.values())
            if len(ghosts) > 2 * limit:  # trimmed in bulk (C-level), to the limit, oldest first
                self._ghosts = dict(islice(ghosts.items(), len(ghosts) - limit, None))
            decay = math.exp(-len(keys) / (WINDOW_CAPS * max(1, cap)))
            if instance not in self._evicted:  # the prior, as one cache's worth of evictions; it decays like them
                self._evicted[instance], self._reused[instance] = float(cap), PRIOR_REUSE * cap
            self._evicted[instance] = self._evicted[instance] * decay + len(keys)
            self._reused[instance] = self._reused.get(instance, 0.0) * decay
        self._update(instance)

    def forget(self, instance: str) -> None:
        ghosts = self._ghosts
        for key in [k for k, inst in ghosts.items() if inst == instance]:
            del ghosts[key]
        for table in (self._caps, self._evicted, self._reused, self._free, self._room):
            table.pop(instance, None)

    def _update(self, instance: str) -> None:
        free = self._free.get(instance, 0)
        evicted = self._evicted.get(instance, 0.0)
        share = min(MAX_REUSE, self._reused.get(instance, 0.0) / evicted) if evicted else PRIOR_REUSE
        self._room[instance] = (max(0, free), share / (1.0 - share))
