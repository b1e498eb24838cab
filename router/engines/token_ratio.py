"""How many of an engine's tokens one of the router's estimated tokens is, learned from the
engine's own answers.

Why: with character keys (``hashing.mode: chars``) the router counts a prompt's tokens as
characters / ``hashing.chars_per_token``, and turns an engine's cache (reported in the
engine's tokens: vLLM ``num_gpu_blocks x block_size``, SGLang ``max_total_num_tokens``) into
residency entries and KV room in those estimated tokens. A fixed 4 characters per token is
right for English on Llama-3-like tokenizers and wrong elsewhere: the project's real-vLLM
testbed's tokenizer makes ~4.4 (the router then believed the caches 10% smaller than they
were); code runs nearer 3, and text a tokenizer falls back to bytes for (most non-Latin
scripts on small vocabularies) a few times fewer. Every answer says how many tokens its
prompt was (``usage.prompt_tokens``), so the ratio is measured instead of assumed: one per
model (the tokenizer is the model's; router/request/hooks.py TokenRatioHook), and the
capacity of every instance serving the model is converted with it.

The estimate is a ratio of decayed sums (reported over estimated tokens, each weighing its
prompt's length), used once ``min_requests`` answers are in, and bounded to
[``MIN_RATIO``, ``MAX_RATIO``] so no answer can push the belief anywhere absurd.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_RATIO = 0.1
MAX_RATIO = 10.0
_MAX_TOKENS = 100_000_000  # a reported count above this is not a prompt: ignored
_KEY = b'"prompt_tokens"'
_SPACE = frozenset(b" \t\r\n")
_OPENERS = frozenset(b"{,")


def reported_prompt_tokens(data: bytes) -> int | None:
    """The last ``"prompt_tokens": N`` in ``data`` (a JSON answer, or the tail of an event
    stream whose last event carries ``usage``), or None when there is none.

    Only an object key counts: preceded by ``{`` or ``,`` (whitespace allowed), followed by
    ``:`` and digits. Text the model generated cannot fake one, since quotes inside JSON
    strings are escaped."""
    end = len(data)
    while True:
        at = data.rfind(_KEY, 0, end)
        if at < 0:
            return None
        end = at
        i = at - 1  # the byte before the key, past whitespace (no copy of what precedes: answers can be long)
        while i >= 0 and data[i] in _SPACE:
            i -= 1
        if i < 0 or data[i] not in _OPENERS:
            continue
        rest = data[at + len(_KEY): at + len(_KEY) + 32].lstrip()
        if not rest.startswith(b":"):
            continue
        digits = rest[1:].lstrip()
        n = 0
        while n < len(digits) and 48 <= digits[n] <= 57:
            n += 1
        if n == 0 or n > 12:
            continue
        value = int(digits[:n])
        return value if 0 < value <= _MAX_TOKENS else None


@dataclass
class TokenRatio:
    """One model's engine tokens per router-estimated token (1.0 until measured)."""

    min_requests: int = 16
    memory: float = 256.0  # answers: each one's weight decays by 1/memory per later answer
    estimated: float = 0.0  # decayed sums
    reported: float = 0.0
    answers: int = 0

    def observe(self, estimated: int, reported: int) -> None:
        """One answer: the router estimated ``estimated`` prompt tokens, the engine counted ``reported``."""
        if estimated <= 0 or not 0 < reported <= _MAX_TOKENS:
            return
        keep = 1.0 - 1.0 / self.memory
        self.estimated = self.estimated * keep + estimated
        self.reported = self.reported * keep + reported
        self.answers += 1

    @property
    def ratio(self) -> float:
        if self.answers < self.min_requests or self.estimated <= 0:
            return 1.0
        return min(MAX_RATIO, max(MIN_RATIO, self.reported / self.estimated))
