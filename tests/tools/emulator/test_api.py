"""OpenAI-compatible surface over real HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import StartFn
from .helpers import sse_events, sse_json

PROMPT = "Emulated engines let a router prove its cache hits without a GPU. " * 8


def test_completion_non_stream_usage_and_cached_tokens(start_emulator: StartFn,
                                                       client: httpx.Client) -> None:
    emu = start_emulator()
    first = client.post(f"{emu.url}/v1/completions",
                        json={"model": emu.config.served_model, "prompt": PROMPT,
                              "max_tokens": 7})
    assert first.status_code == 200
    body = first.json()
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 7
    usage = body["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    second = client.post(f"{emu.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 7})
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (usage["prompt_tokens"] - 1) // 16 * 16 > 0
    assert second.json()["choices"] == body["choices"]  # deterministic text


def test_prompt_shapes(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    url = f"{emu.url}/v1/completions"
    ids = client.post(f"{emu.url}/tokenize", json={"prompt": "hello there"}).json()["tokens"]
    by_text = client.post(url, json={"prompt": "hello there", "max_tokens": 3}).json()
    by_ids = client.post(url, json={"prompt": ids, "max_tokens": 3}).json()
    assert by_text["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert by_text["usage"]["prompt_tokens"] == len(ids)
    many = client.post(url, json={"prompt": ["a b c", "d e f"], "max_tokens": 2}).json()
    assert [c["index"] for c in many["choices"]] == [0, 1]
    assert many["usage"]["completion_tokens"] == 4
    lists = client.post(url, json={"prompt": [[1, 2, 3], [4, 5, 6, 7]], "max_tokens": 2})
    assert lists.json()["usage"]["prompt_tokens"] == 7


def test_stream_completion_with_usage(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    resp = client.post(f"{emu.url}/v1/completions",
                       json={"prompt": PROMPT, "max_tokens": 5, "stream": True,
                             "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = sse_json(resp.text)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len([t for t in texts if t]) == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    plain = client.post(f"{emu.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 5})
    assert "".join(texts) == plain.json()["choices"][0]["text"]


def test_stream_multiple_prompts(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    resp = client.post(f"{emu.url}/v1/completions",
                       json={"prompt": ["one two", "three four"], "max_tokens": 4,
                             "stream": True})
    chunks = sse_json(resp.text)
    per_index = {0: 0, 1: 0}
    for c in chunks:
        if c["choices"][0]["text"]:
            per_index[c["choices"][0]["index"]] += 1
    assert per_index == {0: 4, 1: 4}


def test_chat_stream_and_non_stream(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 4}
    plain = client.post(f"{emu.url}/v1/chat/completions", json=body).json()
    assert plain["object"] == "chat.completion"
    message = plain["choices"][0]["message"]
    assert message["role"] == "assistant" and len(message["content"].split()) == 4
    stream = client.post(f"{emu.url}/v1/chat/completions", json={**body, "stream": True})
    chunks = sse_json(stream.text)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[0]["object"] == "chat.completion.chunk"


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": [1, -2]}, 400, "prompt"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "model": "other-model"}, 404, "model"),
    ({"prompt": "x", "max_tokens": 10_000_000}, 400, "max_tokens"),
])
def test_validation_errors(start_emulator: StartFn, client: httpx.Client,
                           body: dict[str, object], status: int, param: str) -> None:
    emu = start_emulator()
    resp = client.post(f"{emu.url}/v1/completions", json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]


def test_bad_json_and_chat_errors(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    resp = client.post(f"{emu.url}/v1/completions", content=b"{not json",
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    resp = client.post(f"{emu.url}/v1/chat/completions",
                       json={"messages": [{"role": "wizard", "content": "x"}]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"


def test_models_health_tokenize(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator(model="my-model", max_model_len=4096)
    assert client.get(f"{emu.url}/health").status_code == 200
    models = client.get(f"{emu.url}/v1/models").json()
    assert models["data"][0]["id"] == "my-model"
    tok = client.post(f"{emu.url}/tokenize", json={"model": "my-model", "prompt": "a b c"})
    assert tok.json()["count"] == len(tok.json()["tokens"]) == 4
    assert tok.json()["max_model_len"] == 4096
    chat = client.post(f"{emu.url}/tokenize",
                       json={"model": "my-model",
                             "messages": [{"role": "user", "content": "a b c"}]}).json()
    assert chat["count"] > 4 and chat["tokens"][0] == 1
    usage = client.post(f"{emu.url}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "a b c"}],
                              "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == chat["count"]


def test_same_seed_same_text_on_two_engines(start_emulator: StartFn,
                                            client: httpx.Client) -> None:
    a, b = start_emulator(seed=3), start_emulator(seed=3)
    c = start_emulator(seed=4)
    body = {"prompt": PROMPT, "max_tokens": 12}
    texts = [client.post(f"{e.url}/v1/completions", json=body).json()["choices"][0]["text"]
             for e in (a, b, c)]
    assert texts[0] == texts[1] != texts[2]


def test_x_request_id_is_echoed(start_emulator: StartFn, client: httpx.Client) -> None:
    emu = start_emulator()
    resp = client.post(f"{emu.url}/v1/completions", json={"prompt": "x", "max_tokens": 1},
                       headers={"x-request-id": "abc123"})
    assert resp.headers["x-request-id"] == "abc123"
    assert json.loads(resp.text)["id"] == "cmpl-abc123"
    recent = client.get(f"{emu.url}/emulator/stats", params={"recent": 1}).json()["recent"]
    assert [r["client_request_id"] for r in recent] == ["abc123"]


def test_chat_stream_first_byte_waits_for_the_first_token(start_emulator: StartFn) -> None:
    """The assistant-role delta must not go out before prefill ends: a router measures TTFT,
    and releases booked prefill, at the first byte."""
    import time

    from router.tools.emulator.perf import get_profile, prefill_time

    emu = start_emulator(time_scale=1.0)
    body = {"messages": [{"role": "user", "content": "word " * 6000}], "max_tokens": 2, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{emu.url}/v1/chat/completions", json=body, timeout=30) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
        elapsed = time.perf_counter() - started
    assert '"role":"assistant"' in first
    assert elapsed >= 0.8 * prefill_time(get_profile("llama3-8b-h100"), 5000)
