"""Issue 10, findings 1, 6, 7 and part of 12: hostile input is refused before anything is
booked or forwarded, always with an OpenAI-shaped error body."""

import json

import httpx
import pytest

from gateway.test_app import TOKEN, cluster, completion, loads  # type: ignore[import-not-found]
from servers import FakeBackend


def assert_openai_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["type"] and "code" in error


@pytest.mark.parametrize("body", [
    completion(1, max_tokens=10**30),  # finding 1: it broke the shared load in Redis for good
    completion(1, max_tokens=2**31),
    completion(1, max_completion_tokens=10**30),
    completion(1, n=10**9),
])
def test_absurd_numbers_are_refused_before_booking(body):
    a = FakeBackend("a")
    with cluster(a) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=body)
        assert_openai_error(r, 400)
        assert loads(url) == {"a": 0} and a.received == []


def test_deep_nesting_and_lone_surrogates_are_400_with_a_json_body():
    a = FakeBackend("a")
    with cluster(a) as (url, _):
        deep = '{"model": "m", "prompt": "x", "extra": ' + "[" * 5000 + "]" * 5000 + "}"
        deep_tools = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [' + \
            '{"a":' * 900 + "1" + "}" * 900 + "]}"
        surrogate = '{"model": "\\ud800", "prompt": "hello"}'
        surrogate_prompt = '{"model": "m", "prompt": "hello \\udfff world"}'
        for path, body in [("/v1/completions", deep), ("/v1/chat/completions", deep_tools),
                           ("/v1/completions", surrogate)]:
            r = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"})
            assert_openai_error(r, 400)
        # a lone surrogate inside the prompt is the engine's business: hashed, forwarded as sent
        r = httpx.post(f"{url}/v1/completions", content=surrogate_prompt, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert loads(url) == {"a": 0}


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "abc"])
def test_ttft_slo_header_must_be_a_finite_positive_number(value):
    with cluster(FakeBackend("a")) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=completion(1), headers={"x-ttft-slo-ms": value})
        assert_openai_error(r, 400)


def test_client_pd_control_fields_never_reach_an_engine():
    a = FakeBackend("a")
    hostile = {"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.9.9.9", "remote_port": 1},
               "bootstrap_host": "10.9.9.9", "bootstrap_port": 1, "bootstrap_room": 7,
               "do_remote_decode": True, "do_remote_prefill": True}
    with cluster(a) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=completion(1, **hostile))
        assert r.status_code == 200, r.text
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                            **hostile})
        assert r.status_code == 200, r.text
    for got in a.received:
        assert not set(got["body"]) & set(hostile), got["body"]
    assert a.received[0]["body"]["prompt"] == completion(1)["prompt"]  # the rest is untouched


def test_hostile_bodies_leave_shared_redis_state_usable(redis_url, key_prefix):
    a = FakeBackend("a")
    with cluster(a, state={"backend": "redis", "redis_url": redis_url, "key_prefix": key_prefix}) as (url, app):
        assert httpx.post(f"{url}/v1/completions", json=completion(1, max_tokens=10**30)).status_code == 400
        for i in range(3):
            assert httpx.post(f"{url}/v1/completions", json=completion(i)).status_code == 200
        assert app.state.store.errors == 0
        r = httpx.get(f"{url}/debug/instances", headers={"authorization": f"Bearer {TOKEN}"})
        assert json.loads(r.text)["instances"][0]["load"]["requests"] == 0
