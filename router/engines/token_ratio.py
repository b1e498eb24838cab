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

from dataclasses import dataclass, field

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

    def observe(self, estimated: int, reported: int, answers: int = 1) -> None:
        """``answers`` answers (one, or a window of them): the router estimated ``estimated`` prompt
        tokens, the engine counted ``reported``."""
        if estimated <= 0 or answers < 1 or not 0 < reported <= _MAX_TOKENS * answers:
            return
        keep = (1.0 - 1.0 / self.memory) ** answers
        self.estimated = self.estimated * keep + estimated
        self.reported = self.reported * keep + reported
        self.answers += answers

    @property
    def ratio(self) -> float:
        if self.answers < self.min_requests or self.estimated <= 0:
            return 1.0
        return min(MAX_RATIO, max(MIN_RATIO, self.reported / self.estimated))


@dataclass
class _Tally:
    """What the router saw end on one instance since its window began."""

    estimated: int = 0  # router-estimated prompt tokens of the answers that reported no usage
    reported: int = 0  # engine-reported prompt tokens of the answers that did
    unreported: int = 0  # answers without usage
    answers: int = 0  # every answer that ended well
    model: str | None = None
    spoiled: bool = False  # an answer of another model, or one that ended badly: the window cannot be split


@dataclass
class _Window:
    tokens: float  # the engine's answered-prompt counters at the window's start
    requests: float
    tally: _Tally = field(default_factory=_Tally)
    scrapes: int = 0  # since it started


@dataclass(frozen=True)
class WindowSample:
    """A window fit to learn from: ``estimated`` router tokens were ``reported`` engine tokens, over ``answers``."""

    model: str
    estimated: int
    reported: int
    answers: int


class PromptCountWindows:
    """The token ratio from answers that report no usage, through the engine's own counters.

    Why: a stream whose client did not ask for usage (``stream_options.include_usage``) ends
    with no ``usage.prompt_tokens``, so it teaches the per-answer ratio nothing; a front-end
    that only streams would never correct the 4-characters-a-token guess. Each engine counts
    the prompt tokens of the requests it finishes, at their end (vLLM's
    ``request_prompt_tokens`` histogram, SGLang's ``prompt_tokens_total`` with
    ``num_requests_total``). Between two scrapes, that count less what the answers that did
    report usage said is the engine's count of the others, which the router estimated.

    Only windows that are the router's alone count: the engine finished as many requests as
    the router saw end there (within one, or a tenth: a request ending across the scrape), all
    of one model, none of which ended badly (an aborted request may have been counted without
    an answer). Traffic that reaches the engine around this router, or through another replica,
    fails that test, so those windows are dropped, never mixed in. A window closes once it
    holds ``min_answers`` answers without usage; ``max_scrapes`` without closing starts it over.
    Bounded: one window per instance in the pool (``retain``).
    """

    def __init__(self, min_answers: int = 8, max_scrapes: int = 60) -> None:
        self._min = min_answers
        self._max_scrapes = max_scrapes
        self._windows: dict[str, _Window] = {}
        self.dropped = 0  # windows that were not the router's alone (for tests and /debug)

    def answered(self, instance: str, model: str, estimated: int, reported: int | None) -> None:
        """An answer ended well on ``instance`` (``reported``: its usage.prompt_tokens, None when it had none)."""
        window = self._windows.get(instance)
        if window is None:
            return  # no baseline yet: the next scrape starts one
        t = window.tally
        if t.model is None:
            t.model = model
        elif t.model != model:
            t.spoiled = True
        t.answers += 1
        if reported is None:
            t.estimated += estimated
            t.unreported += 1
        else:
            t.reported += reported

    def spoil(self, instance: str) -> None:
        """A request to ``instance`` ended badly: what the engine counted for it is unknown."""
        window = self._windows.get(instance)
        if window is not None:
            window.tally.spoiled = True

    def scraped(self, instance: str, tokens: float | None, requests: float | None) -> WindowSample | None:
        """The engine's answered-prompt counters at a scrape; a sample when a window closed fit to learn from."""
        if tokens is None or requests is None:
            self._windows.pop(instance, None)
            return None
        window = self._windows.get(instance)
        if window is None or tokens < window.tokens or requests < window.requests:  # first read, or a restart
            self._windows[instance] = _Window(tokens, requests)
            return None
        t = window.tally
        window.scrapes += 1
        finished = requests - window.requests
        if t.spoiled or finished > t.answers + max(1, t.answers // 10):  # not ours alone: drop, start over
            self.dropped += 1
            self._windows[instance] = _Window(tokens, requests)
            return None
        if t.unreported < self._min:
            if window.scrapes >= self._max_scrapes:
                self._windows[instance] = _Window(tokens, requests)
            return None
        self._windows[instance] = _Window(tokens, requests)
        if abs(finished - t.answers) > max(1, t.answers // 10) or t.model is None:
            self.dropped += 1
            return None
        theirs = tokens - window.tokens - t.reported  # the engine's count of the answers without usage
        if theirs <= 0 or t.estimated <= 0:
            return None
        return WindowSample(t.model, t.estimated, round(theirs), t.unreported)

    def __len__(self) -> int:
        return len(self._windows)

    def retain(self, instances: set[str]) -> None:
        """Forget instances that left the pool."""
        for gone in [i for i in self._windows if i not in instances]:
            del self._windows[gone]
