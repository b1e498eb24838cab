"""Live configuration and membership over real sockets: the admin API, the config file
watched as a ConfigMap is updated, starting with no instance at all."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack, contextmanager

import httpx
import yaml

from router.config.model import load_config
from router.gateway.app import create_app
from router.gateway.live import LiveOptions
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import FakeBackend, serve_app

TOKEN = "adm1n-t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def wait_for(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextmanager
def router(overrides=None, live=None, backends=()):
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in backends]
        config = load_config(overrides={
            "instances": [{"url": u, "name": b.name} for u, b in zip(urls, backends)],
            "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, "policy": {"seed": 1},
            **(overrides or {}),
        })
        app = create_app(config, live=live)
        yield stack.enter_context(serve_app(app)), app


def completion(i, stream=False, shared="Shared system prompt for every request of this test. " * 20):
    return {"model": "m", "prompt": f"{shared} question {i}", "max_tokens": 4, "stream": stream}


def test_starts_with_no_instance_unready_until_one_is_added():
    with ExitStack() as stack:
        engine = stack.enter_context(start_in_thread(EmulatorConfig(model="m", time_scale=0.01, engine_id="e0")))
        url, app = stack.enter_context(router({"instances": []}))
        r = httpx.get(f"{url}/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["error"] == {"message": "no instance can take requests yet", "type": "server_error",
                                     "param": None, "code": "no_healthy_instance"}
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.post(f"{url}/v1/completions", json=completion(0)).status_code == 503

        r = httpx.post(f"{url}/admin/instances", json={"url": engine.url, "name": "e0", "model": "m"}, headers=AUTH)
        assert r.status_code == 201 and r.json()["source"] == "static"
        wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, what="ready after the health check")
        r = httpx.post(f"{url}/v1/completions", json=completion(1))
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        listed = httpx.get(f"{url}/admin/instances", headers=AUTH).json()["instances"]
        assert [(i["id"], i["healthy"], i["source"]) for i in listed] == [("e0", True, "static")]
        assert httpx.get(f"{url}/admin/config", headers=AUTH).json()["instances"][0]["url"] == engine.url
        # an invalid instance is refused with the reason, nothing added
        r = httpx.post(f"{url}/admin/instances", json={"url": "ftp://x", "name": "bad"}, headers=AUTH)
        assert r.status_code == 422 and "url" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/admin/instances", json={"url": engine.url, "name": "e0"}, headers=AUTH)
        assert r.status_code == 409
        assert len(app.state.pool) == 1


def test_admin_routes_need_the_token():
    with router() as (url, app):
        for method, path in [("GET", "/admin/config"), ("PATCH", "/admin/config"), ("GET", "/admin/instances"),
                             ("POST", "/admin/instances"), ("DELETE", "/admin/instances/x"), ("POST", "/admin/instances/x/drain")]:
            r = httpx.request(method, url + path, json={}, headers={"authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (method, path)
    with router({"server": {}}) as (url, app):
        r = httpx.get(f"{url}/admin/config", headers=AUTH)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"


def test_patch_changes_weights_live_and_refuses_bad_or_fixed_changes():
    a = FakeBackend("a")
    overrides = {"state": {"redis_url": "redis://default:hunter2@127.0.0.1:6379/0"}}
    with router(overrides, backends=[a]) as (url, app):
        doc = httpx.get(f"{url}/admin/config", headers=AUTH).json()
        assert doc["server"]["admin_token"] == "***" and doc["state"]["redis_url"] == "redis://default:***@127.0.0.1:6379/0"
        policy_before = app.state.service.policy

        r = httpx.patch(f"{url}/admin/config", json={"policy": {"ttft": {"request_overhead_s": 0.02, "tie_tolerance": 0.1}},
                                                     "health": {"timeout_s": 1.5}}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["changed"] == ["health.timeout_s", "policy.ttft.request_overhead_s", "policy.ttft.tie_tolerance"]
        assert app.state.config.policy.ttft.request_overhead_s == 0.02 and app.state.config.health.timeout_s == 1.5
        assert app.state.service.policy is not policy_before  # the policy object was rebuilt with the new weights
        assert httpx.post(f"{url}/v1/completions", json=completion(1)).status_code == 200

        # the GET body sent back whole (secrets masked) changes nothing
        doc = httpx.get(f"{url}/admin/config", headers=AUTH).json()
        r = httpx.patch(f"{url}/admin/config", json=doc, headers=AUTH)
        assert r.status_code == 200 and r.json()["changed"] == []
        assert app.state.config.state.redis_url.endswith("hunter2@127.0.0.1:6379/0")

        for patch, code, words in [
            ({"policy": {"ttft": {"tie_tolerance": 5}}}, "invalid_config", "policy.ttft.tie_tolerance"),
            ({"policy": {"name": "fastest"}}, "invalid_config", "policy.name"),
            ({"policy": {"weight_typo": 1}}, "invalid_config", "policy.weight_typo"),
            ({"policy": {"pipeline": {"scorers": [{"name": "prefx"}]}}}, "invalid_config", "unknown scorer 'prefx'"),
            ({"state": {"backend": "redis"}}, "config_refused", "state.backend cannot change while the router runs"),
            ({"hashing": {"block_chars": 128}}, "config_refused", "hashing.block_chars cannot change"),
        ]:
            r = httpx.patch(f"{url}/admin/config", json=patch, headers=AUTH)
            assert r.status_code == 422, (patch, r.text)
            err = r.json()["error"]
            assert err["code"] == code and words in err["message"] and err["type"] == "invalid_request_error", err
        assert app.state.config.policy.ttft.tie_tolerance == 0.1 and app.state.config.state.backend == "memory"
        r = httpx.patch(f"{url}/admin/config", content=b"{nope", headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = httpx.patch(f"{url}/admin/config", content=b"[1]", headers={**AUTH, "content-type": "application/merge-patch+json"})
        assert r.status_code == 400

        r = httpx.patch(f"{url}/admin/config", json={"policy": {"name": "round_robin"}}, headers=AUTH)
        assert r.status_code == 200
        assert httpx.get(f"{url}/debug/instances", headers=AUTH).json()["policy"] == "round_robin"


def test_patch_of_a_field_the_environment_sets_is_refused(monkeypatch):
    monkeypatch.setenv("PD_ROUTER_PD__TBT_TARGET_S", "0.2")
    with router() as (url, app):
        r = httpx.patch(f"{url}/admin/config", json={"pd": {"tbt_target_s": 0.5}}, headers=AUTH)
        assert r.status_code == 422 and "PD_ROUTER_PD__TBT_TARGET_S" in r.json()["error"]["message"]
        assert app.state.config.pd.tbt_target_s == 0.2


def test_drain_lets_requests_in_flight_finish_and_sends_new_ones_elsewhere():
    slow, other = FakeBackend("slow", chunk_s=0.3, chunks=4), FakeBackend("other")
    with router(backends=[slow, other]) as (url, app):
        app.state.pool.set_draining("other", True)  # the first request goes to slow
        with httpx.stream("POST", f"{url}/v1/completions", json=completion(1, stream=True), timeout=10) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            app.state.pool.set_draining("other", False)
            r = httpx.post(f"{url}/admin/instances/slow/drain", headers=AUTH)
            assert r.status_code == 200 and r.json()["draining"] is True and r.json()["inflight"] == 1
            for i in range(4):  # the same prefix would stick to slow: draining sends it to other
                assert httpx.post(f"{url}/v1/completions", json=completion(i + 10)).status_code == 200
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and len(slow.received) == 1 and len(other.received) == 4
        r = httpx.post(f"{url}/admin/instances/slow/resume", headers=AUTH)
        assert r.status_code == 200 and r.json()["routable"] is True

        r = httpx.delete(f"{url}/admin/instances/slow", headers=AUTH)
        assert r.status_code == 200 and "slow" not in app.state.pool
        assert [i["id"] for i in httpx.get(f"{url}/admin/instances", headers=AUTH).json()["instances"]] == ["other"]
        assert httpx.delete(f"{url}/admin/instances/slow", headers=AUTH).status_code == 404
        assert httpx.post(f"{url}/admin/instances/nope/drain", headers=AUTH).status_code == 404


def test_workers_refuse_admin_writes_they_could_not_share():
    with router(live=LiveOptions(workers=2)) as (url, app):
        assert httpx.get(f"{url}/admin/config", headers=AUTH).status_code == 200
        r = httpx.patch(f"{url}/admin/config", json={"pd": {"tbt_target_s": 0.5}}, headers=AUTH)
        assert r.status_code == 409 and r.json()["error"]["code"] == "per_worker_admin"


def _configmap_update(directory, data, generation):
    """What the kubelet does: write a new timestamped dir, swap the ..data symlink atomically."""
    target = directory / f"..gen{generation}"
    target.mkdir()
    (target / "config.yaml").write_text(yaml.safe_dump(data))
    tmp = directory / "..data_tmp"
    os.symlink(target.name, tmp)
    os.replace(tmp, directory / "..data")


def test_a_configmap_update_is_applied_and_a_bad_one_refused(tmp_path, caplog):
    a = FakeBackend("a")
    with ExitStack() as stack:
        a_url = stack.enter_context(serve_app(a.app()))
        data = {"instances": [{"url": a_url, "name": "a"}], "server": {"admin_token": TOKEN},
                "health": {"interval_s": 60}, "reload": {"poll_interval_s": 0.05}}
        _configmap_update(tmp_path, data, 1)
        os.symlink("..data/config.yaml", tmp_path / "config.yaml")
        path = str(tmp_path / "config.yaml")
        config = load_config(path)
        url = stack.enter_context(serve_app(create_app(config, live=LiveOptions(config_path=path))))

        data["policy"] = {"ttft": {"decode_interference_s": 0.01}}
        _configmap_update(tmp_path, data, 2)
        wait_for(lambda: config.policy.ttft.decode_interference_s == 0.01, what="the new weight")

        caplog.set_level("ERROR", logger="router.gateway.live")
        _configmap_update(tmp_path, {**data, "policy": {"ttft": {"decode_interference_s": -1}}}, 3)
        wait_for(lambda: "refused" in caplog.text, what="the bad config refused")
        assert "policy.ttft.decode_interference_s" in caplog.text and config.policy.ttft.decode_interference_s == 0.01
        _configmap_update(tmp_path, {**data, "state": {"backend": "redis"}}, 4)
        wait_for(lambda: "state.backend cannot change" in caplog.text, what="a restart-only change refused")
        assert config.state.backend == "memory"
        assert httpx.post(f"{url}/v1/completions", json=completion(1)).status_code == 200


def test_patch_resets_a_field_with_null_and_replaces_the_instance_list():
    a, b = FakeBackend("a"), FakeBackend("b")
    with router({"health": {"interval_s": 30}}, backends=[a]) as (url, app):
        r = httpx.patch(f"{url}/admin/config", json={"health": {"interval_s": None}}, headers=AUTH)
        assert r.status_code == 200 and r.json()["changed"] == ["health.interval_s"] and app.state.config.health.interval_s == 5
        with serve_app(b.app()) as b_url:
            r = httpx.patch(f"{url}/admin/config", json={"instances": [{"url": b_url, "name": "b"}]}, headers=AUTH)
            assert r.status_code == 200 and r.json()["changed"] == ["instances"]
            assert [i.id for i in app.state.pool] == ["b"]
            wait_for(lambda: app.state.pool.get("b").healthy, what="b checked")
            assert httpx.post(f"{url}/v1/completions", json=completion(1)).status_code == 200
        assert len(b.received) == 1 and a.received == []


def _engine_samples(url: str, name: str) -> list[str]:
    return [line for line in httpx.get(f"{url}/metrics").text.splitlines()
            if not line.startswith("#") and f'engine="{name}"' in line]


def test_a_removed_instance_leaves_the_metrics_and_counts_again_when_it_returns():
    a, b = FakeBackend("a"), FakeBackend("b")
    with router({"policy": {"name": "round_robin"}}, backends=[a, b]) as (url, app):
        for i in range(4):
            assert httpx.post(f"{url}/v1/completions", json=completion(i)).status_code == 200
        assert any(s.startswith("pd_router_requests_total") for s in _engine_samples(url, "b"))
        b_config = next(ic for ic in app.state.config.instances if ic.name == "b")
        assert httpx.delete(f"{url}/admin/instances/b", headers=AUTH).status_code == 200
        wait_for(lambda: _engine_samples(url, "b") == [], what="b's series dropped")
        r = httpx.post(f"{url}/admin/instances", json=b_config.model_dump(exclude_none=True), headers=AUTH)
        assert r.status_code == 201, r.text
        wait_for(lambda: app.state.pool.get("b").healthy, what="b checked again")
        for i in range(4):
            assert httpx.post(f"{url}/v1/completions", json=completion(10 + i)).status_code == 200
        served = [s for s in _engine_samples(url, "b") if s.startswith("pd_router_requests_total")]
        assert served and sum(float(s.split()[-1]) for s in served) == 2.0  # counted from zero again, not lost


def test_patching_kv_store_switches_the_store_tier_on_and_off():
    with router(backends=[FakeBackend("a")]) as (url, app):
        assert app.state.service.store_tier is None
        r = httpx.patch(f"{url}/admin/config", json={"kv_store": {"enabled": True, "capacity_tokens": 16_000}}, headers=AUTH)
        assert r.status_code == 200 and "kv_store.enabled" in r.json()["changed"]
        tier = app.state.service.store_tier
        assert tier is not None and tier.capacity == 16_000 // app.state.config.hashing.block_tokens
        assert httpx.post(f"{url}/v1/completions", json=completion(1)).status_code == 200
        assert len(tier) > 0  # the routed prompt is believed stored
        r = httpx.patch(f"{url}/admin/config", json={"kv_store": {"bandwidth_gbps": -1}}, headers=AUTH)
        assert r.status_code == 422 and app.state.service.store_tier is tier
        httpx.patch(f"{url}/admin/config", json={"kv_store": {"enabled": False}}, headers=AUTH)
        assert app.state.service.store_tier is None
