import json

import pytest

from router.core.errors import RouterError
from router.request.hashing import root_seed, text_block_keys
from router.request.prompt import parse_body


def parse(body, endpoint="chat"):
    return parse_body(json.dumps(body).encode(), endpoint, 4.0)


def keys(text):
    return text_block_keys(text, 32, root_seed("m"), 100)


def chat(*messages, **extra):
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_chat_role_change_changes_keys():
    a = parse(chat(("system", "s" * 100), ("user", "u" * 100)))
    b = parse(chat(("user", "s" * 100), ("user", "u" * 100)))
    assert keys(a.text)[0] != keys(b.text)[0]


def test_role_boundary_cannot_collide():
    a = parse(chat(("user", "ab"), ("user", "c")))
    b = parse(chat(("user", "a"), ("user", "bc")))
    assert a.text != b.text


def test_content_parts_equal_plain_string_and_tools_count():
    plain = parse(chat(("user", "hello world")))
    parts = parse({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]})
    assert plain.text == parts.text
    with_tools = parse(chat(("user", "hello world"), tools=[{"type": "function", "function": {"name": "f"}}]))
    assert with_tools.text != plain.text


def test_shared_system_prompt_shares_leading_keys():
    system = "You are a careful assistant. " * 10
    a = parse(chat(("system", system), ("user", "question one")))
    b = parse(chat(("system", system), ("user", "another question entirely")))
    ka, kb = keys(a.text), keys(b.text)
    assert len(ka) >= 5 and ka[:5] == kb[:5]


@pytest.mark.parametrize(
    "prompt, tokens, count",
    [("abcd" * 10, None, 10), (["abcd" * 2, "abcd"], None, 3), ([1, 2, 3], [1, 2, 3], 3), ([[1, 2], [3]], [1, 2], 3)],
)
def test_completion_prompt_shapes(prompt, tokens, count):
    p = parse({"model": "m", "prompt": prompt, "max_tokens": 5}, "completions")
    assert p.tokens == tokens and p.prompt_tokens == count and p.max_tokens == 5


@pytest.mark.parametrize(
    "raw, endpoint, param",
    [
        (b"{not json", "completions", None),
        (b"[1, 2]", "completions", None),
        (json.dumps({"prompt": "x"}).encode(), "completions", "model"),
        (json.dumps({"model": 3, "prompt": "x"}).encode(), "completions", "model"),
        (json.dumps({"model": "m"}).encode(), "completions", "prompt"),
        (json.dumps({"model": "m", "prompt": 5}).encode(), "completions", "prompt"),
        (json.dumps({"model": "m", "prompt": [1, -1]}).encode(), "completions", "prompt"),
        (json.dumps({"model": "m", "prompt": "x", "max_tokens": -1}).encode(), "completions", "max_tokens"),
        (json.dumps({"model": "m", "prompt": "x", "max_tokens": "9"}).encode(), "completions", "max_tokens"),
        (json.dumps({"model": "m", "prompt": "x", "stream": "yes"}).encode(), "completions", "stream"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), "chat", "messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), "chat", "messages"),
        (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), "chat", "messages"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": 7}]}).encode(), "chat", "messages[0]"),
    ],
)
def test_bad_input_is_400_with_openai_body(raw, endpoint, param):
    with pytest.raises(RouterError) as info:
        parse_body(raw, endpoint, 4.0)
    err = info.value
    assert err.status == 400
    body = err.body()["error"]
    assert body["message"] and body["type"] == "invalid_request_error" and body["code"]
    assert body["param"] == param
