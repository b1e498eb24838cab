"""Mirror tables in shared memory: the sidecar writes them in place, the loop only reads.

With deltas (``router.state.precise_mirror``) every key an engine stores or evicts is a
hash-table update on the router's event loop. Here each engine table's held keys live in
a memory segment (``router.state._keyset.SharedKeys`` over a ``memfd``) that the sidecar
updates as it takes its deltas, and the router maps read-only; the sidecar sends the
segment's file descriptor over the socket it already streams on (``SEGMENT`` frames)
when it makes one: a table's first, or a bigger or smaller one when the keys outgrow
the old (capacities are fixed per segment) or a resync starts it over. KV events then
cost the router's process nothing but lookups.

Linux only (``memfd_create``, file descriptors passed over a Unix socket) and only with
the C extension; elsewhere, or with ``kv_events.shared_tables: false``, the deltas.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Literal

from router.state.precise_mirror import MirrorTable, TableDelta

try:
    from router.state._keyset import SharedKeys, shared_size
except ImportError:  # installed without a C compiler
    SharedKeys = None  # type: ignore[assignment,misc]

SHARED_BUILT = SharedKeys is not None
MIN_CAP = 16


def shared_tables(wanted: bool = True) -> Literal["shared", "deltas"]:
    """How the sidecar's tables reach the loop: in shared memory if wanted and possible."""
    possible = SHARED_BUILT and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")
    return "shared" if wanted and possible else "deltas"


def cap_for(n: int) -> int:
    """The slots for ``n`` keys at a load of at most 1/2."""
    cap = MIN_CAP
    while cap < 2 * n:
        cap *= 2
    return cap


def new_segment(caps: tuple[int, int]) -> tuple[int, mmap.mmap, SharedKeys]:
    """A new, empty segment: its file descriptor (to send, then close), mapping and writer."""
    size = shared_size(*caps)
    fd = os.memfd_create("pd-router-keys", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
        return fd, mm, SharedKeys(mm, caps)
    except BaseException:
        os.close(fd)
        raise


def map_segment(fd: int) -> tuple[mmap.mmap, SharedKeys]:
    """A segment another process writes, mapped read-only (the descriptor is closed)."""
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        return mm, SharedKeys(mm)
    except BaseException:
        mm.close()
        raise


def _unmap(mm: mmap.mmap | None) -> None:
    """Unmap now, or (while a caller still holds the segment's reader) when it lets go."""
    if mm is not None:
        with contextlib.suppress(BufferError):
            mm.close()


class SegmentWriter:
    """The sidecar's side of one table's segment."""

    __slots__ = ("keys", "_mm")

    def __init__(self) -> None:
        self.keys: SharedKeys | None = None
        self._mm: mmap.mmap | None = None

    def ship(self, delta: TableDelta) -> int | None:
        """Apply a delta in place; returns the descriptor of a new segment (for the caller
        to send, then close) when this one could not take it or is far too big now."""
        keys = self.keys
        adds = (len(delta.added_gpu), len(delta.added_offload))
        if keys is None or delta.reset:
            used = (0, 0)
        else:
            _size, _overflow, _fresh, *held = keys.state()
            used = (held[0], held[1])
        need = tuple(u + a for u, a in zip(used, adds))
        if keys is not None and not delta.reset and all(
                n * 8 <= cap * 5 and (cap <= MIN_CAP or (n - r) * 8 >= cap)
                for n, cap, r in zip(need, keys.caps, (len(delta.removed_gpu), len(delta.removed_offload)))):
            self._apply(keys, delta)
            return None
        fd, mm, fresh_keys = new_segment((cap_for(need[0]), cap_for(need[1])))
        try:
            if keys is not None and not delta.reset:
                fresh_keys.copy_from(keys)
            self._apply(fresh_keys, delta)
        except BaseException:
            del fresh_keys
            mm.close()
            os.close(fd)
            raise
        del keys  # the old segment's writer: close() unmaps it
        self.close()
        self.keys, self._mm = fresh_keys, mm
        return fd

    @staticmethod
    def _apply(keys: SharedKeys, delta: TableDelta) -> None:
        keys.apply(delta.added_gpu, delta.removed_gpu, delta.added_offload, delta.removed_offload,
                   delta.size, delta.overflow, delta.fresh)

    def close(self) -> None:
        """Unmap this side (the reader's mapping keeps the memory until it lets go too)."""
        self.keys = None
        _unmap(self._mm)
        self._mm = None


def segment_bytes(tables: Iterable[object]) -> int:
    """The shared memory of these tables' segments (0 for tables that are not shared)."""
    return sum(t.segment_bytes for t in tables if isinstance(t, SharedMirrorTable))


class SharedMirrorTable(MirrorTable):
    """A ``MirrorTable`` read from the sidecar's segment instead of applied deltas.

    Until a segment is attached (and after ``clear``: the sidecar that wrote it is gone)
    it holds nothing and is stale. ``fresh = False`` set here (the router saw the engine
    come back) holds until the sidecar next writes the table, as with deltas."""

    __slots__ = ("_keys", "_mm", "_local_fresh", "_stale_at")

    def __init__(self, capacity: int, native: bool = True) -> None:
        self._keys: SharedKeys | None = None
        self._mm: mmap.mmap | None = None
        self._local_fresh = False
        self._stale_at: int | None = None
        super().__init__(capacity, native)

    def attach(self, mm: mmap.mmap, keys: SharedKeys) -> None:
        """Read from this segment from now on (the one before is let go)."""
        self._release()
        self._keys, self._mm, self._stale_at = keys, mm, None

    @property
    def attached(self) -> bool:
        return self._keys is not None

    @property
    def segment_bytes(self) -> int:
        """The attached segment's size (mapped here and in the sidecar, present once)."""
        return len(self._mm) if self._mm is not None and not self._mm.closed else 0

    def _release(self) -> None:
        self._keys = None
        _unmap(self._mm)
        self._mm = None

    @property
    def fresh(self) -> bool:
        keys = self._keys
        if keys is None:
            return self._local_fresh
        if self._stale_at is not None:
            if keys.version == self._stale_at:
                return False
            self._stale_at = None
        return keys.fresh

    @fresh.setter
    def fresh(self, value: bool) -> None:
        self._local_fresh = value
        keys = getattr(self, "_keys", None)
        if keys is not None:
            self._stale_at = None if value else keys.version

    @property
    def overflow(self) -> int:
        keys = self._keys
        return keys.overflow if keys is not None else 0

    @overflow.setter
    def overflow(self, value: int) -> None:  # BlockTable.__init__'s; the segment's counts
        return

    def __len__(self) -> int:
        keys = self._keys
        return keys.size if keys is not None else 0

    def held(self) -> tuple[set[int], set[int]]:
        keys = self._keys
        if keys is None:
            return set(), set()
        return set(keys.tolist(0)), set(keys.tolist(1))

    def holds(self, key: int) -> bool:
        keys = self._keys
        return keys is not None and key in keys

    def depth(self, keys: Sequence[int], cpu_weight: float) -> float:
        shared = self._keys
        return shared.depth(keys, cpu_weight) if shared is not None else 0.0

    def apply_part(self, delta: TableDelta, done: int, budget: int) -> int:
        raise TypeError("a shared mirror table is written by its sidecar in place, not by deltas")

    def clear(self) -> None:
        """Forget everything (the sidecar that wrote the segment is gone)."""
        self._release()
        self._local_fresh = False
