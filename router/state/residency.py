"""In-process residency index: block key -> instances holding it, with per-instance LRU,
and a confidence for each instance's match.

Bounded: each instance keeps at most ``cap`` keys (its cache capacity in blocks: the
engine's capacity in tokens over the router's block size) and entries expire after
``ttl_s``. Keys of one prefix are touched tail first, so when LRU evicts it drops the
deepest blocks of a prefix before its head, as engines do, and "leading blocks held"
stays a contiguous run.

Confidence (the LRU position model): the router sees only part of what fills an
engine's cache (decode tokens, other routers, its own token estimate is approximate),
so an entry near the old end of the LRU may already be gone on the engine even though
the router still lists it. Each touch gets a stamp from the instance's counter; the
entry's position is estimated from its stamp between the oldest and newest resident
stamps, and its confidence is 1 while it sits in the newest ``1 - margin`` of the
capacity, falling linearly to 0 at the capacity. Traffic pushing through an instance
lowers the confidence of everything older, not only the TTL.

The margin is the share of the cache the router cannot account for (output tokens of
requests in flight, blocks the engine rounds up): 0.1. Once the capacity comes from the
engine itself (router/engines facts), a wider margin mostly discounts prefixes the
engine still holds: in the quality matrix's replay, with margin 0.25 the predicted hit
ratio already matched the measured one within a point, and the discount sent a long
document's requests away from its only holder (copies, then evictions of other docs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ResidencyIndex:
    def __init__(self, ttl_s: float, margin: float = 0.1) -> None:
        if not 0 < margin <= 1:
            raise ValueError("confidence margin must be in (0, 1]")
        self._ttl_s = ttl_s
        self._margin = margin
        self._holders: dict[int, dict[str, float]] = {}  # key -> {instance: expiry}
        self._lru: dict[str, OrderedDict[int, int]] = {}  # instance -> {key: stamp}, oldest first
        self._stamp: dict[str, int] = {}  # instance -> stamps handed out
        self._cap: dict[str, int] = {}  # instance -> the capacity it was last recorded with

    def record(self, instance: str, keys: Sequence[int], cap: int, now: float) -> None:
        """``instance`` now holds ``keys`` (a whole prefix); evict beyond ``cap``."""
        lru = self._lru.setdefault(instance, OrderedDict())
        self._cap[instance] = cap
        stamp = self._stamp.get(instance, 0)
        expiry = now + self._ttl_s
        for key in reversed(keys):
            self._holders.setdefault(key, {})[instance] = expiry
            stamp += 1
            lru[key] = stamp
            lru.move_to_end(key)
        self._stamp[instance] = stamp
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            self._drop(old, instance)

    def unrecord(self, instance: str, keys: Sequence[int]) -> None:
        """Take back a speculative ``record`` (the request went elsewhere after all)."""
        lru = self._lru.get(instance)
        for key in keys:
            if lru is not None:
                lru.pop(key, None)
            self._drop(key, instance)

    def matched(self, keys: Sequence[int], instances: Iterable[str], now: float) -> dict[str, int]:
        """Leading blocks of ``keys`` held by each instance (0 when none).

        Only instances holding the first key can match; each one's depth is found by
        binary search, valid because an instance's run of a prefix is contiguous (prefixes
        are recorded whole, evicted tail first, expire tail first) — so the cost is
        O(holders x log blocks), not O(blocks)."""
        result = dict.fromkeys(instances, 0)
        if not keys:
            return result
        first = self._holders.get(keys[0])
        if not first:
            return result
        holders = self._holders
        for inst, expiry in first.items():
            if inst not in result or expiry <= now:
                continue
            lo, hi = 1, len(keys)  # keys[:lo] held; find the largest such lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                entry = holders.get(keys[mid - 1])
                if entry is not None and entry.get(inst, 0.0) > now:
                    lo = mid
                else:
                    hi = mid - 1
            result[inst] = lo
        return result

    def holders(self, key: int, now: float) -> list[str]:
        """Instances whose entry for ``key`` has not expired."""
        return [inst for inst, expiry in self._holders.get(key, {}).items() if expiry > now]

    def confidence(self, instance: str, key: int) -> float:
        """How likely the engine still holds ``key`` given the traffic recorded since
        (1.0 for a fresh entry, 0.0 for one not held). O(1)."""
        lru = self._lru.get(instance)
        if lru is None:
            return 0.0
        stamp = lru.get(key)
        if stamp is None:
            return 0.0
        cap = self._cap.get(instance, len(lru))
        newest = self._stamp[instance]
        oldest = lru[next(iter(lru))]
        # Resident stamps spread over [oldest, newest]: the entry's distance from the newest
        # end, as a share of that span, times the resident count, is its LRU position.
        span = newest - oldest + 1
        position = len(lru) * (newest - stamp) / span
        free = 1.0 - position / max(1, cap)  # share of the capacity still ahead of eviction
        return max(0.0, min(1.0, free / self._margin))

    def confidences(self, keys: Sequence[int], matched: dict[str, int]) -> dict[str, float]:
        """Per instance, the confidence of the deepest block it matches (evicted first)."""
        return {inst: self.confidence(inst, keys[depth - 1]) for inst, depth in matched.items() if depth}

    def fill(self, instance: str) -> float:
        """Share of the instance's capacity the router believes occupied."""
        lru = self._lru.get(instance)
        return 0.0 if not lru else len(lru) / max(1, self._cap.get(instance, len(lru)))

    def forget(self, instance: str) -> None:
        for key in self._lru.pop(instance, ()):
            self._drop(key, instance)
        self._stamp.pop(instance, None)
        self._cap.pop(instance, None)

    def _drop(self, key: int, instance: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.pop(instance, None)
            if not holders:
                del self._holders[key]
