"""Chained block keys: key i covers the whole prefix up to and including block i.

Chaining (each block hashed with the previous key as its seed) means two prompts share
key i exactly when they share the first i+1 blocks, so "how many leading keys does an
instance hold" is "how long a prefix it has cached". Only full blocks get keys, as only
full blocks are cached by the engines.

The chain is ``key_i = xxh3_64(block_i, seed=key_{i-1})`` from a seed that names the model
and the domain (text characters or token ids, so the two never collide): :func:`chain_keys`,
the one definition every caller uses (request keys, KV-event mapping, the replay). It is
computed in C where the extension ``router.request._chain`` was built (xxHash's own code,
the keys the binding computes: ~60 µs for a 128K-token prompt's 2,048 blocks), else without a
Python-level loop per block: the prompt's bytes are split into blocks by ``struct`` (C) and
hashed by ``map`` feeding each key back as the next seed (~165 µs for the same prompt; a
per-block Python loop was ~100 µs for 512 blocks).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Sequence
from itertools import chain

import xxhash

_native_chain: Callable[[bytes, int, int, int], list[int]] | None
try:
    from router.request._chain import chain_keys as _native_chain
except ImportError:  # built without a C compiler: the binding through map() (same keys)
    _native_chain = None

_TEXT_DOMAIN = b"t"
_TOKEN_DOMAIN = b"i"
_GROUP = 64  # blocks per struct call: a bounded set of compiled formats whatever the prompt length


@functools.lru_cache(maxsize=1024)
def root_seed(model: str, seed: int = 0) -> int:
    """Seed of the chain: different models never share keys (kept per model: a handful are served)."""
    return xxhash.xxh64_intdigest(model.encode("utf-8"), seed=seed)


@functools.lru_cache(maxsize=256)
def _domain_seed(seed: int, domain: bytes) -> int:
    return xxhash.xxh3_64_intdigest(domain, seed=seed)


@functools.lru_cache(maxsize=256)
def _splitter(block_bytes: int, blocks: int) -> struct.Struct:
    return struct.Struct(f"{block_bytes}s" * blocks)


def _blocks(data: bytes, block_bytes: int, n_blocks: int) -> Iterable[bytes]:
    full, rest = divmod(n_blocks, _GROUP)
    group, stride = _splitter(block_bytes, _GROUP), block_bytes * _GROUP
    parts = [group.unpack_from(data, i * stride) for i in range(full)]
    if rest:
        parts.append(_splitter(block_bytes, rest).unpack_from(data, full * stride))
    return chain.from_iterable(parts)


def chain_keys(data: bytes, block_bytes: int, n_blocks: int, seed: int) -> list[int]:
    """Keys of the first ``n_blocks`` blocks of ``block_bytes`` bytes of ``data``, chained from
    ``seed`` (the key of the block before them, or a domain seed)."""
    if n_blocks <= 0:
        return []
    if _native_chain is not None:
        return _native_chain(data, block_bytes, n_blocks, seed)
    return python_chain_keys(data, block_bytes, n_blocks, seed)


def python_chain_keys(data: bytes, block_bytes: int, n_blocks: int, seed: int) -> list[int]:
    """:func:`chain_keys` through the binding (the fallback, and the reference of the tests)."""
    if n_blocks <= 0:
        return []
    keys = [seed]
    # map reads its seeds from the list it is extending: each key is the next block's seed
    # (list.extend appends every item before asking for the next one).
    keys.extend(map(xxhash.xxh3_64_intdigest, _blocks(data, block_bytes, n_blocks), keys))
    del keys[0]
    return keys


def text_block_keys(text: str, block_chars: int, seed: int, max_blocks: int) -> list[int]:
    """Keys of the full ``block_chars``-character blocks of ``text`` (at most ``max_blocks``)."""
    n_blocks = min(len(text) // block_chars, max_blocks)
    if n_blocks <= 0:
        return []
    start = _domain_seed(seed, _TEXT_DOMAIN)
    if text.isascii():  # one encode, then byte blocks: characters and bytes coincide
        # chain_keys reads only the leading blocks, so the prefix is cut off only when the rest
        # is longer than it: a slice copies the prefix, an encode copies what it encodes.
        hashed = n_blocks * block_chars
        data = text.encode("ascii") if len(text) <= 2 * hashed else text[:hashed].encode("ascii")
        return chain_keys(data, block_chars, n_blocks, start)
    keys: list[int] = []
    prev = start
    for i in range(n_blocks):  # blocks of characters, each of its own byte length
        prev = xxhash.xxh3_64_intdigest(text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass"), prev)
        keys.append(prev)
    return keys


def token_seed(seed: int) -> int:
    """The chain's start for token-id prompts of a model whose root seed is ``seed``."""
    return _domain_seed(seed, _TOKEN_DOMAIN)


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as the chain hashes them (4 bytes each, little-endian); struct.error when one
    does not fit."""
    return struct.pack(f"<{len(tokens)}I", *tokens)


def token_block_keys(tokens: Sequence[int], block_tokens: int, seed: int, max_blocks: int) -> list[int]:
    """Keys of the full ``block_tokens``-token blocks of a token-id prompt, from a model's root
    ``seed``."""
    return token_chain(tokens, block_tokens, token_seed(seed), max_blocks)


def token_chain(tokens: Sequence[int], block_tokens: int, prev: int, max_blocks: int) -> list[int]:
    """As :func:`token_block_keys`, continuing the chain after the key ``prev``."""
    n_blocks = min(len(tokens) // block_tokens, max_blocks)
    if n_blocks <= 0:
        return []
    return chain_keys(pack_tokens(tokens[: n_blocks * block_tokens]), 4 * block_tokens, n_blocks, prev)
