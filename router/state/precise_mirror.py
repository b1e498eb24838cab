"""Engine tables split across two processes: written in a sidecar, read on the event loop.

With ``kv_events.sidecar`` the KV events are decoded, hashed into router keys and applied
to full ``BlockTable``s in a child process (``TrackedTable``: it also notes which router
keys it touched). What the request path needs of a table is only whether each router key
is held per tier, so the child ships, per table, the keys whose presence changed since
the last shipment (a key stored then removed in between is shipped once, as absent) and
the parent keeps just those sets (``MirrorTable``): applying a shipment is two C-level set
operations per tier, whatever the events looked like.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from router.state.precise import _GPU, BlockTable


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


class TrackedTable(BlockTable):
    """A ``BlockTable`` that remembers the router keys it touched, for ``take_delta``.

    Every batch a ``Source`` applies ends by setting ``fresh``, which marks the table
    touched, so each applied batch reaches the mirror (its freshness included) even when
    it changed no key."""

    __slots__ = ("_fresh", "_touched", "_reset", "_dirty_gpu", "_dirty_offload")

    def __init__(self, capacity: int) -> None:
        self._touched = False
        self._reset = False
        self._dirty_gpu: set[int] = set()
        self._dirty_offload: set[int] = set()
        super().__init__(capacity)

    @property
    def fresh(self) -> bool:
        return self._fresh

    @fresh.setter
    def fresh(self, value: bool) -> None:
        self._fresh = value
        self._touched = True

    def _dirty(self, tier: int) -> set[int]:
        return self._dirty_gpu if tier == _GPU else self._dirty_offload

    def _mark_held(self, hashes: Sequence[int], dirty: set[int]) -> None:
        get = self._blocks.get
        for h in hashes:
            entry = get(h)
            if entry is not None:
                dirty.update(entry[0])

    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None:
        dirty = self._dirty(tier)
        self._mark_held(hashes, dirty)  # a block stored again under another tier counts its own keys
        for ks in keys:
            dirty.update(ks)
        super().store_run(hashes, keys, tier)

    def remove_run(self, hashes: Sequence[int], tier: int) -> int:
        self._mark_held(hashes, self._dirty(tier))
        return super().remove_run(hashes, tier)

    def _count(self, keys: tuple[int, ...], tier: int, delta: int) -> None:
        self._dirty(tier).update(keys)
        super()._count(keys, tier, delta)

    def clear(self) -> None:
        super().clear()
        self._reset = self._touched = True
        self._dirty_gpu.clear()
        self._dirty_offload.clear()

    def take_delta(self) -> TableDelta | None:
        """The changes since the last call, or None when there were none."""
        if not (self._touched or self._dirty_gpu or self._dirty_offload):
            return None
        delta = TableDelta(self._fresh, len(self), self.overflow, self._reset)
        for dirty, counts, added, removed in ((self._dirty_gpu, self._gpu, delta.added_gpu, delta.removed_gpu),
                                              (self._dirty_offload, self._offload, delta.added_offload,
                                               delta.removed_offload)):
            if dirty:
                added.extend([k for k in dirty if k in counts])
                removed.extend([k for k in dirty if k not in counts])
                dirty.clear()
        self._touched = self._reset = False
        return delta


class MirrorTable(BlockTable):
    """The parent's copy of a ``TrackedTable``: the keys held per tier, its size and state.

    Written only by ``apply``; the engine-block map stays in the sidecar."""

    __slots__ = ("_size", "_held_gpu", "_held_offload")

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._size = 0
        self._held_gpu: set[int] = set()
        self._held_offload: set[int] = set()

    def __len__(self) -> int:
        return self._size

    def apply(self, delta: TableDelta) -> None:
        gpu, offload = self._held_gpu, self._held_offload
        if delta.reset:
            gpu.clear()
            offload.clear()
        gpu.difference_update(delta.removed_gpu)
        gpu.update(delta.added_gpu)
        offload.difference_update(delta.removed_offload)
        offload.update(delta.added_offload)
        self._size = delta.size
        self.overflow = delta.overflow
        self.fresh = delta.fresh

    def clear(self) -> None:
        """Forget everything (the sidecar that filled it is gone)."""
        self._held_gpu.clear()
        self._held_offload.clear()
        self._size = 0

    def depth(self, keys: Sequence[int], cpu_weight: float) -> float:
        gpu, offload = self._held_gpu, self._held_offload
        total = 0.0
        for key in keys:
            if key in gpu:
                total += 1.0
            elif key in offload:
                total += cpu_weight
            else:
                break
        return total

    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def remove_run(self, hashes: Sequence[int], tier: int) -> int:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def store(self, engine_hash: int, keys: tuple[int, ...], tier: int) -> None:
        raise TypeError("a mirror table is written by its sidecar's deltas only")

    def remove(self, engine_hash: int, tier: int) -> bool:
        raise TypeError("a mirror table is written by its sidecar's deltas only")
