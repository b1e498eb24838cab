"""Two router processes sharing one real Redis behave as one router."""

import subprocess
import sys
from collections import Counter
from contextlib import ExitStack

import httpx
import pytest

from router.tools.localrun import router_process
from servers import FakeBackend, serve_app


def shared_state_config(stack: ExitStack, backends: list[FakeBackend], redis_url: str, key_prefix: str,
                        cluster: bool = False) -> dict:
    """Serve ``backends`` and return a router config that shares state through Redis."""
    urls = [stack.enter_context(serve_app(b.app())) for b in backends]
    return {
        "instances": [{"url": u, "name": b.name} for u, b in zip(urls, backends)],
        "state": {"backend": "redis", "redis_url": redis_url, "key_prefix": key_prefix,
                  "sharding": {"cluster": cluster}},
    }


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_two_replicas_send_the_same_prefix_to_the_same_backend(kind, request, key_prefix):
    backends = [FakeBackend("a"), FakeBackend("b")]
    url = request.getfixturevalue("redis_cluster_url" if kind == "cluster" else "redis_url")
    with ExitStack() as stack:
        config = shared_state_config(stack, backends, url, key_prefix, cluster=kind == "cluster")
        one = stack.enter_context(router_process(config)).url
        two = stack.enter_context(router_process(config)).url
        shared = "Shared system prompt for every tenant of the platform. " * 40
        for group in range(6):
            prefix = f"group {group}: " + shared
            for i, router in enumerate([one, two, two, one, two]):
                body = {"model": "m", "prompt": f"{prefix} question {i}", "max_tokens": 4}
                assert httpx.post(f"{router}/v1/completions", json=body).status_code == 200
            # every request of a group landed on the backend the first one chose
            got = Counter(b.name for b in backends for r in b.received if r["body"]["prompt"].startswith(f"group {group}:"))
            assert len(got) == 1 and sum(got.values()) == 5, got
        metrics = httpx.get(f"{two}/metrics").text
        assert "pd_router_state_round_trips_total" in metrics


def test_invalid_config_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("instances:\n  - url: not-a-url\nstate:\n  backend: mongo\n")
    proc = subprocess.run([sys.executable, "-m", "router", "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "instances.0.url" in proc.stderr and "state.backend" in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "router", "serve", "--config", str(tmp_path / "nope.yaml")],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr


def test_worker_processes_share_state_through_redis(redis_url, key_prefix, tmp_path):
    backends = [FakeBackend("a"), FakeBackend("b")]
    with ExitStack() as stack:
        config = shared_state_config(stack, backends, redis_url, key_prefix)
        router = stack.enter_context(router_process(config, args=["--workers", "2"])).url
        shared = "One system prompt for the whole fleet. " * 60
        for i in range(8):
            body = {"model": "m", "prompt": f"{shared} question {i}", "max_tokens": 4}
            assert httpx.post(f"{router}/v1/completions", json=body).status_code == 200
    # whichever worker took each request, the shared view kept the prefix on one backend
    assert sorted([len(b.received) for b in backends]) == [0, 8]

    path = tmp_path / "memory.yaml"
    path.write_text("instances:\n  - url: http://127.0.0.1:9\n")
    proc = subprocess.run([sys.executable, "-m", "router", "serve", "--config", str(path), "--workers", "2"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "needs state.backend: redis" in proc.stderr
