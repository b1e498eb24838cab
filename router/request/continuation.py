"""Mid-stream continuation: when an engine dies after tokens were streamed, go on elsewhere.

Why: a stream cut after its first token used to end with an error event; the client had to
start over (and pay the prefill and the tokens again). Here the relay keeps track of what was
sent, and on a break the request is sent again, to another instance, as "the prompt plus
what was generated so far": completions get the text appended to the prompt; chat gets a
final assistant message with it, continued (vLLM's ``continue_final_message: true``,
``add_generation_prompt: false``). The token budget shrinks by what was produced; the client
sees one unbroken stream: no token twice or lost, one ``[DONE]``, usage summed.

What cannot be continued (several choices, batches, token-id prompts, logprobs, a spent
budget) ends with the explicit error event as before; every attempt is counted.

Session migration with a shared KV store (kv_store): the continuation is routed with keys over
the prompt plus the text so far, the failed instances excluded, and those keys are believed
stored (the prefill wrote the prompt, the decode its generated blocks as it went), so the cost
model prices loading them against computing them (router/scheduling/store_cost.py): another
decode instance takes the session alone and loads its KV instead of prefilling it again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from router.request.prompt import Endpoint
from router.upstream.relay import Resumed

_DONE = b"[DONE]"
_decode = msgspec.json.Decoder().decode


@dataclass
class Progress:
    """What reached the client of one stream so far."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0  # one event per token, as vLLM and SGLang stream without speculative decoding
    done: bool = False  # [DONE] or a finish_reason went out: nothing left to continue
    terminated: bool = False  # [DONE] went out
    last: dict[str, Any] | None = None  # the last event that went out (for an ending made here)
    role_sent: bool = False
    usage_tokens: int = 0  # completion tokens produced by earlier (broken) attempts


def continuable(body: dict[str, Any], endpoint: Endpoint) -> bool:
    """Only one sequence whose text can be extended: one choice, one text prompt, no logprobs."""
    if (body.get("n") or 1) != 1 or body.get("logprobs") or body.get("echo") or body.get("best_of"):
        return False
    if endpoint == "completions":
        return isinstance(body.get("prompt"), str)
    return isinstance(body.get("messages"), list) and not body.get("tools")


class Continuation:
    """One stream's tracker (:meth:`feed`, called by the relay on each upstream chunk) and its
    continuer (:meth:`resume`, called by the relay when the upstream broke)."""

    def __init__(self, body: dict[str, Any], endpoint: Endpoint, max_attempts: int,
                 send: Callable[[dict[str, Any]], Awaitable[Resumed | None]],
                 count: Callable[[str], None]) -> None:
        self._body, self._endpoint = body, endpoint
        self._left = max_attempts
        self._send, self._count = send, count
        self.progress = Progress()
        self._pending = b""  # an incomplete event, held back until its end arrives
        self._continued = False

    # -- tracking (hot path of a stream) -------------------------------------------------
    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send for ``chunk``: whole events only, the continuation's rewritten."""
        data = self._pending + chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._pending = data
            return b""
        self._pending = data[cut + 2:]
        out = []
        for event in data[:cut].split(b"\n\n"):
            rewritten = self._event(event)
            if rewritten is not None:
                out.append(rewritten + b"\n\n")
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is held back once the stream ended."""
        rest, self._pending = self._pending, b""
        return rest

    def _event(self, event: bytes) -> bytes | None:
        if not event.startswith(b"data: "):
            return event
        payload = event[6:].strip()
        if payload == _DONE:
            self.progress.done = self.progress.terminated = True
            return event
        try:  # msgspec: ~6x faster than json.loads per event; json for what it refuses (NaN, lone surrogates)
            doc = _decode(payload)
        except ValueError:
            try:
                doc = json.loads(payload)
            except ValueError:
                return event
        if not isinstance(doc, dict):
            return event
        p = self.progress
        p.last = doc
        changed = False
        for choice in doc.get("choices") or ():
            text = choice.get("text")
            delta = choice.get("delta") or {}
            if text is None:
                text = delta.get("content")
            if self._continued and "role" in delta and not delta.get("content"):
                return None  # the continuation's own opening: the client had one already
            if "role" in delta:
                p.role_sent = True
            if text:
                p.text.append(text)
                p.tokens += 1
            if choice.get("finish_reason"):
                p.done = True
        usage = doc.get("usage")
        if self._continued and isinstance(usage, dict) and p.usage_tokens:
            prompt = int(usage.get("prompt_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
            usage["prompt_tokens"] = max(0, prompt - p.usage_tokens)  # the client's prompt, not prompt + generated
            usage["completion_tokens"] = completion + p.usage_tokens
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            changed = True
        return b"data: " + json.dumps(doc).encode() if changed else event

    def ending(self) -> bytes | None:
        """How the stream ends when it cannot go on: nothing more if its ``[DONE]`` went out;
        its ``[DONE]`` if the answer was whole (a finish_reason went out, the engine broke
        before the terminator), after the final event the engine would have sent when the
        token budget is spent (finish_reason "length"); None: with the error event."""
        p = self.progress
        if p.terminated:
            return b""
        if p.done:
            return b"data: [DONE]\n\n"
        if not self.spent() or p.last is None:
            return None
        last = p.last
        if self._endpoint == "completions":
            choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                                      "stop_reason": None}
        else:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
        final: dict[str, Any] = {k: last[k] for k in ("id", "object", "created", "model") if k in last}
        final["choices"] = [choice]
        return b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"

    def _limit_key(self) -> str:
        """The body's token budget field: ``max_completion_tokens`` when set, else ``max_tokens``."""
        return "max_completion_tokens" if self._body.get("max_completion_tokens") is not None else "max_tokens"

    def spent(self) -> bool:
        """Every token the request allowed went out."""
        limit = self._body.get(self._limit_key())
        return limit is not None and self.progress.tokens >= int(limit)

    # -- continuing ------------------------------------------------------------------------
    def body(self) -> dict[str, Any] | None:
        """The request that goes on from here, or None when it cannot."""
        p = self.progress
        body = dict(self._body)
        limit_key = self._limit_key()
        if body.get(limit_key) is not None:
            left = int(body[limit_key]) - p.tokens
            if left < 1:
                return None
            body[limit_key] = left
        generated = "".join(p.text)
        if self._endpoint == "completions":
            body["prompt"] = self._body["prompt"] + generated
        else:
            body["messages"] = [*self._body["messages"], {"role": "assistant", "content": generated}]
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        return body

    async def resume(self) -> Resumed | None:
        """A new upstream stream that continues this one, or None (then the relay ends with an error event)."""
        if self.progress.done:
            return None
        if self.spent():  # the answer is whole but for its end: ending() makes it
            self._count("whole")
            return None
        if self._left < 1:
            self._count("exhausted")
            return None
        body = self.body()
        if body is None:
            self._count("impossible")
            return None
        self._left -= 1
        self._pending = b""  # a half-received event never reached the client
        resumed = await self._send(body)
        if resumed is None:
            self._count("failed")
            return None
        self._count("ok")
        self.progress.usage_tokens = self.progress.tokens
        self._continued = True
        return resumed
