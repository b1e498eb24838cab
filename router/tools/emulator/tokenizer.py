"""The emulator's own deterministic tokenizer and chat template.

Why its own: the engine must tokenise independently of the router (which has
its own prompt/hashing code) so that the router *earns* its cache hits; if
both shared one tokenizer a bug in it would be invisible. It only needs to be
stable across runs and machines and roughly as dense as a real BPE (about 4
characters per token on English text), not linguistically meaningful.

Scheme: a regex splits text into special markers, letter runs (with one
leading space), digit groups of up to 3, single punctuation marks and
whitespace runs. Letter runs longer than ``_CHUNK`` letters are cut into
pieces. Pure-ASCII pieces map to ``_FIRST_PIECE_ID + xxh3(piece) % span``;
anything else falls back to one id per UTF-8 byte. Ids below 16 are special.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import xxhash

VOCAB_SIZE = 128_000
BOS_ID = 1
_SPECIALS: Mapping[str, int] = MappingProxyType({
    "<|begin_of_text|>": BOS_ID,
    "<|end_of_text|>": 2,
    "<|start|>": 3,
    "<|end|>": 4,
})
_BYTE_BASE = 16
_FIRST_PIECE_ID = _BYTE_BASE + 256
_PIECE_SPAN = VOCAB_SIZE - _FIRST_PIECE_ID
_CHUNK = 6
_CACHE_LIMIT = 200_000

_SPLIT = re.compile(
    "|".join(re.escape(marker) for marker in _SPECIALS)  # special markers
    + r"| ?[A-Za-z]+"           # words with one optional leading space
    r"| ?[0-9]{1,3}"          # numbers in groups of three digits
    r"| ?[^\sA-Za-z0-9]"      # one punctuation mark or non-ASCII character
    r"|\s+"                   # other whitespace runs
)

CHAT_ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool"})


class Tokenizer:
    """Text -> token ids. Instances keep a bounded piece cache for speed."""

    vocab_size: int = VOCAB_SIZE
    bos_id: int = BOS_ID

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Tokenise ``text``; prepend BOS like Llama-3 servers do by default."""
        ids: list[int] = [BOS_ID] if add_bos else []
        cache = self._cache
        for piece in _SPLIT.findall(text):
            cached = cache.get(piece)
            if cached is None:
                cached = self._encode_piece(piece)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[piece] = cached
            ids.extend(cached)
        return ids

    def token_id(self, piece: str) -> int:
        """Id of a piece that must encode to exactly one token."""
        ids = self._encode_piece(piece)
        if len(ids) != 1:
            raise ValueError(f"{piece!r} is not a single token")
        return ids[0]

    @staticmethod
    def _encode_piece(piece: str) -> tuple[int, ...]:
        special = _SPECIALS.get(piece)
        if special is not None:
            return (special,)
        if not piece.isascii():
            return tuple(_BYTE_BASE + b for b in piece.encode("utf-8"))
        letters = piece.lstrip(" ")
        if len(letters) > _CHUNK and letters.isalpha():
            lead = piece[: len(piece) - len(letters) + _CHUNK]
            rest = letters[_CHUNK:]
            parts = [lead] + [rest[i:i + _CHUNK] for i in range(0, len(rest), _CHUNK)]
            return tuple(_hash_piece(p) for p in parts)
        return (_hash_piece(piece),)

    def render_chat(self, messages: Sequence[Mapping[str, object]]) -> str:
        """Apply the emulator's chat template (see :func:`render_chat`)."""
        return render_chat(messages)

    def encode_chat(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        """Render then tokenise; the template carries its own BOS."""
        return self.encode(render_chat(messages), add_bos=False)


def _hash_piece(piece: str) -> int:
    return _FIRST_PIECE_ID + xxhash.xxh3_64_intdigest(piece.encode("ascii")) % _PIECE_SPAN


def message_text(content: object) -> str:
    """Flatten OpenAI message content (string or list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" \
                    and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ValueError("only text content parts are supported")
        return "".join(parts)
    raise ValueError("message content must be a string or a list of parts")


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """The emulator's chat template: role markers around each message.

    ``<|begin_of_text|>`` then, per message, ``<|start|>role\\ncontent<|end|>\\n``,
    and finally ``<|start|>assistant\\n`` as the generation prompt. Earlier
    turns render identically whatever follows, so multi-turn conversations
    share a growing token prefix, as with real templates.
    """
    out = ["<|begin_of_text|>"]
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise ValueError(f"invalid message role {role!r}")
        out.append(f"<|start|>{role}\n{message_text(message.get('content'))}<|end|>\n")
    out.append("<|start|>assistant\n")
    return "".join(out)
