"""Residency as the engines report it: per engine, the blocks its KV events say it holds.

Each engine (one data-parallel rank of one instance) has a ``BlockTable``: its own block
hashes mapped to the router's chained keys over the same tokens (the engine's hash
function is its own, so the router never reproduces it; it only follows the parent links
and removals). A key is held on the GPU tier, on an offload tier (CPU, disk: the
``medium`` of the event), or both; an offloaded block counts for ``cpu_weight`` of a GPU
block, as loading it back is cheaper than recomputing it but not free.

An engine's table is *fresh* only while the router has seen every event since a state
it knew (the engine's first batch, an ``AllBlocksCleared``, or a replay that filled a
gap); otherwise it is stale and ``matched`` leaves the instance out, so the caller falls
back to approximate residency for it. Memory is bounded per table: past ``capacity``
blocks the oldest stored are forgotten (counted), as the engine evicts its oldest too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Protocol

_GPU, _OFFLOAD = 1, 2


def tier_of(medium: str | None) -> int:
    """GPU for an event without a medium (older engines) or ``GPU``; offload otherwise."""
    return _GPU if medium is None or medium == "GPU" or medium.upper() == "GPU" else _OFFLOAD


def leading_depth(keys: Sequence[int], gpu: Container[int], offload: Container[int], cpu_weight: float) -> float:
    """The leading ``keys`` held: 1 each on ``gpu``, ``cpu_weight`` each on ``offload`` only."""
    total = 0.0
    for key in keys:
        if key in gpu:
            total += 1.0
        elif key in offload:
            total += cpu_weight
        else:
            break
    return total


class EngineTable(Protocol):
    """What ingestion writes and decisions read of one engine's table: ``BlockTable`` (and
    the sidecar's ``TrackedTable``, the loop's ``MirrorTable``), or the sidecar's C table
    (``router.state.precise_native``)."""

    fresh: bool

    @property
    def capacity(self) -> int: ...
    @property
    def overflow(self) -> int: ...
    def __len__(self) -> int: ...
    def last_key(self, engine_hash: int) -> int | None: ...
    def keys_of(self, engine_hash: int) -> tuple[int, ...] | None: ...
    def store(self, engine_hash: int, keys: tuple[int, ...], tier: int) -> None: ...
    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None: ...
    def store_flat(self, hashes: Sequence[int], keys: Sequence[int], per: int, tier: int) -> None: ...
    def remove(self, engine_hash: int, tier: int) -> bool: ...
    def remove_run(self, hashes: Sequence[int], tier: int) -> int: ...
    def clear(self) -> None: ...
    def holds(self, key: int) -> bool: ...
    def depth(self, keys: Sequence[int], cpu_weight: float) -> float: ...


class BlockTable:
    """One engine's blocks: engine hash -> (router keys, tiers), with key refcounts.

    Several engine blocks may carry the same router key (same tokens under different
    LoRA or cache salts, which the engine hashes and the router does not), so keys are
    reference counted per tier."""

    __slots__ = ("capacity", "fresh", "overflow", "_blocks", "_gpu", "_offload")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fresh = False
        self.overflow = 0  # blocks forgotten because the table was full
        self._blocks: OrderedDict[int, tuple[tuple[int, ...], int]] = OrderedDict()
        self._gpu: dict[int, int] = {}
        self._offload: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def last_key(self, engine_hash: int) -> int | None:
        """The router key at the end of an engine block (the seed of its children)."""
        entry = self._blocks.get(engine_hash)
        return entry[0][-1] if entry is not None else None

    def keys_of(self, engine_hash: int) -> tuple[int, ...] | None:
        entry = self._blocks.get(engine_hash)
        return entry[0] if entry is not None else None

    def store(self, engine_hash: int, keys: tuple[int, ...], tier: int) -> None:
        blocks = self._blocks
        entry = blocks.get(engine_hash)
        if entry is None:
            blocks[engine_hash] = (keys, tier)
            self._count(keys, tier, 1)
            if len(blocks) > self.capacity:
                old_hash, (old_keys, old_tiers) = blocks.popitem(last=False)
                self._uncount(old_keys, old_tiers)
                self.overflow += 1
            return
        old_keys, tiers = entry
        blocks.move_to_end(engine_hash)
        if not tiers & tier:
            blocks[engine_hash] = (old_keys, tiers | tier)
            self._count(old_keys, tier, 1)

    def store_run(self, hashes: Sequence[int], keys: Sequence[tuple[int, ...]], tier: int) -> None:
        """``store`` for consecutive blocks, in one loop (the hot path of ingestion)."""
        blocks = self._blocks
        counts = self._gpu if tier == _GPU else self._offload
        get = blocks.get
        for h, ks in zip(hashes, keys):
            entry = get(h)
            if entry is None:
                blocks[h] = (ks, tier)
                for key in ks:
                    counts[key] = counts.get(key, 0) + 1
            elif not entry[1] & tier:
                blocks[h] = (entry[0], entry[1] | tier)
                blocks.move_to_end(h)
                for key in entry[0]:
                    counts[key] = counts.get(key, 0) + 1
            else:
                blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            _old, (old_keys, old_tiers) = blocks.popitem(last=False)
            self._uncount(old_keys, old_tiers)
            self.overflow += 1

    def store_flat(self, hashes: Sequence[int], keys: Sequence[int], per: int, tier: int) -> None:
        """``store_run`` with the keys flat: ``hashes[j]`` holds ``keys[j*per:(j+1)*per]``."""
        self.store_run(hashes, list(zip(keys)) if per == 1 else list(zip(*[iter(keys)] * per)), tier)

    def remove_run(self, hashes: Sequence[int], tier: int) -> int:
        """``remove`` for several blocks in one loop; returns how many the table had there."""
        blocks = self._blocks
        counts = self._gpu if tier == _GPU else self._offload
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
            if tiers == tier:
                del blocks[h]
            else:
                blocks[h] = (keys, tiers & ~tier)
        return found

    def remove(self, engine_hash: int, tier: int) -> bool:
        """Drop one tier of a block; False when the table never had it there."""
        entry = self._blocks.get(engine_hash)
        if entry is None or not entry[1] & tier:
            return False
        keys, tiers = entry
        self._count(keys, tier, -1)
        if tiers == tier:
            del self._blocks[engine_hash]
        else:
            self._blocks[engine_hash] = (keys, tiers & ~tier)
        return True

    def clear(self) -> None:
        self._blocks.clear()
        self._gpu.clear()
        self._offload.clear()

    def holds(self, key: int) -> bool:
        return key in self._gpu or key in self._offload

    def depth(self, keys: Sequence[int], cpu_weight: float) -> float:
        """Leading ``keys`` held, an offloaded one counting ``cpu_weight``."""
        return leading_depth(keys, self._gpu, self._offload, cpu_weight)

    def _count(self, keys: tuple[int, ...], tier: int, delta: int) -> None:
        counts = self._gpu if tier == _GPU else self._offload
        for key in keys:
            n = counts.get(key, 0) + delta
            if n > 0:
                counts[key] = n
            else:
                counts.pop(key, None)

    def _uncount(self, keys: tuple[int, ...], tiers: int) -> None:
        for tier in (_GPU, _OFFLOAD):
            if tiers & tier:
                self._count(keys, tier, -1)


class EventResidency:
    """Every precise instance's tables (one per data-parallel rank)."""

    def __init__(self, capacity: int, cpu_weight: float = 0.8,
                 factory: Callable[[int], EngineTable] = BlockTable) -> None:
        """``factory`` makes each table from the capacity: ``BlockTable`` where events are
        applied in this process, a mirror of a sidecar's tables otherwise
        (``router.state.precise_mirror``); in the sidecar, a table that also notes its
        changes (``router.state.precise_native.tracked_table``)."""
        self._capacity = capacity
        self.cpu_weight = cpu_weight
        self._factory = factory
        self._tables: dict[str, dict[int, EngineTable]] = {}

    def table(self, instance: str, rank: int = 0) -> EngineTable:
        """The table of one engine, created (stale) on first use."""
        ranks = self._tables.setdefault(instance, {})
        table = ranks.get(rank)
        if table is None:
            table = ranks[rank] = self._factory(self._capacity)
        return table

    def instances(self) -> list[str]:
        return list(self._tables)

    def tables(self, instance: str) -> dict[int, EngineTable]:
        return self._tables.get(instance, {})

    def is_fresh(self, instance: str) -> bool:
        ranks = self._tables.get(instance)
        return ranks is not None and bool(ranks) and all(t.fresh for t in ranks.values())

    def drop(self, instance: str) -> None:
        """Forget an instance that left: its tables go (a later one of the same name starts stale)."""
        self._tables.pop(instance, None)

    def mark_stale(self, instance: str) -> None:
        for table in self._tables.get(instance, {}).values():
            table.fresh = False

    def holders(self, key: int) -> list[str]:
        """Fresh instances some engine of which holds ``key`` (a scan of the instances: for
        candidate pruning, once per request, instead of scoring every candidate)."""
        return [inst for inst, ranks in self._tables.items()
                if ranks and all(t.fresh for t in ranks.values()) and any(t.holds(key) for t in ranks.values())]

    def matched(self, keys: Sequence[int], instances: Iterable[str]) -> dict[str, int]:
        """Leading blocks held per *fresh* instance (the best of its ranks); instances
        that are stale or not precise are absent, for the caller to fill in."""
        out: dict[str, int] = {}
        tables, weight = self._tables, self.cpu_weight
        for inst in instances:
            ranks = tables.get(inst)
            if not ranks:
                continue
            best, fresh = 0.0, True
            for table in ranks.values():
                if not table.fresh:
                    fresh = False
                    break
                if keys:
                    best = max(best, table.depth(keys, weight))
            if fresh:
                out[inst] = int(best)
        return out
