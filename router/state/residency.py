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
        """Leading blocks of ``keys`` held by each instance (0 when none)."""
        result = dict.fromkeys(instances, 0)
        alive = set(result)
        for depth, key in enumerate(keys, start=1):
            holders = self._holders.get(key)
            if not holders:
                break
            alive = {i for i in alive if holders.get(i, 0.0) > now}
            if not alive:
                break
            for inst in alive:
                result[inst] = depth
        return result

    def forget(self, instance: str) -> None:
        for key in self._lru.pop(instance, ()):
            self._drop(key, instance)

    def size(self, instance: str) -> int:
        return len(self._lru.get(instance, ()))

    def _drop(self, key: int, instance: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.pop(instance, None)
            if not holders:
                del self._holders[key]
