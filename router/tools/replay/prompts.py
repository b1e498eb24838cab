"""Token ids and router block keys of trace prompts.

Traces carry content block ids, not text. Each id expands to ``block_tokens`` token ids
drawn from a hash keyed by the id alone, so equal ids give equal tokens, hence equal
engine KV blocks and equal router keys, and different ids share nothing. The last block
is cut to the prompt length.

The router side calls ``token_block_keys`` exactly as the live router does for token
prompts. Because an id names its whole prefix, the keys of the router blocks inside one
content block depend on that id alone; they are computed once per id (chaining from the
previous block's last key) and reused, which is identical to hashing the whole prompt
and several times cheaper on traces where most blocks recur.
"""

from __future__ import annotations

import hashlib
import struct
from array import array

from router.config.model import HashingConfig
from router.request.hashing import root_seed, token_block_keys, token_chain, token_seed
from router.tools.replay.trace import TraceRequest

_MAX_CACHED_IDS = 1_000_000  # ~8 keys each; beyond this the cache restarts (still correct)


class PromptBuilder:
    def __init__(self, block_tokens: int, hashing: HashingConfig, model: str) -> None:
        self._bt = block_tokens
        self._rb = hashing.block_tokens
        self._max_blocks = hashing.max_blocks
        self._root = root_seed(model, hashing.seed)
        self._aligned = block_tokens % self._rb == 0
        self._keys: dict[int, tuple[int, ...]] = {}

    @property
    def router_block_tokens(self) -> int:
        return self._rb

    def block_bytes(self, block_id: int) -> bytes:
        """``block_tokens`` little-endian uint32 token ids of one content block."""
        return hashlib.shake_128(struct.pack("<Q", block_id)).digest(4 * self._bt)

    def tokens(self, req: TraceRequest) -> list[int]:
        raw = b"".join([self.block_bytes(b) for b in req.blocks])
        ids = array("I")
        ids.frombytes(raw[: 4 * req.input_tokens])
        if len(ids) != req.input_tokens:
            raise ValueError(f"{len(req.blocks)} blocks cannot hold {req.input_tokens} tokens")
        return ids.tolist()

    def keys(self, req: TraceRequest, tokens: list[int]) -> tuple[int, ...]:
        """Router keys of ``tokens`` (the prompt of ``req``), as ``token_block_keys`` gives them."""
        if not self._aligned:
            return tuple(token_block_keys(tokens, self._rb, self._root, self._max_blocks))
        if len(self._keys) > _MAX_CACHED_IDS:
            self._keys.clear()
        bt, per = self._bt, self._bt // self._rb
        keys: list[int] = []
        prev = token_seed(self._root)
        full = len(tokens) // bt
        for i, block in enumerate(req.blocks[:full]):
            if len(keys) >= self._max_blocks:
                break
            cached = self._keys.get(block)
            if cached is None:
                cached = tuple(token_chain(tokens[i * bt : (i + 1) * bt], self._rb, prev, per))
                self._keys[block] = cached
            keys.extend(cached)
            prev = cached[-1]
        else:
            keys.extend(token_chain(tokens[full * bt :], self._rb, prev, self._max_blocks))
        return tuple(keys[: self._max_blocks])
