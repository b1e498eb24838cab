"""The shared-prefix (B2B tenant) workload: one seeded generator for every tool that needs it.

The shape follows llm-d's / inference-perf's "shared prefix" benchmark: ``groups`` tenants,
each with a long system prompt, and ``users`` fixed questions per tenant. A request is one
tenant's system prompt followed by one of that tenant's questions, so requests of a tenant
share a long prefix: the workload where a cache-blind router recomputes every tenant's
prefix on every instance and a cache-greedy one herds each tenant onto one instance.

One generator, several renderings: the replay wants prompts as content block ids
(:meth:`SharedPrefix.blocks`), the demo, the benchmarks and the Locust file want text
(:meth:`SharedPrefix.texts`), rendered as chat messages or a completion prompt. Open-loop
arrivals draw a random (tenant, question) per request (:meth:`SharedPrefix.picks`);
closed-loop clients each walk every pair in their own order (:meth:`SharedPrefix.rotation`).
Every output is a pure function of the fields, seed included, and the content, the picks and
each rotation come from independent streams (changing how many requests are drawn does not
change the prompts).

Text is one short common word per token: exactly one token each for the emulator's
tokenizer (letter runs of at most 6 letters) and about one for a real BPE vocabulary, after
a short label ("Tenant 3 system prompt.", "Question 3.1:") that keeps prompts distinct from
their first tokens on.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

Pair = tuple[int, int]  # (tenant, question of that tenant)

WORDS: tuple[str, ...] = tuple(
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so what up out no more time some can other into could then its only new two our way "
    "these may like first any work now such long make well people see over just most model "
    "cache token router batch memory queue river stone light garden window market paper music "
    "table forest engine number system blue green quiet rapid simple early final local human "
    "open clear small large policy tenant server bill quota node zone graph file disk store"
    .split()
)  # all letters, at most 6 of them: one emulator token per word


@dataclass(frozen=True)
class PromptTexts:
    """The text of every tenant's system prompt and every (tenant, question) question."""

    systems: tuple[str, ...]
    questions: tuple[tuple[str, ...], ...]

    def messages(self, pair: Pair, note: str = "") -> list[dict[str, str]]:
        """Chat messages: the tenant's system prompt, then ``note`` + the question."""
        group, user = pair
        return [{"role": "system", "content": self.systems[group]},
                {"role": "user", "content": note + self.questions[group][user]}]

    def prompt(self, pair: Pair) -> str:
        """One completion prompt: system prompt, question, answer cue."""
        group, user = pair
        return f"{self.systems[group]}\n\n{self.questions[group][user]}\nAnswer:"


@dataclass(frozen=True)
class PromptBlocks:
    """Every prompt segment as content block ids of ``block_tokens`` tokens (fresh per segment)."""

    block_tokens: int
    systems: tuple[tuple[int, ...], ...]
    questions: tuple[tuple[tuple[int, ...], ...], ...]

    def prompt(self, pair: Pair) -> tuple[int, ...]:
        group, user = pair
        return self.systems[group] + self.questions[group][user]


@dataclass(frozen=True)
class SharedPrefix:
    """``groups`` tenants x ``users`` questions, sizes in tokens, everything from ``seed``."""

    groups: int = 8
    users: int = 4
    system_tokens: int = 1024
    question_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("groups", "users", "system_tokens", "question_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"shared prefix: {name} must be >= 1, got {getattr(self, name)}")

    def _rng(self, *stream: object) -> random.Random:
        # A string seed is hashed deterministically (not with Python's per-process hash).
        return random.Random("/".join(map(str, ("shared-prefix", self.seed, *stream))))

    def pairs(self) -> list[Pair]:
        """Every (tenant, question) pair, tenant by tenant."""
        return list(itertools.product(range(self.groups), range(self.users)))

    def texts(self) -> PromptTexts:
        rng = self._rng("texts")

        def words(n: int) -> str:
            return " ".join(rng.choice(WORDS) for _ in range(n))

        systems = tuple(f"Tenant {g} system prompt. " + words(self.system_tokens) for g in range(self.groups))
        questions = tuple(tuple(f"Question {g}.{u}: " + words(self.question_tokens) for u in range(self.users))
                          for g in range(self.groups))
        return PromptTexts(systems, questions)

    def blocks(self, block_tokens: int) -> PromptBlocks:
        """Block ids, each segment rounded up to whole blocks: system prompts, then questions."""
        if block_tokens < 1:
            raise ValueError(f"shared prefix: block_tokens must be >= 1, got {block_tokens}")
        ids = itertools.count()

        def segment(tokens: int) -> tuple[int, ...]:
            return tuple(itertools.islice(ids, max(1, -(-tokens // block_tokens))))

        systems = tuple(segment(self.system_tokens) for _ in range(self.groups))
        questions = tuple(tuple(segment(self.question_tokens) for _ in range(self.users)) for _ in range(self.groups))
        return PromptBlocks(block_tokens, systems, questions)

    def picks(self) -> Iterator[Pair]:
        """An endless stream of uniformly random pairs, for requests that arrive independently."""
        rng = self._rng("picks")
        while True:
            yield rng.randrange(self.groups), rng.randrange(self.users)

    def rotation(self, client: int = 0) -> Iterator[Pair]:
        """Every pair once per round, in an order of its own for each ``client``, endlessly:
        a closed-loop client that asks every question of every tenant in turn."""
        order = self.pairs()
        self._rng("rotation", client).shuffle(order)
        return itertools.cycle(order)
