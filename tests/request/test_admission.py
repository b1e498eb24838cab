"""Admission: 404 for a model nobody serves, 400 for a prompt nobody can hold; only when certain."""

from __future__ import annotations

import json

import pytest

from router.config.model import load_config
from router.core.errors import RouterError
from router.core.instances import InstancePool
from router.engines.book import EngineBook
from router.engines.facts import EngineFacts
from router.request.admission import Admission, prompt_tokens_at_least
from router.request.prompt import parse_body


def pool(*instances: dict) -> InstancePool:
    return InstancePool(load_config(overrides={"instances": list(instances)}))


def admission(facts: dict[str, EngineFacts], *instances: dict) -> Admission:
    book = EngineBook(stale_after_s=1.0)
    for instance, known in facts.items():
        book.set_facts(instance, known)
    return Admission(pool(*instances), book, bytes_per_token_max=32)


def completion(model: str = "m", prompt: object = "hello", **kw: object):
    return parse_body(json.dumps({"model": model, "prompt": prompt, **kw}).encode(), "completions", 4.0)


def chat(text: str, **kw: object):
    body = {"model": "m", "messages": [{"role": "system", "content": text[: len(text) // 2]},
                                       {"role": "user", "content": [{"type": "text", "text": text[len(text) // 2:]}]}], **kw}
    return parse_body(json.dumps(body).encode(), "chat", 4.0)


A, B = {"url": "http://a:1", "name": "a"}, {"url": "http://b:1", "name": "b"}
SERVES_M = EngineFacts(models={"m": 1000})


def refused(adm: Admission, parsed) -> RouterError:
    with pytest.raises(RouterError) as info:
        adm.check(parsed)
    return info.value


def test_unknown_model_is_404_when_every_instance_is_known() -> None:
    adm = admission({"a": SERVES_M, "b": EngineFacts(models={"n": None})}, A, B)
    error = refused(adm, completion(model="nope"))
    assert error.status == 404
    assert error.body()["error"] == {"message": "The model `nope` does not exist.", "type": "invalid_request_error",
                                     "param": "model", "code": "model_not_found"}
    adm.check(completion(model="m"))
    adm.check(completion(model="n"))


def test_an_instance_of_unknown_facts_may_serve_anything() -> None:
    adm = admission({"a": SERVES_M}, A, B)  # b never answered /v1/models
    adm.check(completion(model="nope"))
    everyone = list(adm._pool)
    assert [i.id for i in adm.usable(everyone, "nope")] == ["b"] and adm.usable(everyone, "m") is everyone


def test_config_model_is_the_override() -> None:
    adm = admission({"a": SERVES_M}, {**A, "model": "pinned"})
    adm.check(completion(model="pinned"))  # config says it serves it: the engine will judge
    assert refused(adm, completion(model="m")).status == 404


def test_empty_pool_is_not_a_fact_about_models() -> None:
    admission({}).check(completion(model="anything"))


def test_token_prompt_at_or_over_max_model_len_is_400() -> None:
    adm = admission({"a": SERVES_M}, A)
    adm.check(completion(prompt=[5] * 999))
    error = refused(adm, completion(prompt=[5] * 1000))
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "prompt")
    assert refused(adm, completion(prompt=[[5] * 3, [5] * 1200])).status == 400  # the longest of a batch


def test_max_tokens_over_max_model_len_is_400_but_the_sum_is_the_engines_business() -> None:
    adm = admission({"a": SERVES_M}, A)
    error = refused(adm, completion(max_tokens=1001))
    assert (error.status, error.param) == (400, "max_tokens")
    adm.check(completion(prompt=[5] * 900, max_tokens=900))  # vLLM clamps this, it does not refuse


def test_text_is_refused_only_when_too_long_at_the_most_bytes_per_token() -> None:
    adm = admission({"a": SERVES_M}, A)
    adm.check(completion(prompt="x" * 999 * 32))  # could be 999 tokens of 32 bytes: let the engine judge
    assert refused(adm, completion(prompt="x" * (999 * 32 + 1))).status == 400  # 1000 tokens at least
    adm.check(chat("y" * 31_000))
    assert refused(adm, chat("y" * 40_000)).param == "messages"


def test_the_largest_limit_among_serving_instances_applies() -> None:
    adm = admission({"a": SERVES_M, "b": EngineFacts(models={"m": 4000})}, A, B)
    adm.check(completion(prompt=[5] * 3000))
    assert refused(adm, completion(prompt=[5] * 4000)).status == 400
    adm = admission({"a": SERVES_M, "b": EngineFacts(models={"m": None})}, A, B)
    adm.check(completion(prompt=[5] * 3000))  # b's limit is unknown


def test_lower_bound() -> None:
    assert prompt_tokens_at_least(completion(prompt=["ab" * 32, "a"]), 32) == 2
    assert prompt_tokens_at_least(completion(prompt=[1, 2, 3]), 32) == 3
    assert prompt_tokens_at_least(chat("é" * 64), 32) == 2


def test_answers_follow_changing_facts_and_pool() -> None:
    book = EngineBook(stale_after_s=1.0)
    p = pool(A)
    adm = Admission(p, book, bytes_per_token_max=32)
    adm.check(completion(model="late"))  # nothing known yet
    book.set_facts("a", SERVES_M)
    assert refused(adm, completion(model="late")).status == 404
    book.set_facts("a", EngineFacts(models={"m": 1000, "late": 50}))  # the engine loaded an adapter
    adm.check(completion(model="late"))
    assert refused(adm, completion(model="late", prompt=[1] * 50)).status == 400
    p.apply_facts("a", p.get("a").config.model_copy(update={"model": "pinned"}))  # config now pins another model
    assert refused(adm, completion(model="late")).status == 404


def test_the_memo_stays_bounded() -> None:
    adm = admission({"a": SERVES_M}, A)
    for i in range(1000):
        with pytest.raises(RouterError):
            adm.check(completion(model=f"random-{i}"))
    assert len(adm._memo) <= Admission._MEMO_MAX
