"""An engine's side of the shared KV store (store_server.py): look up, load, write.

Why a client of its own: the engine stays pure (it only learns how many leading tokens the
store holds, and is told when a load finished); this is the I/O around it. Lookups happen on
arrival (so admission knows what it may load), loads once the engine admitted the request
(it computes the rest meanwhile), writes in the background (they never delay a token). A
store that fails is counted and treated as empty: a failed load lets the request go on as
if its KV had arrived (the emulator keeps no KV contents, only its timing), and is counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)

MAX_PENDING_WRITES = 256
"""Background writes in flight at most; more are dropped (and counted) rather than queued."""


@dataclass
class StoreClientCounters:
    lookups: int = 0
    hit_tokens: int = 0
    """Prompt tokens the store held at lookup (beyond what the engine caches, or not)."""
    loads: int = 0
    loaded_tokens: int = 0
    loaded_bytes: int = 0
    writes: int = 0
    written_blocks: int = 0
    """Blocks sent to the store (new or refreshed)."""
    dropped_writes: int = 0
    failures: int = 0


class StoreClient:
    def __init__(self, url: str, http: Callable[[], httpx.AsyncClient | None], block_size: int) -> None:
        self._url = url.rstrip("/")
        self._http = http
        self._block_size = block_size
        self.counters = StoreClientCounters()
        self._writes: set[asyncio.Task[dict[str, object] | None]] = set()

    async def _post(self, path: str, doc: dict[str, object]) -> dict[str, object] | None:
        client = self._http()
        if client is None:
            return None
        try:
            resp = await client.post(self._url + path, json=doc, timeout=30.0)
            if resp.status_code == 200:
                body: dict[str, object] = resp.json()
                return body
            log.warning("kv store %s answered %d", path, resp.status_code)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("kv store %s failed: %r", path, exc)
        self.counters.failures += 1
        return None

    async def lookup(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the store holds (0 when it fails)."""
        self.counters.lookups += 1
        if not hashes:
            return 0
        doc = await self._post("/store/lookup", {"hashes": list(hashes)})
        blocks = doc.get("blocks") if doc is not None else 0
        n = blocks if isinstance(blocks, int) else 0
        self.counters.hit_tokens += n * self._block_size
        return n

    async def load(self, tokens: int, nbytes: int) -> bool:
        """Move ``tokens`` of KV (``nbytes``) from the store; returns once they arrived."""
        doc = await self._post("/store/load", {"blocks": tokens // self._block_size, "bytes": nbytes})
        c = self.counters
        c.loads += 1
        if doc is None:
            return False
        c.loaded_tokens += tokens
        c.loaded_bytes += nbytes
        return True

    def write(self, hashes: Sequence[int]) -> None:
        """Store a chain of blocks in the background."""
        if not hashes:
            return
        if len(self._writes) >= MAX_PENDING_WRITES:
            self.counters.dropped_writes += 1
            return
        c = self.counters
        c.writes += 1
        c.written_blocks += len(hashes)
        task = asyncio.get_running_loop().create_task(self._post("/store/put", {"hashes": list(hashes)}))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def close(self) -> None:
        for task in list(self._writes):
            task.cancel()
        self._writes.clear()
