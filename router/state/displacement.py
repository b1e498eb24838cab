"""What a copy costs an instance's cache: the LRU displacement model behind placement's
price (router/scheduling/placement.py, ``cache_room``).

A block pushed out of a full cache is missed later if its prefix is asked for again before
it would have aged out, and each such miss brings it back by evicting another block, which
may be asked for again in turn. Per instance, the blocks it evicted for room are kept in a
ghost list (the last ``cap`` of them, so the window is about one cache's turnover); when a
request is then recorded anywhere without holding one of them (a miss, wherever the router
sent it), the evicting instance is credited with a re-use, and a ghost that ages out of the
list unasked is counted as not re-used. The decaying share ``q`` of its settled evictions
re-used that way is the chance that what it evicts is needed again, measured from the
prefixes' own demand, not assumed; the cascade costs ``q + q^2 + ... = q / (1 - q)``
re-prefills per displaced block.

Only settled evictions count: a ghost still in the list has not had its window yet, and
counting it as not re-used (as every eviction was, the moment it happened) held ``q`` far
below what the cache does whenever evictions are recent, which is whenever copies are
being made (a prefix evicted now returns a few requests later, after the copies it
should have stopped).

The prior, before an instance has settled evictions of its own: the pool's (every
instance's settled evictions together, the same prefixes' demand seen from other caches),
weighed as one cache's worth of evictions and decaying like them; before anything in the
pool has settled, ``PRIOR_REUSE`` = 1/2, as likely as not (a copy then costs its duplicated
compute plus one re-prefill of what it evicts: the price before this model). Under light
pressure what is evicted is cold (one-off suffixes: q falls towards 0, copies are cheap,
spreading wins); under heavy pressure it comes back (q near 1: keep a prefix at home).
Blocks the instance has free are displaced for nothing.

A re-use counts wherever the request went: counting only returns to the evicting instance
would measure the policy (a router that spreads misses never returns) instead of the demand.

Bounded: one ghost list for the pool, first in first out, holding at most twice the
instances' capacities together (trimmed in bulk to once, the trimmed ghosts settled as not
re-used); a block evicted by two instances is credited to the later one.
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

# Before anything in the pool has settled, an eviction is as likely as not to come back
# (one re-prefill per evicted token: the price before this model); an instance's prior
# weighs as one cache's worth of evictions. The share is held below 0.9 (at most 9
# re-prefills per token): a cache whose every eviction returns would otherwise price a copy
# at infinity.
PRIOR_REUSE, MAX_REUSE = 0.5, 0.9
WINDOW_CAPS = 4  # the counts forget over this many caches' worth of evictions
# (free blocks, re-prefills per displaced token there, the same for the pool) when unmeasured
FULL_ROOM: tuple[int, float, float] = (0, 0.0, 0.0)


class Displacement:
    def __init__(self) -> None:
        self._ghosts: dict[int, str] = {}  # block evicted for room -> by whom, oldest first
        self._caps: dict[str, int] = {}  # instance -> its capacity in blocks: the ghost list holds their sum
        self._reused: dict[str, float] = {}  # decaying count of evictions asked for again while in the ghost list
        self._expired: dict[str, float] = {}  # decaying count of evictions that aged out of it unasked
        self._prior: dict[str, float] = {}  # decaying weight of the pool's share in the instance's own
        self._pool = [0.0, 0.0]  # the instances' re-used and expired counts together
        self._free: dict[str, int] = {}  # instance -> free blocks at its last record
        # instance -> (free blocks, re-prefills per displaced token there, in the pool as of its last record)
        self._room: dict[str, tuple[int, float, float]] = {}

    def rooms(self) -> Mapping[str, tuple[int, float, float]]:
        """Per instance, (free blocks, re-prefills per displaced token there, the pool's as of
        the instance's last record: its own share without the sampling noise of one cache):
        read-only and live; an instance never recorded is absent (FULL_ROOM)."""
        return MappingProxyType(self._room)

    def pool_share(self) -> float:
        """The share of the pool's settled evictions that were asked for again (PRIOR_REUSE before any settled)."""
        reused, expired = max(0.0, self._pool[0]), max(0.0, self._pool[1])  # float drift of the decays
        return reused / (reused + expired) if reused + expired > 1e-9 else PRIOR_REUSE

    def asked(self, missing: Iterable[int]) -> None:
        """A request is being recorded without holding these blocks: credit every instance
        that evicted one of them recently."""
        ghosts = self._ghosts
        if not ghosts:
            return
        found = ghosts.keys() & missing
        if not found:
            return
        self._settle(self._reused, 0, Counter(map(ghosts.pop, found)))

    def evicted(self, instance: str, keys: list[int], cap: int, free: int) -> None:
        """``instance`` evicted ``keys`` for room (possibly none) and has ``free`` blocks of ``cap`` left."""
        self._free[instance] = free
        if keys:
            ghosts = self._ghosts
            ghosts.update(zip(keys, repeat(instance)))
            self._caps[instance] = cap
            if instance not in self._prior:  # the pool's share, as one cache's worth of evictions
                self._prior[instance] = float(cap)
            decay = math.exp(-len(keys) / (WINDOW_CAPS * max(1, cap)))
            pool, reused, expired = self._pool, self._reused, self._expired
            r, x = reused.get(instance, 0.0), expired.get(instance, 0.0)
            reused[instance], expired[instance] = r * decay, x * decay
            pool[0] -= r * (1.0 - decay)
            pool[1] -= x * (1.0 - decay)
            self._prior[instance] *= decay
            limit = sum(self._caps.values())
            if len(ghosts) > 2 * limit:  # trimmed in bulk (C-level), to the limit, oldest first: settled unasked
                drop = len(ghosts) - limit
                aged = Counter(islice(ghosts.values(), drop))
                self._ghosts = dict(islice(ghosts.items(), drop, None))
                self._settle(expired, 1, aged)
        self._update(instance)

    def _settle(self, table: dict[str, float], side: int, counts: Counter[str]) -> None:
        for inst, count in counts.items():
            table[inst] = table.get(inst, 0.0) + count
            self._pool[side] += count
            self._update(inst)

    def forget(self, instance: str) -> None:
        ghosts = self._ghosts
        for key in [k for k, inst in ghosts.items() if inst == instance]:
            del ghosts[key]
        self._pool[0] -= self._reused.get(instance, 0.0)
        self._pool[1] -= self._expired.get(instance, 0.0)
        if not self._reused.keys() - {instance}:  # no other instance left: no drift to carry
            self._pool[:] = [0.0, 0.0]
        for table in (self._caps, self._reused, self._expired, self._prior, self._free, self._room):
            table.pop(instance, None)

    def _update(self, instance: str) -> None:
        free = self._free.get(instance, 0)
        prior, weight = self.pool_share(), self._prior.get(instance, 0.0)
        reused = self._reused.get(instance, 0.0)
        settled = reused + self._expired.get(instance, 0.0) + weight
        share = min(MAX_REUSE, (reused + weight * prior) / settled if settled > 0.0 else prior)
        pool = min(MAX_REUSE, prior)
        self._room[instance] = (max(0, free), share / (1.0 - share), pool / (1.0 - pool))
