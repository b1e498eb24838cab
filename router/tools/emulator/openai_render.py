"""Render OpenAI completion / chat responses and SSE chunks.

Why string templates: a streaming token is the hottest path in the emulator
(hundreds of streams, one chunk per token), so each chunk is built from a
prefix and suffix prepared once per choice plus the token's pre-encoded JSON
text, instead of a ``json.dumps`` of a fresh dict per token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from router.tools.emulator.request import EngineRequest
from router.tools.emulator.sampler import OutputSampler

DONE = b"data: [DONE]\n\n"


def usage_dict(requests: Sequence[EngineRequest]) -> dict[str, object]:
    """OpenAI usage, with cached tokens = local prefix hits + PD-transferred."""
    prompt = sum(r.prompt_len for r in requests)
    completion = sum(r.num_output for r in requests)
    cached = sum(r.num_cached + r.num_transferred for r in requests)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sse(obj: object) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


class Renderer:
    """Formats one response (id, model, created are fixed per response)."""

    def __init__(self, kind: Literal["completion", "chat"], response_id: str,
                 created: int, model: str, sampler: OutputSampler) -> None:
        self.kind = kind
        self.response_id = response_id
        self.created = created
        self.model = model
        self.sampler = sampler
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        self._head = (f'data: {{"id":{json.dumps(response_id)},"object":"{obj}",'
                      f'"created":{created},"model":{json.dumps(model)},"choices":[')
        self._token_prefix: dict[int, str] = {}
        self._token_suffix = (',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
                              if kind == "completion" else
                              '},"logprobs":null,"finish_reason":null}]}\n\n')

    def _prefix(self, index: int) -> str:
        prefix = self._token_prefix.get(index)
        if prefix is None:
            body = '"text":' if self.kind == "completion" else '"delta":{"content":'
            prefix = f'{self._head}{{"index":{index},{body}'
            self._token_prefix[index] = prefix
        return prefix

    def token_chunks(self, index: int, tokens: Sequence[int]) -> bytes:
        """One SSE chunk per token, joined into a single write."""
        prefix = self._prefix(index)
        suffix = self._token_suffix
        json_text = self.sampler.json_text
        return "".join([prefix + json_text(t) + suffix for t in tokens]).encode()

    def role_chunk(self, index: int) -> bytes:
        """Chat streams open with an assistant-role delta."""
        return (f'{self._head}{{"index":{index},"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]}}\n\n').encode()

    def final_chunk(self, index: int, finish_reason: str,
                    extra: dict[str, object] | None = None) -> bytes:
        if self.kind == "completion":
            choice: dict[str, object] = {"index": index, "text": "", "logprobs": None,
                                         "finish_reason": finish_reason, "stop_reason": None}
        else:
            choice = {"index": index, "delta": {}, "logprobs": None,
                      "finish_reason": finish_reason}
        obj = self._envelope([choice])
        if extra:
            obj.update(extra)
        return _sse(obj).encode()

    def usage_chunk(self, usage: dict[str, object]) -> bytes:
        obj = self._envelope([])
        obj["usage"] = usage
        return _sse(obj).encode()

    def error_chunk(self, message: str, type_: str, code: int) -> bytes:
        return _sse({"error": {"message": message, "type": type_, "code": code}}).encode()

    def _envelope(self, choices: list[dict[str, object]]) -> dict[str, object]:
        obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
        return {"id": self.response_id, "object": obj, "created": self.created,
                "model": self.model, "choices": choices}

    def full_response(self, outputs: Sequence[Sequence[int]], requests: Sequence[EngineRequest],
                      extra: dict[str, object] | None = None) -> dict[str, object]:
        """Non-streaming body with every choice and usage."""
        choices: list[dict[str, object]] = []
        for index, (tokens, request) in enumerate(zip(outputs, requests)):
            text = self.sampler.detokenize(tokens)
            reason = request.finish_reason or "length"
            if self.kind == "completion":
                choices.append({"index": index, "text": text, "logprobs": None,
                                "finish_reason": reason, "stop_reason": None,
                                "prompt_logprobs": None})
            else:
                choices.append({"index": index,
                                "message": {"role": "assistant", "content": text,
                                            "tool_calls": []},
                                "logprobs": None, "finish_reason": reason,
                                "stop_reason": None})
        obj = "text_completion" if self.kind == "completion" else "chat.completion"
        body: dict[str, object] = {"id": self.response_id, "object": obj,
                                   "created": self.created, "model": self.model,
                                   "choices": choices, "usage": usage_dict(requests)}
        if extra:
            body.update(extra)
        return body
