"""Chained block keys: key i covers the whole prefix up to and including block i.

Chaining (each block hashed with the previous key as its seed) means two prompts share
key i exactly when they share the first i+1 blocks, so "how many leading keys does an
instance hold" is "how long a prefix it has cached". Only full blocks get keys, as only
full blocks are cached by the engines.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

_TEXT_DOMAIN = b"t"
_TOKEN_DOMAIN = b"i"


def root_seed(model: str, seed: int = 0) -> int:
    """Seed of the chain: different models never share keys."""
    return xxhash.xxh64_intdigest(model.encode("utf-8"), seed=seed)


def text_block_keys(text: str, block_chars: int, seed: int, max_blocks: int) -> list[int]:
    """Keys of the full ``block_chars``-character blocks of ``text`` (at most ``max_blocks``)."""
    keys: list[int] = []
    prev = seed
    n_blocks = min(len(text) // block_chars, max_blocks)
    digest = xxhash.xxh64_intdigest
    if text.isascii():  # one encode, then byte slices: characters and bytes coincide
        data = text[: n_blocks * block_chars].encode("ascii")
        for start in range(0, n_blocks * block_chars, block_chars):
            prev = digest(_TEXT_DOMAIN + data[start : start + block_chars], seed=prev)
            keys.append(prev)
        return keys
    for i in range(n_blocks):
        chunk = text[i * block_chars : (i + 1) * block_chars]
        prev = digest(_TEXT_DOMAIN + chunk.encode("utf-8", "surrogatepass"), seed=prev)
        keys.append(prev)
    return keys


def token_block_keys(tokens: Sequence[int], block_tokens: int, seed: int, max_blocks: int) -> list[int]:
    """Keys of the full ``block_tokens``-token blocks of a token-id prompt."""
    keys: list[int] = []
    prev = seed
    n_blocks = min(len(tokens) // block_tokens, max_blocks)
    fmt = f"<{block_tokens}I"
    for i in range(n_blocks):
        chunk = tokens[i * block_tokens : (i + 1) * block_tokens]
        prev = xxhash.xxh64_intdigest(_TOKEN_DOMAIN + struct.pack(fmt, *chunk), seed=prev)
        keys.append(prev)
    return keys
