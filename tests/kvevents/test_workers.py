"""``serve --workers N`` and bound KV-event sockets: only one process can bind an address.

Every worker ingests the events itself, so a SUB the router binds (engines connecting to
it) would feed one worker and leave the others approximate: ``serve`` refuses such a
config, and a worker process never binds for a connecting publisher that discovery finds."""

import logging
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx

from router.config.model import load_config
from router.gateway.app import create_app
from router.gateway.live import LiveOptions
from router.gateway.serve import workers_problem
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import free_port, serve_app

REDIS = {"backend": "redis", "redis_url": "redis://127.0.0.1:1"}


def precise(**kv_events):
    return {"instances": [{"url": "http://127.0.0.1:9", "name": "a", "model": "m"}], "state": REDIS,
            "hashing": {"mode": "tokens"}, "kv_events": {"enabled": True, **kv_events}}


def test_workers_refuse_bound_sockets_and_take_connecting_ones():
    bound = load_config(overrides=precise(bind="tcp://*:5557"))
    topic_only = load_config(overrides=precise(bind="tcp://*:5557", sources={"a": {"topic": "kv@a"}}))
    connecting = load_config(overrides=precise(sources={"a": {"endpoint": "tcp://*:5557"}}))
    discovered = load_config(overrides=precise())
    for config in (bound, topic_only):
        assert "cannot use bound KV-event sockets" in (workers_problem(config, 2) or "")
        assert workers_problem(config, 1) is None
    assert workers_problem(connecting, 2) is None and workers_problem(discovered, 2) is None


def test_serve_exits_2_with_the_reason(tmp_path):
    path = tmp_path / "bound.yaml"
    path.write_text("instances:\n  - url: http://127.0.0.1:9\nstate:\n  backend: redis\n  redis_url: redis://127.0.0.1:1\n"
                    "hashing:\n  mode: tokens\nkv_events:\n  enabled: true\n  bind: tcp://*:5557\n")
    proc = subprocess.run([sys.executable, "-m", "router", "serve", "--config", str(path), "--workers", "2"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "cannot use bound KV-event sockets" in proc.stderr, proc.stderr


def test_a_worker_never_binds_for_a_publisher_that_connects(caplog):
    port = free_port()
    with ExitStack() as stack:
        engine = stack.enter_context(start_in_thread(EmulatorConfig(  # an endpoint naming a host: it connects
            model="m", time_scale=0.01, kv_events_endpoint=f"tcp://127.0.0.1:{port}", kv_events_topic="kv@e")))
        config = load_config(overrides={
            "instances": [{"url": engine.url, "name": "e", "model": "m"}], "health": {"interval_s": 60},
            "hashing": {"mode": "tokens"}, "kv_events": {"enabled": True, "discover_interval_s": 0.2}})
        app = create_app(config, live=LiveOptions(workers=2))
        with caplog.at_level(logging.ERROR, logger="router.kvevents.ingest"):
            url = stack.enter_context(serve_app(app))
            deadline = time.monotonic() + 10
            while "only one process can bind" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.02)
        ingest = app.state.kv_events
        assert ingest.sources == [] and not ingest.residency.is_fresh("e")  # approximate, in every worker alike
        assert httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}).status_code == 200
        time.sleep(0.5)  # the refusal is for good: no retry binds it later
        assert ingest.sources == [] and caplog.text.count("only one process can bind") == 1
