"""``POST /debug/route`` explains presets, declared pipelines and two-profile PD alike."""

from contextlib import ExitStack, contextmanager

import httpx
import pytest

from router.config.model import load_config
from router.gateway.app import create_app
from servers import FakeBackend, serve_app

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
PROMPT = "A long shared system prompt about the warehouse inventory rules. " * 40


@contextmanager
def router(roles, policy):
    backends = [FakeBackend(f"{role[0]}{i}") for i, role in enumerate(roles)]
    with ExitStack() as stack:
        instances = [{"url": stack.enter_context(serve_app(b.app())), "name": b.name, "role": role, "model": "m"}
                     for b, role in zip(backends, roles)]
        config = load_config(overrides={"instances": instances, "policy": {"seed": 1, **policy},
                                        "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}})
        yield stack.enter_context(serve_app(create_app(config))), backends


def explain(url, prompt=PROMPT):
    r = httpx.post(f"{url}/debug/route", json={"model": "m", "prompt": prompt, "max_tokens": 16}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_declared_pipeline_shows_each_plugins_score_and_the_total():
    pipeline = {"scorers": [{"name": "prefix", "weight": 3}, {"name": "requests", "weight": 2}], "picker": "max_score"}
    with router(["mixed", "mixed"], {"pipeline": pipeline}) as (url, backends):
        assert httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 4}).status_code == 200
        served = next(b.name for b in backends if b.received)
        plan = explain(url)
    assert plan["policy"] == "custom"
    assert [s["name"] for s in plan["pipeline"]["scorers"]] == ["prefix", "requests"]
    assert plan["pipeline"]["routes"]["name"] == "instances"
    routes = {r["route"]: r for r in plan["routes"]}
    assert set(routes) == {"m0", "m1"}
    for r in routes.values():
        assert r["total"] == pytest.approx(3 * r["scores"]["prefix"] + 2 * r["scores"]["requests"]) and r["filtered_by"] is None
    assert routes[served]["scores"]["prefix"] == 1.0  # the first request left its prefix there
    assert plan["chosen"]["route"] == served and plan["acceptable"] == [served] and plan["chosen"]["reason"] == "score"


def test_the_ttft_preset_shows_its_cost_terms_and_estimate():
    with router(["mixed", "mixed", "mixed"], {"name": "ttft"}) as (url, _):
        plan = explain(url)
    assert plan["pipeline"]["filters"][0]["name"] == "bounded_load"
    chosen = next(r for r in plan["routes"] if r["route"] == plan["chosen"]["route"])
    assert chosen["terms"]["ttft_s"] == pytest.approx(plan["chosen"]["estimate_s"])
    assert set(chosen["terms"]) >= {"queue_s", "prefill_s", "interference_s", "uncached_tokens"}
    assert sorted(plan["acceptable"]) == ["m0", "m1", "m2"]  # an idle cluster: three near-ties


def test_two_profile_pd_explains_each_profile_the_same_way():
    with router(["prefill", "prefill", "decode"], {"name": "llmd_weighted"}) as (url, _):
        plan = explain(url)
    assert plan["chosen"]["mode"] == "disaggregated" and plan["chosen"]["route"] == "d2<-" + plan["chosen"]["prefill"]
    assert set(plan["pipeline"]["profiles"]) == {"prefill", "decode"}
    prefill, decode = plan["profiles"]["prefill"], plan["profiles"]["decode"]
    assert {r["route"] for r in prefill["routes"]} == {"p0", "p1"}
    assert set(prefill["routes"][0]["scores"]) == {"prefix", "queue", "kv"}
    assert [r["route"] for r in decode["routes"]] == ["d2"] and decode["chosen"]["route"] == "d2"
    assert plan["chosen"]["reason"] == "independent:" + prefill["chosen"]["reason"]
