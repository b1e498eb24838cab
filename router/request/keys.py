"""A parsed request's routing facts: chained block keys of its prompt and its token counts."""

from __future__ import annotations

from router.config.model import HashingConfig
from router.request.hashing import root_seed, text_block_keys, token_block_keys
from router.request.prompt import ParsedRequest
from router.scheduling.framework import RouteRequest


def route_request(parsed: ParsedRequest, hashing: HashingConfig, request_id: str, default_max_tokens: int) -> RouteRequest:
    """Block keys and token counts of a parsed request (keys of the first prompt of a batch)."""
    seed = root_seed(parsed.model, hashing.seed)
    if parsed.tokens is not None:
        keys = token_block_keys(parsed.tokens, hashing.block_tokens, seed, hashing.max_blocks)
    else:
        keys = text_block_keys(parsed.text or "", hashing.block_chars, seed, hashing.max_blocks)
    return RouteRequest(
        id=request_id,
        keys=tuple(keys),
        prompt_tokens=parsed.prompt_tokens,
        max_tokens=parsed.max_tokens or default_max_tokens,
        block_tokens=hashing.block_tokens if parsed.tokens is not None else hashing.text_block_tokens,
    )
