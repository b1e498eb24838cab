"""Apply decoded events to one engine's table, turning engine blocks into router keys.

A ``BlockStored`` carries the blocks' token ids and the engine hash of the block before
them, so the router key of each block is the router's own chain (the same function as
request keys in token mode) seeded with the router key of that parent block, or with
the model's root seed at the start of a prompt. An engine block of ``b`` tokens holds
``b / router_block`` router keys; an engine block size the router block does not divide
cannot meet request keys, so such events are refused (counted).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import xxhash

from router.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, Event
from router.request.hashing import root_seed
from router.state.precise import BlockTable, tier_of

# The token domain byte of router.request.hashing.token_block_keys: the chain below must
# give the very same keys (tests/kvevents/test_apply.py checks it against that function).
_TOKEN_DOMAIN = b"i"


@dataclass
class ApplyCounters:
    events: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    orphans: int = 0  # stored blocks whose parent the table did not know
    refused: int = 0  # events that cannot map to router keys (block size, bad tokens)
    unknown_removals: int = 0


@dataclass
class TableWriter:
    """Writes one engine's events into its table."""

    table: BlockTable
    model: str
    router_block: int
    seed: int = 0
    counters: ApplyCounters = field(default_factory=ApplyCounters)
    _roots: dict[str, int] = field(default_factory=dict)

    def root(self, lora_name: str | None) -> int:
        """The chain's seed: the served model's, or the LoRA adapter's (requests name it as the model)."""
        name = lora_name or self.model
        seed = self._roots.get(name)
        if seed is None:
            seed = self._roots[name] = root_seed(name, self.seed)
        return seed

    def apply(self, events: list[Event]) -> None:
        c = self.counters
        table = self.table
        for ev in events:
            c.events += 1
            if type(ev) is BlockStored:
                self._stored(ev)
            elif type(ev) is BlockRemoved:
                tier = tier_of(ev.medium)
                for h in ev.block_hashes:
                    if table.remove(h, tier):
                        c.removed_blocks += 1
                    else:
                        c.unknown_removals += 1
            elif type(ev) is AllBlocksCleared:
                table.clear()
                c.cleared += 1

    def _stored(self, ev: BlockStored) -> None:
        c = self.counters
        table = self.table
        rb = self.router_block
        bs = ev.block_size
        if bs % rb:
            c.refused += 1
            return
        tier = tier_of(ev.medium)
        hashes = ev.block_hashes
        n = min(len(hashes), len(ev.token_ids) // bs)
        if ev.parent_block_hash is None:
            prev: int | None = self.root(ev.lora_name)
        else:
            prev = table.last_key(ev.parent_block_hash)
        try:
            packed = struct.pack(f"<{n * bs}I", *ev.token_ids[: n * bs])
        except struct.error:
            c.refused += 1
            return
        digest = xxhash.xxh64_intdigest
        per, stride = bs // rb, 4 * rb
        for j in range(n):
            h = hashes[j]
            known = table.keys_of(h)
            if known is not None:  # stored before (another tier, or again): its keys are known
                table.store(h, known, tier)
                prev = known[-1]
                c.stored_blocks += 1
                continue
            if prev is None:  # the parent was never seen (or forgotten): no chain to extend
                c.orphans += n - j
                return
            keys = []
            base = j * bs * 4
            for k in range(per):
                start = base + k * stride
                prev = digest(_TOKEN_DOMAIN + packed[start:start + stride], seed=prev)
                keys.append(prev)
            table.store(h, tuple(keys), tier)
            c.stored_blocks += 1
