"""Requests no engine could serve are refused at once, as the engine itself would.

From facts the poller already holds (no I/O here): a model no instance serves gets 404
(``model_not_found``), a prompt that cannot fit any serving instance's ``max_model_len``
gets 400 (``context_length_exceeded``), before anything is booked or sent. Both only
when certain: an instance whose facts are unknown may serve anything, and a text
prompt's token count is bounded from below (characters / the most bytes one token can
cover), so a request that fits is never refused here; the engine stays the judge. In
token mode the request path checks again once the prompt is tokenized (the engine's own
``/tokenize`` or its tokenizer.json, chat template applied): the first prompt's count is
then exact, and a prompt the estimate let through is refused as the engine would.
Rules as vLLM 0.32 applies them: the prompt alone must be shorter than max_model_len,
and max_tokens may not exceed it (prompt + max_tokens over it is clamped, not refused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from router.core.errors import InvalidRequest, NotFound
from router.core.instances import Instance, InstancePool
from router.engines.book import EngineBook
from router.engines.facts import serves
from router.request.prompt import ParsedRequest


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def prompt_tokens_at_least(parsed: ParsedRequest, bytes_per_token_max: float) -> int:
    """A lower bound of the longest prompt's token count (exact for token-id prompts).

    Characters never exceed UTF-8 bytes, and a token covers at most ``bytes_per_token_max``
    bytes, so characters / that bound undercounts tokens; chat templates only add tokens."""
    body = parsed.body
    if parsed.endpoint == "chat":
        chars = sum(_text_chars(m.get("content")) for m in body.get("messages", ()) if isinstance(m, dict))
        return math.ceil(chars / bytes_per_token_max)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return math.ceil(len(prompt) / bytes_per_token_max)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)
        return max((len(p) if isinstance(p, list) else math.ceil(len(p) / bytes_per_token_max)) for p in prompt)
    return 0


@dataclass(frozen=True)
class ModelView:
    """What the pool and the engines say about one model name."""

    found: bool  # some instance serves it, or may (its facts are unknown)
    limit: int | None  # the largest max_model_len among them; None when any of them has none known
    excluded: frozenset[str]  # instances known not to serve it


class Admission:
    """Per-model answers are memoised until the facts (book generation) or the pool (its
    version) change, so a request costs a dict lookup, not a walk over every instance."""

    _MEMO_MAX = 256  # model names come from clients: the memo must stay bounded

    def __init__(self, pool: InstancePool, book: EngineBook, bytes_per_token_max: float) -> None:
        self._pool = pool
        self._book = book
        self._bytes_per_token_max = bytes_per_token_max
        self._memo: dict[str, ModelView] = {}
        self._memo_key: tuple[int, int] | None = None

    def _compute(self, model: str) -> ModelView:
        found, limits, unknown_limit, excluded, empty = False, [], False, set(), True
        for inst in self._pool:
            empty = False
            facts = self._book.facts(inst.id)
            known = serves(inst.config, facts, model)
            if known is False:
                excluded.add(inst.id)
                continue
            found = True
            limit = facts.models.get(model) if known and facts is not None and facts.models is not None else None
            if limit is None:
                unknown_limit = True
            else:
                limits.append(limit)
        if empty:  # nothing discovered yet: not a fact about the model
            return ModelView(True, None, frozenset())
        return ModelView(found, None if unknown_limit or not limits else max(limits), frozenset(excluded))

    def view(self, model: str) -> ModelView:
        key = (self._book.generation, self._pool.version)
        if key != self._memo_key:
            self._memo.clear()
            self._memo_key = key
        found = self._memo.get(model)
        if found is None:
            found = self._compute(model)
            if len(self._memo) >= self._MEMO_MAX:
                self._memo.clear()
            self._memo[model] = found
        return found

    def usable(self, instances: list[Instance], model: str) -> list[Instance]:
        """``instances`` without those known not to serve ``model``."""
        excluded = self.view(model).excluded
        return [i for i in instances if i.id not in excluded] if excluded else instances

    def check(self, parsed: ParsedRequest) -> None:
        """Raise the RouterError the engine would answer with, when that is certain."""
        view = self.view(parsed.model)
        if not view.found:
            raise NotFound(f"The model `{parsed.model}` does not exist.", code="model_not_found", param="model")
        limit = view.limit
        if limit is None:
            return
        if parsed.max_tokens is not None and parsed.max_tokens > limit:
            raise InvalidRequest(f"max_tokens={parsed.max_tokens} is greater than this model's maximum context "
                              f"length of {limit} tokens", code="context_length_exceeded", param="max_tokens")
        tokens = prompt_tokens_at_least(parsed, self._bytes_per_token_max)
        exact = parsed.tokens is not None and len(parsed.tokens) >= tokens
        if exact:
            assert parsed.tokens is not None
            tokens = len(parsed.tokens)
        if tokens >= limit:
            where = "messages" if parsed.endpoint == "chat" else "prompt"
            has = f"{tokens}" if exact else f"at least {tokens}"
            raise InvalidRequest(f"This model's maximum context length is {limit} tokens; the prompt has {has} "
                              "tokens, leaving no room for output", code="context_length_exceeded", param=where)
