"""Requests no engine could serve are refused at once, as the engine itself would.

From facts the poller already holds (no I/O here): a model no instance serves gets 404
(``model_not_found``), a prompt that cannot fit any serving instance's ``max_model_len``
gets 400 (``context_length_exceeded``), before anything is booked or sent. Both only
when certain: an instance whose facts are unknown may serve anything, and a text
prompt's token count is bounded from below (characters / the most bytes one token can
cover), so a request that fits is never refused here; the engine stays the judge.
Rules as vLLM 0.32 applies them: the prompt alone must be shorter than max_model_len,
and max_tokens may not exceed it (prompt + max_tokens over it is clamped, not refused).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from router.core.errors import RouterError
from router.core.instances import Instance, InstancePool
from router.engines.facts import EngineFacts, serves
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


class Admission:
    def __init__(self, pool: InstancePool, facts: Callable[[str], EngineFacts | None], bytes_per_token_max: float) -> None:
        self._pool = pool
        self._facts = facts
        self._bytes_per_token_max = bytes_per_token_max

    def serves(self, inst: Instance, model: str) -> bool:
        """False only when it is known that ``inst`` does not serve ``model``."""
        return serves(inst.config, self._facts(inst.id), model) is not False

    def _limit(self, model: str) -> tuple[bool, int | None]:
        """(any instance may serve ``model``, the largest max_model_len among them or None
        when any of them has no known limit)."""
        found, limits, empty = False, [], True
        for inst in self._pool:
            empty = False
            facts = self._facts(inst.id)
            known = serves(inst.config, facts, model)
            if known is False:
                continue
            found = True
            limit = facts.models.get(model) if known and facts is not None and facts.models is not None else None
            if limit is None:
                return True, None
            limits.append(limit)
        if empty:  # nothing discovered yet: not a fact about the model
            return True, None
        return found, (max(limits) if limits else None)

    def check(self, parsed: ParsedRequest) -> None:
        """Raise the RouterError the engine would answer with, when that is certain."""
        found, limit = self._limit(parsed.model)
        if not found:
            raise RouterError(404, f"The model `{parsed.model}` does not exist.", code="model_not_found", param="model")
        if limit is None:
            return
        if parsed.max_tokens is not None and parsed.max_tokens > limit:
            raise RouterError(400, f"max_tokens={parsed.max_tokens} is greater than this model's maximum context "
                              f"length of {limit} tokens", code="context_length_exceeded", param="max_tokens")
        tokens = prompt_tokens_at_least(parsed, self._bytes_per_token_max)
        if tokens >= limit:
            where = "messages" if parsed.endpoint == "chat" else "prompt"
            raise RouterError(400, f"This model's maximum context length is {limit} tokens; the prompt has at least "
                              f"{tokens} tokens, leaving no room for output", code="context_length_exceeded", param=where)
