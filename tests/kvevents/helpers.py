"""Batches as vLLM's publisher frames them, built with msgpack directly."""

from __future__ import annotations

import random

import msgpack

from router.request.hashing import root_seed, token_block_keys


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def keys(tokens: list[int], model: str = "m", block: int = 16) -> list[int]:
    return token_block_keys(tokens, block, root_seed(model), 4096)


def stored(hashes, parent, tokens, block_size=16, medium="GPU") -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": medium,
            "lora_name": None}


def removed(hashes, medium="GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def cleared() -> dict:
    return {"type": "AllBlocksCleared"}


def batch(*events) -> bytes:
    return msgpack.packb([1.0, list(events), 0], use_bin_type=True)


def frames(topic: str, seq: int, *events) -> list[bytes]:
    return [topic.encode(), seq.to_bytes(8, "big"), batch(*events)]
