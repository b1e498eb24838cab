"""Validate an OpenAI request body and turn its prompt into one canonical sequence.

Completions (string, list of strings, token ids, list of token-id lists) and chat
(messages with roles, string or content-part content, tools) all become either a
canonical string or a token-id list. Role and field markers are control characters
that cannot appear unescaped in JSON-decoded user text boundaries, so two different
conversations never produce the same canonical string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from router.core.errors import InvalidRequest
from router.core.frozen import quick_init

Endpoint = Literal["completions", "chat"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_MSG = "\x1e"  # starts a message
_FIELD = "\x1f"  # separates a message header from its content
_PART = "\x1d"  # starts a non-text content part or a structured field

# Bounds checked before anything reaches shared state: booked load is summed in Redis (Lua
# numbers are doubles, exact to 2^53), so no single request may book an absurd amount.
MAX_TOKENS_LIMIT = 2**31 - 1  # no engine takes more (vLLM and SGLang hold it in an int32)
MAX_N = 128  # sequences per request; the engines' own defaults are far lower
# PD control fields: only the router sets them (router/upstream/handoff.py). From a client they
# would make an engine connect to an address of the client's choosing, or pin KV on it.
CONTROL_FIELDS = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room",
                  "do_remote_decode", "do_remote_prefill")
_CONTROL_SET = frozenset(CONTROL_FIELDS)
# Deepest JSON nesting accepted: tool schemas stay far below, while thousands of levels make
# an engine's (or a re-serialising proxy's) recursive parser fail.
MAX_DEPTH = 100


@quick_init
@dataclass(frozen=True)
class ParsedRequest:
    """What the router needs from a request body; the body itself is forwarded untouched."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    text: str | None  # canonical text, or None for token-id prompts
    tokens: list[int] | None  # token-id prompt (first of a batch)
    prompt_tokens: int  # estimated prompt tokens over the whole batch
    max_tokens: int | None
    stripped: bool = False  # client-supplied PD control fields were removed: forward ``body``, not the raw bytes


def parse_body(raw: bytes, endpoint: Endpoint, chars_per_token: float) -> ParsedRequest:
    try:  # msgspec: the one parse of the body, ~4x faster than json.loads (docs/benchmarks.md)
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        body = _stdlib_decode(raw, exc)  # msgspec refuses lone surrogates, which JSON (and engines) allow
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(body) > MAX_DEPTH:  # counting is C-fast; the walk is rare
        raise InvalidRequest(f"request body is nested deeper than {MAX_DEPTH} levels", code="invalid_json")
    try:
        return _parse(body, raw, endpoint, chars_per_token)
    except RecursionError:  # structured fields (tools, content parts) are re-serialised for hashing
        raise InvalidRequest("request body is nested too deeply", code="invalid_json") from None
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800") decodes but is no text
        raise InvalidRequest("request body holds an invalid Unicode escape (a lone surrogate)",
                             code="invalid_json") from None


def _parse(body: dict[str, Any], raw: bytes, endpoint: Endpoint, chars_per_token: float) -> ParsedRequest:
    # the body's few top-level names against the set: a scan of the raw bytes per marker cost ~1.6 us
    stripped = not _CONTROL_SET.isdisjoint(body) and _strip_control(body)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    model.encode("utf-8")  # UnicodeEncodeError for a lone surrogate: answered 400 above
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    max_tokens = _max_tokens(body)
    _check_positive_int(body, "n", MAX_N)

    if endpoint == "completions":
        text, tokens, n_tokens = _completion_prompt(body.get("prompt"), chars_per_token)
    else:
        text = _chat_text(body.get("messages"), body.get("tools"))
        tokens, n_tokens = None, _estimate(text, chars_per_token)
    return ParsedRequest(endpoint, body, model, stream, text, tokens, n_tokens, max_tokens, stripped)


def _stdlib_decode(raw: bytes, first: Exception) -> Any:
    """The rare body msgspec refuses: valid JSON for the standard library only when it holds
    an escaped lone surrogate (a prompt's business, hashed and forwarded as sent)."""
    if b"\\u" not in raw:
        raise InvalidRequest(f"request body is not valid JSON: {first}", code="invalid_json") from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None


def _depth(value: Any) -> int:
    """Deepest nesting of lists and objects in ``value``, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _strip_control(body: dict[str, Any]) -> bool:
    """Drop the PD control fields a client sent; True when there were any."""
    found = [name for name in CONTROL_FIELDS if name in body]
    for name in found:
        del body[name]
    return bool(found)


def _estimate(text: str, chars_per_token: float) -> int:
    return max(1, round(len(text) / chars_per_token))


def _check_positive_int(body: dict[str, Any], name: str, limit: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise InvalidRequest(f"'{name}' must be an integer from 1 to {limit}", param=name)
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    a = _check_positive_int(body, "max_tokens", MAX_TOKENS_LIMIT)
    b = _check_positive_int(body, "max_completion_tokens", MAX_TOKENS_LIMIT)
    return b if b is not None else a


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in value
    )


def _completion_prompt(prompt: Any, chars_per_token: float) -> tuple[str | None, list[int] | None, int]:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("'prompt' must not be empty", param="prompt")
        return prompt, None, _estimate(prompt, chars_per_token)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if not all(prompt):
                raise InvalidRequest("'prompt' must not contain empty strings", param="prompt")
            return prompt[0], None, sum(_estimate(p, chars_per_token) for p in prompt)
        if _is_token_list(prompt):
            return None, list(prompt), len(prompt)
        if all(_is_token_list(p) and p for p in prompt):
            return None, list(prompt[0]), sum(len(p) for p in prompt)
    raise InvalidRequest(
        "'prompt' is required: a non-empty string, list of strings, list of token ids "
        "(0 <= id < 2^32) or list of token-id lists",
        param="prompt",
    )


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}.content' must be a string, a list of content parts or null", param=where)
    out: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"'{where}.content[{j}]' must be an object with a 'type'", param=where)
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"'{where}.content[{j}].text' must be a string", param=where)
            out.append(part["text"])
        else:
            payload = {k: v for k, v in part.items() if k != "type"}
            out.append(f"{_PART}{part['type']}{_FIELD}{json.dumps(payload, sort_keys=True)}")
    return "".join(out)


def _chat_text(messages: Any, tools: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required and must be a non-empty list", param="messages")
    parts: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidRequest("'tools' must be a list", param="tools")
        parts.append(f"{_PART}tools{_FIELD}{json.dumps(tools, sort_keys=True, separators=(',', ':'))}")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequest(f"'{where}' must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # a dict or list is unhashable: TypeError, not 400
            raise InvalidRequest(f"'{where}.role' must be one of {sorted(_ROLES)}", param="messages")
        header = role
        if isinstance(msg.get("name"), str):
            header += f"{_PART}name={msg['name']}"
        text = _content_text(msg.get("content"), where)
        for field in ("tool_calls", "tool_call_id", "function_call"):
            if msg.get(field) is not None:
                text += f"{_PART}{field}{_FIELD}{json.dumps(msg[field], sort_keys=True)}"
        parts.append(f"{_MSG}{header}{_FIELD}{text}")
    return "".join(parts)
