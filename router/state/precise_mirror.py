"""Engine tables split across two processes: written in a sidecar, read on the event loop.

With ``kv_events.sidecar`` the KV events are decoded, hashed into router keys and applied
to full ``BlockTable``s in a child process (``TrackedTable``: it also notes which router
keys it touched). What the request path needs of a table is only whether each router key
is held per tier, so the child ships, per table, the keys whose presence changed since
the last shipment (a key stored then removed in between is shipped once, as absent) and
the parent keeps just those sets (``MirrorTable``): applying a shipment is two C-level set
operations per tier, whatever the events looked like.

The sets are ``router.state._keyset.KeySet`` (a C extension: uint64 keys applied straight
from the delta's arrays, no Python int per key) when it was built, Python sets otherwise
or when asked (``kv_events.native_key_sets: false``); same contents either way.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from router.state.precise import _GPU, BlockTable, leading_depth

try:
    from router.state._keyset import KeySet as _KeySet
    from router.state._keyset import depth as _native_depth
except ImportError:  # installed without a C compiler: Python sets, same contents
    _KeySet = None  # type: ignore[assignment,misc]


NATIVE_BUILT = _KeySet is not None


def key_sets(native: bool = True) -> Literal["native", "python"]:
    """Which key sets ``MirrorTable(native=native)`` uses: the C extension's if asked and built."""
    return "native" if native and NATIVE_BUILT else "python"


class PyKeySet(set[int]):
    """A Python set with the two ``KeySet`` methods the mirror applies deltas with (each
    key becomes a Python int first: ~4x the C extension's cost per key change)."""

    __slots__ = ()

    def add_keys(self, keys: array[int], start: int = 0, stop: int | None = None) -> int:
        n = len(self)
        self.update(_part(keys, start, stop).tolist())
        return len(self) - n

    def remove_keys(self, keys: array[int], start: int = 0, stop: int | None = None) -> int:
        n = len(self)
        self.difference_update(_part(keys, start, stop).tolist())
        return n - len(self)


def _part(keys: array[int], start: int, stop: int | None) -> array[int]:
    """``keys[start:stop]``, without the copy when that is all of it."""
    return keys if start == 0 and (stop is None or stop >= len(keys)) else keys[start:stop]


def _keys() -> array[int]:
    return array("Q")


@dataclass(slots=True)
class TableDelta:
    """What changed in one table since the last delta: presence per tier, and its state."""

    fresh: bool
    size: int  # engine blocks held
    overflow: int
    reset: bool = False  # cleared first (then ``added`` is everything held)
    added_gpu: array[int] = field(default_factory=_keys)
    removed_gpu: array[int] = field(default_factory=_keys)
    added_offload: array[int] = field(default_factory=_keys)
    removed_offload: array[int] = field(default_factory=_keys)


def delta_changes(delta: TableDelta) -> int:
    """How many key changes a shipment holds (what applying it costs the loop)."""
    return len(delta.added_gpu) + len(delta.removed_gpu) + len(delta.added_offload) + len(delta.removed_offload)


class TrackedTable(BlockTable):
    """A ``BlockTable`` that records, per tier, the router keys whose presence changed
    (a refcount going 0 -> 1 or 1 -> 0) since the last ``take_delta``, netted: a key
    added then removed before the next delta is in neither set.

    Every batch a ``Source`` applies ends by setting ``fresh``, which marks the table
    touched, so each applied batch reaches the mirror (its freshness included) even when
    it changed no key."""

    __slots__ = ("_fresh", "_touched", "_reset", "_added", "_removed")

    def __init__(self, capacity: int) -> None:
        self._touched = False
        self._reset = False
        self._added: tuple[set[int], set[int]] = (set(), set())  # by tier: GPU, offload
        self._removed: tuple[set[int], set[int]] = (set(), set())
        super().__init__(capacity)

    @property
    def fresh(self) -> bool:
        return self._fresh

    @fresh.setter
    def fresh(self, value: bool) -> None:
        self._fresh = value
        self._touched = True

    def _sets(self, tier: int) -> tuple[dict[int, int], set[int], set[int]]:
        i = 0 if tier == _GPU else 1
        return (self._gpu if i == 0 else self._offload), self._added[i], self._removed[i]

    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None:
        """``BlockTable.store_run``, noting keys that became held."""
        self._touched = True
        blocks = self._blocks
        counts, added, removed = self._sets(tier)
        get = blocks.get
        for h, ks in zip(hashes, keys):
            entry = get(h)
            if entry is None:
                blocks[h] = (ks, tier)
            elif not entry[1] & tier:
                blocks[h] = (entry[0], entry[1] | tier)
                blocks.move_to_end(h)
                ks = entry[0]
            else:
                blocks.move_to_end(h)
                continue
            for key in ks:
                n = counts.get(key, 0) + 1
                counts[key] = n
                if n == 1:
                    if key in removed:
                        removed.discard(key)
                    else:
                        added.add(key)
        while len(blocks) > self.capacity:
            _old, (old_keys, old_tiers) = blocks.popitem(last=False)
            self._uncount(old_keys, old_tiers)
            self.overflow += 1

    def remove_run(self, hashes: Sequence[int], tier: int) -> int:
        """``BlockTable.remove_run``, noting keys that stopped being held."""
        self._touched = True
        blocks = self._blocks
        counts, added, removed = self._sets(tier)
        get = blocks.get
        found = 0
        for h in hashes:
            entry = get(h)
            if entry is None or not entry[1] & tier:
                continue
            found += 1
            keys, tiers = entry
            for key in keys:
                n = counts[key] - 1
                if n:
                    counts[key] = n
                else:
                    del counts[key]
                    if key in added:
                        added.discard(key)
                    else:
                        removed.add(key)
            if tiers == tier:
                del blocks[h]
            else:
                blocks[h] = (keys, tiers & ~tier)
        return found

    def _count(self, keys: tuple[int, ...], tier: int, delta: int) -> None:
        self._touched = True
        counts, added, removed = self._sets(tier)
        was = {key for key in keys if key in counts}
        super()._count(keys, tier, delta)
        for key in dict.fromkeys(keys):  # once per key: a block may carry one twice
            held = key in counts
            if held and key not in was:
                if key in removed:
                    removed.discard(key)
                else:
                    added.add(key)
            elif not held and key in was:
                if key in added:
                    added.discard(key)
                else:
                    removed.add(key)

    def clear(self) -> None:
        super().clear()
        self._reset = self._touched = True
        for group in (*self._added, *self._removed):
            group.clear()

    def take_delta(self) -> TableDelta | None:
        """The changes since the last call, or None when there were none."""
        (add_gpu, add_off), (rem_gpu, rem_off) = self._added, self._removed
        if not (self._touched or add_gpu or add_off or rem_gpu or rem_off):
            return None
        # array() from a list is twice as fast as from a set (it iterates a set item by item)
        delta = TableDelta(self._fresh, len(self), self.overflow, self._reset, array("Q", list(add_gpu)),
                           array("Q", list(rem_gpu)), array("Q", list(add_off)), array("Q", list(rem_off)))
        for group in (add_gpu, add_off, rem_gpu, rem_off):
            group.clear()
        self._touched = self._reset = False
        return delta


