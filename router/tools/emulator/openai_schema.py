"""Parse and validate OpenAI-style request bodies into one plain value.

Why hand-written checks instead of pydantic models: the emulator must accept
exactly what vLLM/SGLang accept (unknown fields ignored, several prompt
shapes) and reject bad input with their 400 error shape, while staying cheap
on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import JSONResponse

from router.tools.emulator.tokenizer import Tokenizer


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "code", "param"}}``."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.status}}

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status,
                            headers=dict(headers) if headers else None)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


@dataclass(frozen=True)
class Limits:
    """What a request may ask of this engine."""

    served_model: str
    max_model_len: int
    default_max_tokens: int
    vocab_size: int


@dataclass(frozen=True)
class BootstrapTarget:
    """SGLang PD rendezvous for one prompt of the batch."""

    host: str
    port: int
    room: int


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    kind: Literal["completion", "chat"]
    prompts: list[list[int]]
    max_tokens: int
    min_tokens: int
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None
    bootstrap: list[BootstrapTarget] | None


def _opt_int(body: Mapping[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key} must be an integer", key)
    if value < minimum:
        raise bad_request(f"{key} must be at least {minimum}, got {value}", key)
    return value


def _check_model(body: Mapping[str, Any], limits: Limits) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str) or model != limits.served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


def _token_list(value: Sequence[Any], limits: Limits) -> list[int]:
    ids: list[int] = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < limits.vocab_size:
            raise bad_request(f"token ids must be integers in [0, {limits.vocab_size})",
                              "prompt")
        ids.append(t)
    return ids


def completion_prompts(body: Mapping[str, Any], tokenizer: Tokenizer,
                       limits: Limits) -> list[list[int]]:
    """Accept a string, list of strings, token ids, or list of token id lists."""
    prompt = body.get("prompt")
    if prompt == "" or (isinstance(prompt, list) and "" in prompt):
        raise bad_request("prompt must not be empty", "prompt")
    if isinstance(prompt, str):
        prompts = [tokenizer.encode(prompt)]
    elif isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            prompts = [tokenizer.encode(p) for p in prompt]
        elif all(isinstance(p, list) for p in prompt):
            prompts = [_token_list(p, limits) for p in prompt]
        else:
            prompts = [_token_list(prompt, limits)]
    else:
        raise bad_request("prompt must be a non-empty string, list of strings, "
                          "list of token ids or list of token id lists", "prompt")
    if any(not p for p in prompts):
        raise bad_request("prompt must not be empty", "prompt")
    return prompts


def chat_prompt(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages \
            or not all(isinstance(m, Mapping) for m in messages):
        raise bad_request("messages must be a non-empty list of objects", "messages")
    try:
        return tokenizer.encode_chat(messages)
    except ValueError as exc:
        raise bad_request(str(exc), "messages") from None


def _bootstrap(body: Mapping[str, Any], n: int) -> list[BootstrapTarget] | None:
    room = body.get("bootstrap_room")
    if room is None:
        return None
    host = body.get("bootstrap_host")
    port = body.get("bootstrap_port")
    rooms = room if isinstance(room, list) else [room]
    hosts = host if isinstance(host, list) else [host] * len(rooms)
    ports = port if isinstance(port, list) else [port] * len(rooms)
    if not (len(rooms) == len(hosts) == len(ports) == n):
        raise bad_request(f"bootstrap fields must give one room per prompt ({n})",
                          "bootstrap_room")
    targets: list[BootstrapTarget] = []
    for h, p, r in zip(hosts, ports, rooms):
        if not isinstance(h, str) or not h:
            raise bad_request("bootstrap_host must be a host name", "bootstrap_host")
        if isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536:
            raise bad_request("bootstrap_port must be a port number", "bootstrap_port")
        if isinstance(r, bool) or not isinstance(r, int):
            raise bad_request("bootstrap_room must be an integer", "bootstrap_room")
        targets.append(BootstrapTarget(h, p, r))
    return targets


def parse_generation(body: object, kind: Literal["completion", "chat"],
                     tokenizer: Tokenizer, limits: Limits) -> GenerationRequest:
    """Validate a request body; raises ApiError (400/404) on bad input."""
    if not isinstance(body, Mapping):
        raise bad_request("request body must be a JSON object")
    _check_model(body, limits)
    if kind == "chat":
        prompts = [chat_prompt(body, tokenizer)]
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        prompts = completion_prompts(body, tokenizer, limits)
        max_tokens = _opt_int(body, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = limits.default_max_tokens
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({min_tokens}) must not exceed max_tokens "
                          f"({max_tokens})", "min_tokens")
    n = _opt_int(body, "n", 1)
    if n is not None and n != 1:
        raise bad_request("the emulator only supports n=1", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options can only be set when stream is true",
                              "stream_options")
        if not isinstance(options, Mapping):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = bool(options.get("include_usage", False))
    # vLLM 0.32's rules: max_tokens above max_model_len and a prompt that leaves no room
    # for one output token are refused; a sum over the limit is clamped, not refused.
    if max_tokens > limits.max_model_len:
        raise bad_request(f"max_tokens={max_tokens} cannot be greater than "
                          f"max_model_len={limits.max_model_len}.", "max_tokens")
    for prompt in prompts:
        if len(prompt) >= limits.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {limits.max_model_len} tokens. "
                f"However, your prompt contains {len(prompt)} input tokens.", "input_tokens")
        max_tokens = min(max_tokens, limits.max_model_len - len(prompt))
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, Mapping):
        raise bad_request("kv_transfer_params must be an object", "kv_transfer_params")
    return GenerationRequest(
        kind=kind, prompts=prompts, max_tokens=max_tokens, min_tokens=min_tokens,
        stream=stream, include_usage=include_usage,
        kv_transfer_params=dict(params) if params is not None else None,
        bootstrap=_bootstrap(body, len(prompts)),
    )
