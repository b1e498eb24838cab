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

Bounded: each instance's ghost list holds at most its capacity in blocks; the reverse map
(block -> instances whose ghost lists hold it) holds no more than those lists together.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
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
        self._ghosts: dict[str, OrderedDict[int, None]] = {}  # instance -> blocks it evicted for room, oldest first
        self._owners: dict[int, dict[str, None]] = {}  # block -> instances whose ghost list holds it
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
        owners = self._owners
        if not owners:
            return
        credited: set[str] = set()
        for key in missing:
            held_by = owners.pop(key, None)
            if held_by is None:
                continue
            for inst in held_by:
                del self._ghosts[inst][key]
                self._reused[inst] = self._reused.get(inst, 0.0) + 1.0
                credited.add(inst)
        for inst in credited:
            self._update(inst)

    def evicted(self, instance: str, keys: list[int], cap: int, free: int) -> None:
        """``instance`` evicted ``keys`` for room (possibly none) and has ``free`` blocks of ``cap`` left."""
        self._free[instance] = free
        if keys:
            ghosts = self._ghosts.get(instance)
            if ghosts is None:
                ghosts = self._ghosts[instance] = OrderedDict()
            owners = self._owners
            for key in keys:
                ghosts[key] = None
                owners.setdefault(key, {})[instance] = None
            while len(ghosts) > cap:
                old, _ = ghosts.popitem(last=False)
                self._disown(old, instance)
            decay = math.exp(-len(keys) / (WINDOW_CAPS * max(1, cap)))
            if instance not in self._evicted:  # the prior, as one cache's worth of evictions; it decays like them
                self._evicted[instance], self._reused[instance] = float(cap), PRIOR_REUSE * cap
            self._evicted[instance] = self._evicted[instance] * decay + len(keys)
            self._reused[instance] = self._reused.get(instance, 0.0) * decay
        self._update(instance)

    def forget(self, instance: str) -> None:
        for key in self._ghosts.pop(instance, ()):
            self._disown(key, instance)
        for table in (self._evicted, self._reused, self._free, self._room):
            table.pop(instance, None)

    def _update(self, instance: str) -> None:
        free = self._free.get(instance, 0)
        evicted = self._evicted.get(instance, 0.0)
        share = min(MAX_REUSE, self._reused.get(instance, 0.0) / evicted) if evicted else PRIOR_REUSE
        self._room[instance] = (max(0, free), share / (1.0 - share))

    def _disown(self, key: int, instance: str) -> None:
        held_by = self._owners.get(key)
        if held_by is not None:
            held_by.pop(instance, None)
            if not held_by:
                del self._owners[key]