class MirrorTable(BlockTable):
    """The parent's copy of a ``TrackedTable``: the keys held per tier, its size and state.

    Written only by ``apply``; the engine-block map stays in the sidecar. Its key sets
    are native if ``native`` and the extension was built (``key_sets``), else Python sets."""

    __slots__ = ("_size", "_native", "_held_gpu", "_held_offload")

    def __init__(self, capacity: int, native: bool = True) -> None:
        super().__init__(capacity)
        self._size = 0
        self._native = key_sets(native) == "native"
        make = _KeySet if self._native else PyKeySet
        self._held_gpu: _KeySet | PyKeySet = make()
        self._held_offload: _KeySet | PyKeySet = make()

    def __len__(self) -> int:
        return self._size

    @property
    def native(self) -> bool:
        return self._native

    def held(self) -> tuple[set[int], set[int]]:
        """Copies of the keys held on the GPU and offload tiers (for tests and debugging)."""
        return set(self._held_gpu), set(self._held_offload)

    def apply(self, delta: TableDelta) -> None:
        """The whole shipment at once (``apply_part`` with no budget)."""
        self.apply_part(delta, 0, delta_changes(delta))

    def apply_part(self, delta: TableDelta, done: int, budget: int) -> int:
        """Apply up to ``budget`` of the shipment's key changes from the ``done``-th on,
        straight from the delta's arrays; returns how many are done now. The table's
        state (size, overflow, freshness) changes with the last slice, and a reset with the
        first: in between, a decision reads a table that is part old, part new, as it would
        between two events applied in-process."""
        gpu, offload = self._held_gpu, self._held_offload
        if done == 0 and delta.reset:
            gpu.clear()
            offload.clear()
        start, end = done, done + budget
        pos = 0
        for keys, update in ((delta.removed_gpu, gpu.remove_keys), (delta.added_gpu, gpu.add_keys),
                             (delta.removed_offload, offload.remove_keys), (delta.added_offload, offload.add_keys)):
            n = len(keys)
            lo, hi = max(start - pos, 0), min(end - pos, n)
            if lo < hi:
                update(keys, lo, hi)
            pos += n
        if end >= pos:
            self._size = delta.size
            self.overflow = delta.overflow
            self.fresh = delta.fresh
            return pos
        return end

    def holds(self, key: int) -> bool:
        """``BlockTable.holds`` on the mirrored sets (the base reads the refcounts, which a
        mirror has none of: candidate pruning saw no precise holder with the sidecar on)."""
        return key in self._held_gpu or key in self._held_offload

    def clear(self) -> None:
        """Forget everything (the sidecar that filled it is gone)."""
        self._held_gpu.clear()
        self._held_offload.clear()
        self._size = 0

    def depth(self, keys: Sequence[int], cpu_weight: float) -> float:
        gpu, offload = self._held_gpu, self._held_offload
        if self._native:
            return _native_depth(keys, gpu, offload, cpu_weight)  # type: ignore[arg-type]
        return leading_depth(keys, gpu, offload, cpu_weight)

    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def remove_run(self, hashes: Sequence[int], tier: int) -> int:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def store(self, engine_hash: int, keys: tuple[int, ...], tier: int) -> None:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def remove(self, engine_hash: int, tier: int) -> bool:
        raise TypeError("a mirror table is written by its sidecar's deltas only")
