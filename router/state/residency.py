"""In-process residency index: block key -> instances holding it, with per-instance LRU.

Bounded: each instance keeps at most ``cap`` keys (its cache capacity in blocks) and
entries expire after ``ttl_s``. Keys of one prefix are touched tail first, so when LRU
evicts it drops the deepest blocks of a prefix before its head, as engines do, and
"leading blocks held" stays a contiguous run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ResidencyIndex:
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._holders: dict[int, dict[str, float]] = {}  # key -> {instance: expiry}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def record(self, instance: str, keys: Sequence[int], cap: int, now: float) -> None:
        """``instance`` now holds ``keys`` (a whole prefix); evict beyond ``cap``."""
        lru = self._lru.setdefault(instance, OrderedDict())
        expiry = now + self._ttl_s
        for key in reversed(keys):
            self._holders.setdefault(key, {})[instance] = expiry
            lru[key] = None
            lru.move_to_end(key)
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

    def forget(self, instance: str) -> None:
        for key in self._lru.pop(instance, ()):
            self._drop(key, instance)

    def _drop(self, key: int, instance: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.pop(instance, None)
            if not holders:
                del self._holders[key]
