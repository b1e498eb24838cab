"""The router with Kubernetes discovery on: pods on a loopback API server point at emulated
engines; they are routed to once Ready, and a deleted pod's residency and load leave the
shared Redis state. Plus ``pd-router serve`` itself: no instance, the image's default
config, SIGHUP reloading instead of ending the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from urllib.parse import urlsplit

import httpx
import redis
import yaml

from router.state.redis_layout import Layout

from k8sapi import FakeApiServer, run_api_server
from router.config.model import load_config
from router.gateway.app import create_app
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import free_port, serve_app

TOKEN = "adm1n-t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PREFILL = {"app": "engine", "pd-role": "prefill"}
DECODE = {"app": "engine", "pd-role": "decode"}
SYSTEM = "You are the support assistant of a large logistics company. Answer precisely. " * 30


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def chat(question):
    return {"model": "m", "max_tokens": 6, "messages": [{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": question}]}


def instances(url):
    return {i["id"]: i for i in httpx.get(f"{url}/admin/instances", headers=AUTH).json()["instances"]}


def test_pods_found_by_role_are_routed_to_and_a_deleted_pod_leaves_the_shared_state(redis_url, key_prefix):
    with ExitStack() as stack:
        base = EmulatorConfig(flavor="vllm", model="m", time_scale=0.01)
        p0 = stack.enter_context(start_in_thread(base.replace(role="prefill", engine_id="p0")))
        d0 = stack.enter_context(start_in_thread(base.replace(role="decode", engine_id="d0")))
        api = FakeApiServer(namespace="llm")
        api_url = stack.enter_context(run_api_server(api))
        config = load_config(overrides={
            "instances": [], "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, "policy": {"seed": 1},
            "state": {"backend": "redis", "redis_url": redis_url, "key_prefix": key_prefix},
            "discovery": {"kubernetes": {"enabled": True, "api_server": api_url, "namespace": "llm",
                                         "selectors": {"prefill": PREFILL, "decode": DECODE},
                                         "defaults": {"model": "m"}, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}},
        })
        app = create_app(config)
        url = stack.enter_context(serve_app(app))
        assert httpx.get(f"{url}/ready").status_code == 503

        # a pod that is not Ready yet is not an instance
        api.add_pod("d0", DECODE, ip="127.0.0.1", ready=False, annotations={"pd-router.io/port": str(urlsplit(d0.url).port)})
        time.sleep(0.3)
        assert instances(url) == {} and httpx.get(f"{url}/ready").status_code == 503
        api.set_ready("d0", True)
        wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, what="ready once a pod is Ready and checked")
        r = httpx.post(f"{url}/v1/chat/completions", json=chat("Where is parcel 1?"), timeout=30)
        assert r.status_code == 200, r.text
        assert app.state.service.policy.name == "ttft" and not app.state.pool.disaggregated

        # a prefill pod joins: the cluster turns disaggregated, the policy is rebuilt for pairs
        api.add_pod("p0", PREFILL, ip="127.0.0.1", annotations={"pd-router.io/port": str(urlsplit(p0.url).port)})
        wait_for(lambda: instances(url).get("p0", {}).get("healthy"), what="prefill pod healthy")
        assert app.state.pool.disaggregated
        r = httpx.post(f"{url}/v1/chat/completions", json=chat("And parcel 2?"), timeout=30)
        assert r.status_code == 200, r.text
        assert {i["source"] for i in instances(url).values()} == {"kubernetes"}

        # residency of d0 is in Redis; deleting its pod drops it there, and d0 is never contacted again
        db = redis.Redis.from_url(redis_url)
        layout = Layout(key_prefix)  # the router's default shard counts
        lru = layout.lru_key("d0")
        assert db.zcard(lru) > 0
        api.delete_pod("d0")
        wait_for(lambda: "d0" not in instances(url), what="deleted pod gone")
        wait_for(lambda: db.zcard(lru) == 0, what="residency dropped")
        assert db.hget(layout.loads_key("d0"), "d0") is None
        r = httpx.post(f"{url}/v1/chat/completions", json=chat("And parcel 3?"), timeout=30)
        assert r.status_code == 503  # only a prefill instance is left: nothing can decode
        # the admin API cannot remove what discovery found
        r = httpx.delete(f"{url}/admin/instances/p0", headers=AUTH)
        assert r.status_code == 422 and "kubernetes" in r.json()["error"]["message"]
        db.close()


@contextmanager
def serve_process(config: dict, tmp_path, *args: str):
    """``pd-router serve`` as a subprocess; waits for /health (not /ready: it may have no instance)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PD_ROUTER_")}
    log = open(tmp_path / "router.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "router", "serve", "--config", str(path), "--port", str(port), *args],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        def up():
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, timeout=30, what="router process up")
        yield proc, url, path
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def test_the_image_default_config_starts_and_stays_unready(tmp_path):
    # the Dockerfile writes exactly this config
    with serve_process({"instances": [], "state": {"backend": "memory"}}, tmp_path) as (proc, url, path):
        r = httpx.get(f"{url}/ready")
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "no_healthy_instance"
        time.sleep(0.5)
        assert proc.poll() is None


