"""Deterministic "generated" tokens: a function of seed, prompt and position (a prompt ending
in generated words continues where they left off: see :meth:`OutputSampler.request_key`).

Why: clients, tests and trace replays must see the same completion for the
same request on every run and on every engine (a decode engine in a PD pair
must continue exactly as a mixed engine would). Each output token is a short
English word that the emulator tokenizer encodes as exactly one token, so a
completion fed back in a later chat turn re-tokenises to the same ids.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence

import xxhash

from router.tools.emulator.tokenizer import Tokenizer

_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with",
    "was", "on", "be", "by", "this", "are", "or", "from", "at", "which", "an",
    "but", "not", "have", "has", "one", "were", "they", "their", "all", "its",
    "can", "more", "been", "other", "some", "these", "into", "time", "when",
    "there", "only", "new", "may", "would", "first", "also", "than", "two",
    "cache", "token", "model", "route", "engine", "block", "prefix", "decode",
    "fill", "batch", "queue", "graph", "layer", "head", "shard", "node", "link",
    "fast", "slow", "warm", "cold", "hit", "miss", "load", "page", "ring",
    "data", "value", "state", "step", "flow", "path", "level", "point", "set",
    "we", "you", "will", "each", "most", "over", "such", "after", "where",
    "long", "short", "same", "next", "then", "now", "here", "very", "well",
)
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finaliser: cheap, well-distributed, pure integer math."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class OutputSampler:
    """Maps (request key, position) to a word token; precomputes its texts."""

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        self._seed = seed & _MASK
        ids = [tokenizer.token_id(" " + w) for w in _WORDS]
        self._ids: tuple[int, ...] = tuple(ids)
        self._word_ids: frozenset[int] = frozenset(ids)
        self._text: dict[int, str] = {i: " " + w for i, w in zip(ids, _WORDS)}
        self._json: dict[int, str] = {i: json.dumps(t) for i, t in self._text.items()}

    def request_key(self, prompt: Sequence[int]) -> int:
        """Per-request key from the seed and the prompt.

        A prompt that ends in words this sampler generates is treated as the same request,
        further along: its key is the key of the prompt without them, advanced by their
        number. So a continuation (prompt + what was generated so far, sent again after an
        engine died mid-stream) goes on exactly as the unbroken run would have."""
        words = self._word_ids
        base = len(prompt)
        while base > 0 and prompt[base - 1] in words:
            base -= 1
        digest = xxhash.xxh3_64_intdigest(array("l", prompt[:base]).tobytes(), seed=self._seed)
        return (_mix(digest) + len(prompt) - base) & _MASK

    def token(self, key: int, position: int) -> int:
        """Token id generated at ``position`` (0 = first output token)."""
        ids = self._ids
        return ids[_mix(key + position) % len(ids)]

    def text(self, token_id: int) -> str:
        return self._text.get(token_id, "")

    def json_text(self, token_id: int) -> str:
        """The token's text already JSON-encoded (saves work per SSE chunk)."""
        return self._json.get(token_id, '""')

    def detokenize(self, token_ids: Sequence[int]) -> str:
        text = self._text
        return "".join(text.get(t, "") for t in token_ids)
