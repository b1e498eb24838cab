"""The sidecar's engine-block tables, in C where the extension was built.

``TrackedTable`` (``router.state.precise_mirror``) keeps an ``OrderedDict`` entry per engine
block, a dict entry per router key and tier, and Python sets of the keys that changed:
most of the sidecar's CPU per event at 100k events/s. ``router.state._tracked`` holds the
same in C (open-addressing tables, an LRU list over an array of blocks), applies an
event's blocks in one call (``store_tokens``: router keys chained from the token ids
there too) and builds a delta's arrays straight from its change sets;
``NativeTrackedTable`` adds the ``take_delta`` the sidecar ships. Same contents and deltas
as the Python table (``tests/state/test_tracked_native.py``), which stays the fallback:
``kv_events.native_tables: false``, or an install without a C compiler. Without a sidecar
the same C table, made with ``track=False`` (no change notes), is the in-process table
(``engine_table``), ``BlockTable`` its fallback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Literal

import xxhash

from router.state.precise import BlockTable, EngineTable
from router.state.precise_mirror import TableDelta, TrackedTable

try:
    from router.state import _tracked
    from router.state._tracked import TrackedBlocks as _Base

    NATIVE_TABLES_BUILT = True
except ImportError:  # installed without a C compiler: the Python TrackedTable serves
    _Base = object  # type: ignore[assignment,misc]
    NATIVE_TABLES_BUILT = False


def _bind_xxh3() -> bool:
    """Hand ``_tracked`` the xxHash library's ``XXH3_64bits_withSeed``, for
    ``store_tokens``: the very function ``xxhash.xxh3_64_intdigest`` calls, which the
    xxhash package's extension exports. True once it answers as ``xxh3_64_intdigest`` on
    every input length class of XXH3 and a few seeds; False (the chain stays in Python)
    when the symbol is missing or answers otherwise."""
    if not NATIVE_TABLES_BUILT:
        return False
    try:
        import ctypes

        binding = importlib.import_module("xxhash._xxhash")
        address = ctypes.cast(ctypes.CDLL(binding.__file__).XXH3_64bits_withSeed, ctypes.c_void_p).value
    except (ImportError, OSError, AttributeError, TypeError):
        return False
    if not address:
        return False
    _tracked.use_xxh3(address)
    data = bytes(range(256)) * 2
    probes = [(data[:n], seed) for n in (0, 1, 3, 4, 8, 9, 16, 17, 64, 128, 129, 240, 241, 500)
              for seed in (0, 1, 2**63 + 12345, 2**64 - 1)]
    if all(_tracked.xxh3(d, seed) == xxhash.xxh3_64_intdigest(d, seed=seed) for d, seed in probes):
        return True
    _tracked.use_xxh3(0)
    return False


NATIVE_HASHING = _bind_xxh3()
"""Whether ``NativeTrackedTable.store_tokens`` can chain router keys (``TableWriter`` uses it then)."""


class NativeTrackedTable(_Base):
    """A ``TrackedTable`` in C: an engine's blocks and the router keys whose presence
    changed since the last ``take_delta``."""

    __slots__ = ()

    def take_delta(self) -> TableDelta | None:
        """The changes since the last call, or None when there were none."""
        taken = self.take()
        return None if taken is None else TableDelta(*taken)


def table_kind(native: bool = True) -> Literal["native", "python"]:
    """Which tables ``tracked_table(native)`` and ``engine_table(native)`` make: C if asked and built."""
    return "native" if native and NATIVE_TABLES_BUILT else "python"


def _untracked(capacity: int) -> EngineTable:
    return NativeTrackedTable(capacity, track=False)


def engine_table(native: bool = True) -> Callable[[int], EngineTable]:
    """The factory of in-process tables (no sidecar): the C table without change notes
    (~2.5x less CPU per event than ``BlockTable``), else ``BlockTable``."""
    return _untracked if table_kind(native) == "native" else BlockTable


def tracked_table(native: bool = True) -> Callable[[int], EngineTable]:
    """The sidecar's table factory (capacity -> table)."""
    return NativeTrackedTable if table_kind(native) == "native" else TrackedTable


Tracked = TrackedTable | NativeTrackedTable
"""Either kind of table a sidecar writes (both have ``take_delta``)."""