def test_sighup_reloads_the_config_file_and_the_process_lives_on(tmp_path):
    with ExitStack() as stack:
        engine = stack.enter_context(start_in_thread(EmulatorConfig(model="m", time_scale=0.01, engine_id="e0")))
        config = {"instances": [], "server": {"admin_token": TOKEN}, "reload": {"watch_file": False},
                  "health": {"interval_s": 60}}
        proc, url, path = stack.enter_context(serve_process(config, tmp_path))
        assert httpx.get(f"{url}/ready").status_code == 503
        config["instances"] = [{"url": engine.url, "name": "e0", "model": "m"}]
        config["policy"] = {"ttft": {"request_overhead_s": 0.03}}
        path.write_text(yaml.safe_dump(config))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, what="ready after SIGHUP added an instance")
        doc = httpx.get(f"{url}/admin/config", headers=AUTH).json()
        assert doc["policy"]["ttft"]["request_overhead_s"] == 0.03 and doc["server"]["admin_token"] == "***"
        r = httpx.post(f"{url}/v1/chat/completions", json=chat("Where is parcel 9?"), timeout=30)
        assert r.status_code == 200, r.text
        # a broken file on SIGHUP: refused, logged, the process and its config stay
        path.write_text("policy: {ttft: {request_overhead_s: -1}}\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b"refused" in (tmp_path / "router.log").read_bytes(), what="refusal logged")
        assert proc.poll() is None
        assert httpx.get(f"{url}/admin/config", headers=AUTH).json()["policy"]["ttft"]["request_overhead_s"] == 0.03


def test_pods_found_at_run_time_are_subscribed_to_their_kv_events_and_unsubscribed_when_deleted():
    """Precise residency follows discovery: a Ready pod's engine is found through its own
    /kv_event_sources and subscribed; a deleted pod's subscription and tables go with it."""
    with ExitStack() as stack:
        base = EmulatorConfig(model="m", time_scale=0.01, kv_events_endpoint="tcp://*:0",
                              kv_events_replay_endpoint="tcp://*:0")
        a = stack.enter_context(start_in_thread(base.replace(engine_id="a")))
        b = stack.enter_context(start_in_thread(base.replace(engine_id="b")))
        api = FakeApiServer(namespace="llm")
        api_url = stack.enter_context(run_api_server(api))
        config = load_config(overrides={
            "instances": [], "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, "policy": {"seed": 1},
            "hashing": {"mode": "tokens"}, "kv_events": {"enabled": True, "discover_interval_s": 0.2},
            "discovery": {"kubernetes": {"enabled": True, "api_server": api_url, "namespace": "llm",
                                         "selectors": {"decode": DECODE}, "defaults": {"model": "m"},
                                         "backoff_initial_s": 0.05, "backoff_max_s": 0.2}},
        })
        app = create_app(config)
        stack.enter_context(serve_app(app))
        ingest = app.state.kv_events
        for name, engine in (("a", a), ("b", b)):
            api.add_pod(name, DECODE, ip="127.0.0.1", annotations={"pd-router.io/port": str(urlsplit(engine.url).port)})
        wait_for(lambda: len(instances_of(app)) == 2 and all(ingest.residency.is_fresh(i) for i in instances_of(app)),
                 what="both pods' engines subscribed and in sync")
        ids = instances_of(app)
        assert {s.spec.instance for s in ingest.sources} == set(ids)
        gone = next(i for i in ids if app.state.pool.get(i).url == b.url)
        api.delete_pod("b")
        wait_for(lambda: {s.spec.instance for s in ingest.sources} == set(ids) - {gone}, what="b unsubscribed")
        assert gone not in ingest.residency.instances()


def instances_of(app) -> list[str]:
    return [i.id for i in app.state.pool]
