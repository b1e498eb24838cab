"""Issue 10, finding 11: a stream broken after its first tokens continues on another instance;
the client's text equals an unbroken run of the emulator, with one [DONE] and usage summed."""

from __future__ import annotations

import json

import httpx

from faults.conftest import router  # type: ignore[import-not-found]
from router.request.continuation import Continuation
from router.tools.emulator import FaultConfig


def stream(url: str, body: dict) -> tuple[str, int, dict | None, bool]:
    """(concatenated text, [DONE] count, last usage, error event seen) of one streamed request."""
    r = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=30)
    assert r.status_code == 200, r.text
    text, done, usage, error = [], 0, None, False
    for line in r.text.splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done += 1
            continue
        event = json.loads(line[6:])
        error = error or "error" in event
        usage = event.get("usage") or usage
        text += [c.get("text") or "" for c in event.get("choices") or ()]
    return "".join(text), done, usage, error


def test_the_emulator_continues_a_prompt_that_ends_in_its_own_output(emulators):
    emu = emulators()
    body = {"model": "m", "prompt": "Tell me about caches.", "max_tokens": 20}
    whole = httpx.post(f"{emu.url}/v1/completions", json=body).json()["choices"][0]["text"]
    first = httpx.post(f"{emu.url}/v1/completions", json={**body, "max_tokens": 8}).json()["choices"][0]["text"]
    rest = httpx.post(f"{emu.url}/v1/completions", json={**body, "prompt": body["prompt"] + first, "max_tokens": 12}).json()
    assert whole == first + rest["choices"][0]["text"] and len(whole.split()) == 20


def test_a_stream_broken_mid_way_continues_elsewhere_unbroken(emulators):
    reference = emulators()
    a, b = emulators(faults=FaultConfig(die_after_tokens=7)), emulators(faults=FaultConfig(die_after_tokens=11))
    instances = [{"url": e.url, "name": n} for e, n in ((a, "a"), (b, "b"), (reference, "c"))]
    with router(instances, policy={"name": "round_robin", "seed": 1}) as (url, app):
        for i in range(4):
            body = {"model": "m", "prompt": f"Question {i}: where did the tokens go?", "max_tokens": 30,
                    "stream_options": {"include_usage": True}}
            expected, done, usage, error = stream(reference.url, body)
            got, done, got_usage, error = stream(url, body)
            assert not error and done == 1
            assert got == expected and len(got.split()) == 30
            assert got_usage["completion_tokens"] == 30 and got_usage["prompt_tokens"] == usage["prompt_tokens"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_continuations_total{result="ok"}' in metrics


def test_what_cannot_be_continued_ends_with_an_error_event(emulators):
    dying = emulators(faults=FaultConfig(die_after_tokens=3))
    with router([{"url": dying.url, "name": "d"}], proxy={"continuation_attempts": 0}) as (url, _):
        _, done, _, error = stream(url, {"model": "m", "prompt": "hello there.", "max_tokens": 10})
        assert error and done == 0


def test_a_whole_answer_whose_engine_breaks_before_its_end_ends_as_the_engine_would(emulators):
    """The engine drops the connection right after its last token (the budget is spent; its
    final event and [DONE] never came): nothing is left to continue, so the client's stream
    ends with a final event (finish_reason "length") and its [DONE], not the error event."""
    reference, dying = emulators(), emulators(faults=FaultConfig(die_after_tokens=10))
    with router([{"url": dying.url, "name": "d"}]) as (url, _):
        for endpoint, body in (("completions", {"model": "m", "prompt": "hello there.", "max_tokens": 10}),
                               ("chat/completions", {"model": "m", "max_completion_tokens": 10,
                                                     "messages": [{"role": "user", "content": "hello there."}]})):
            ref = httpx.post(f"{reference.url}/v1/{endpoint}", json={**body, "stream": True}, timeout=30).text
            got = httpx.post(f"{url}/v1/{endpoint}", json={**body, "stream": True}, timeout=30).text
            events = [json.loads(line[6:]) for line in got.splitlines() if line.startswith("data: {")]
            expected = [json.loads(line[6:]) for line in ref.splitlines() if line.startswith("data: {")]
            assert got.splitlines().count("data: [DONE]") == 1 and not any("error" in e for e in events), got
            assert [e["choices"][0].get("finish_reason") for e in events] == \
                [e["choices"][0].get("finish_reason") for e in expected]
            assert events[-1]["id"] == events[0]["id"] and events[-1]["object"] == expected[-1]["object"]


def test_a_stream_ends_with_its_done_or_nothing_once_its_answer_is_whole():
    async def send(body):
        return None

    c = Continuation({"model": "m", "prompt": "hi", "max_tokens": 2}, "completions", 1, send, lambda result: None)
    assert c.ending() is None  # nothing yet: the error event
    c.feed(b'data: {"choices": [{"index": 0, "text": " a", "finish_reason": null}]}\n\n')
    assert c.ending() is None
    c.feed(b'data: {"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]}\n\n')
    assert c.ending() == b"data: [DONE]\n\n"
    c.feed(b"data: [DONE]\n\n")
    assert c.ending() == b""


def test_chat_continues_the_final_assistant_message():
    async def send(body):
        return None

    c = Continuation({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10},
                     "chat", 1, send, lambda result: None)
    c.feed(b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
           b'data: {"choices": [{"index": 0, "delta": {"content": " the"}}]}\n\ndata: {"choices": [{"index": 0, "delta": {"con')
    assert c.body() == {"model": "m", "max_completion_tokens": 9, "continue_final_message": True, "add_generation_prompt": False,
                        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " the"}]}


def test_a_decode_instance_dying_mid_stream_continues_on_another(emulators):
    """PD (vLLM handoff): the stream of a decode instance that dies after 6 tokens goes on
    elsewhere; the client's text equals an unbroken run on a mixed engine."""
    reference = emulators()
    base = {"flavor": "vllm", "bootstrap_port": 0}
    p0 = emulators(role="prefill", engine_id="p0", **base)
    d0 = emulators(role="decode", engine_id="d0", faults=FaultConfig(die_after_tokens=6), **base)
    d1 = emulators(role="decode", engine_id="d1", **base)
    instances = [{"url": e.url, "name": n, "role": r, "flavor": "vllm", "model": "m"}
                 for e, n, r in ((p0, "p0", "prefill"), (d0, "d0", "decode"), (d1, "d1", "decode"))]
    prefix = "You are the dispatcher of a parcel service; answer briefly and precisely. " * 30
    with router(instances, pd={"selective_threshold_tokens": 0}) as (url, app):
        continued = 0
        for i in range(8):
            body = {"model": "m", "prompt": f"{prefix} Parcel {i}: where is it now?", "max_tokens": 24}
            expected, _, _, _ = stream(reference.url, body)
            got, done, _, error = stream(url, body)
            assert not error and done == 1 and got == expected
            metrics = httpx.get(f"{url}/metrics").text
            continued = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                            if line.startswith('pd_router_continuations_total{result="ok"}'))
            if continued:
                break
        assert continued >= 1
        assert httpx.get(f"{p0.url}/emulator/stats").json()["pd"]["kv_pulls_served"] >= 1  # it was a PD route
