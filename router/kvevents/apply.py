"""Apply decoded events to one engine's table, turning engine blocks into router keys.

A ``BlockStored`` carries the blocks' token ids and the engine hash of the block before
them, so the router key of each block is the router's own chain (the same function as
request keys in token mode) seeded with the router key of that parent block, or with
the model's root seed at the start of a prompt. An engine block of ``b`` tokens holds
``b / router_block`` router keys; an engine block size the router block does not divide
cannot meet request keys, so such events are refused (counted).
"""

from __future__ import annotations

import logging
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from router.kvevents.wire import (
    AllBlocksCleared, BlockRemoved, BlockStored, ClearedEvent, Event, RemovedEvent, StoredEvent, WireError,
    decode_event,
)
from router.request.hashing import chain_keys, pack_tokens, root_seed, token_seed
from router.state.precise import EngineTable, tier_of
from router.state.precise_native import NATIVE_HASHING, NativeTrackedTable

# The chain below is router.request.hashing's own (chain_keys from token_seed): the very same
# keys as token_block_keys (tests/kvevents/test_apply.py checks it against that function);
# into the sidecar's C tables the same chain is computed in C (store_tokens; NATIVE_HASHING).
log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
_GPU = tier_of(None)
_NATIVE_UINT32 = sys.byteorder == "little" and array("I").itemsize == 4


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

    table: EngineTable
    model: str
    router_block: int
    seed: int = 0
    counters: ApplyCounters = field(default_factory=ApplyCounters)
    _roots: dict[str, int] = field(default_factory=dict)

    def root(self, lora_name: str | None) -> int:
        """The chain's start: the served model's, or the LoRA adapter's (requests name it as the model)."""
        name = lora_name or self.model
        seed = self._roots.get(name)
        if seed is None:
            seed = self._roots[name] = token_seed(root_seed(name, self.seed))
        return seed

    def apply(self, events: list[Event]) -> None:
        """Decoded events (see wire.py), in order."""
        c = self.counters
        for ev in events:
            c.events += 1
            if type(ev) is BlockStored:
                self._stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size, ev.medium, ev.lora_name)
            elif type(ev) is BlockRemoved:
                self._removed(ev.block_hashes, ev.medium)
            elif type(ev) is AllBlocksCleared:
                self.table.clear()
                c.cleared += 1

    def apply_raw(self, raw_events: list[Any]) -> None:
        """Events as ``wire.decode_batch`` decoded them: typed structs (the hot path, whose
        types msgspec checked), or maps and arrays as msgpack decoded them, where the
        vLLM 0.32 maps with int hashes are applied straight from the maps; anything else
        goes through ``decode_event``, which validates and raises WireError on garbage."""
        c = self.counters
        for raw in raw_events:
            if isinstance(raw, StoredEvent):
                if raw.block_size < 1:
                    raise WireError("block_size must be a positive int")
                ids = raw.block_hashes
                if ids and min(ids) < 0:  # int64 as the publisher's decoder saw uint64
                    ids = [h & _MASK64 for h in ids]
                up = raw.parent_block_hash
                c.events += 1
                self._stored(ids, None if up is None else up & _MASK64, raw.token_ids, raw.block_size,
                             raw.medium, raw.lora_name)
                continue
            if isinstance(raw, RemovedEvent):  # _removed, inlined: half of all events
                gone = raw.block_hashes
                if gone and min(gone) < 0:
                    gone = [h & _MASK64 for h in gone]
                c.events += 1
                medium = raw.medium
                found = self.table.remove_run(gone, _GPU if medium is None or medium == "GPU" else tier_of(medium))
                c.removed_blocks += found
                c.unknown_removals += len(gone) - found
                continue
            if isinstance(raw, ClearedEvent):
                c.events += 1
                self.table.clear()
                c.cleared += 1
                continue
            if type(raw) is dict:
                get = raw.get
                kind = get("type")
                try:
                    if kind == "BlockStored":
                        hashes, parent, tokens, bs = get("block_hashes"), get("parent_block_hash"), get("token_ids"), get("block_size")
                        medium, lora = get("medium"), get("lora_name")
                        if (type(hashes) is list and hashes and min(hashes) >= 0 and max(hashes) <= _MASK64
                                and type(tokens) is list and type(bs) is int and bs > 0
                                and (parent is None or (type(parent) is int and 0 <= parent <= _MASK64))
                                and (medium is None or type(medium) is str) and (lora is None or type(lora) is str)):
                            c.events += 1
                            self._stored(hashes, parent, tokens, bs, medium, lora)
                            continue
                    elif kind == "BlockRemoved":
                        hashes, medium = get("block_hashes"), get("medium")
                        if (type(hashes) is list and hashes and min(hashes) >= 0 and max(hashes) <= _MASK64
                                and (medium is None or type(medium) is str)):
                            c.events += 1
                            self._removed(hashes, medium)
                            continue
                except TypeError:  # e.g. bytes hashes: the general path below handles them
                    pass
            self.apply([decode_event(raw)])

    def _removed(self, hashes: Sequence[int], medium: str | None) -> None:
        found = self.table.remove_run(hashes, tier_of(medium))
        self.counters.removed_blocks += found
        self.counters.unknown_removals += len(hashes) - found

    def _stored(self, hashes: Sequence[int], parent: int | None, tokens: Sequence[int], bs: int,
                medium: str | None, lora_name: str | None) -> None:
        c = self.counters
        table = self.table
        rb = self.router_block
        if bs % rb:
            if not c.refused:
                log.warning("kv events of model %s: engine blocks of %d tokens cannot meet router keys of %d "
                            "(set hashing.tokens.block_size to the engine's block size)", self.model, bs, rb)
            c.refused += 1
            return
        tier = _GPU if medium is None or medium == "GPU" else tier_of(medium)
        n = min(len(hashes), len(tokens) // bs)
        if parent is None:
            prev: int | None = self._roots.get(lora_name or self.model)
            if prev is None:
                prev = self.root(lora_name)
        else:
            prev = table.last_key(parent)
        per = bs // rb
        if prev is not None and NATIVE_HASHING and isinstance(table, NativeTrackedTable):
            try:  # the same chain, from the token ids, in one C call (router/state/_tracked_tokens.h)
                c.stored_blocks += table.store_tokens(hashes, tokens, bs, per, prev, tier)
            except (OverflowError, TypeError):  # a token id that is not a uint32: nothing stored
                c.refused += 1
            return
        try:
            packed = _pack(tokens if len(tokens) == n * bs else tokens[: n * bs])
        except (struct.error, OverflowError, TypeError):
            c.refused += 1
            return
        if prev is None:  # the parent is unknown: only blocks stored before can be placed
            keys: list[tuple[int, ...]] = []
            known = table.keys_of
            for j in range(n):
                ks = known(hashes[j])
                if ks is None:
                    c.orphans += n - j
                    n = j
                    break
                keys.append(ks)
            table.store_run(hashes if n == len(hashes) else hashes[:n], keys, tier)
        else:  # the request chain over the same tokens: per router keys for each engine block
            table.store_flat(hashes, chain_keys(packed, 4 * rb, n * per, prev), per, tier)  # n blocks: zip's length
        c.stored_blocks += n


def _pack(tokens: Sequence[int]) -> bytes:
    """``pack_tokens``' bytes (uint32, little-endian), by ``array`` where those are the
    machine's own (a third cheaper than ``struct`` with one argument per token);
    OverflowError or TypeError on an id that is not a uint32."""
    return array("I", tokens).tobytes() if _NATIVE_UINT32 else pack_tokens(tokens)
