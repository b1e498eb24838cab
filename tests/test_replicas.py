"""Two router processes sharing one real Redis behave as one router."""

import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack, contextmanager

import httpx
import yaml

from servers import FakeBackend, free_port, serve_app


@contextmanager
def router_process(config_path, port):
    proc = subprocess.Popen(
        [sys.executable, "-m", "router", "serve", "--config", str(config_path), "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_two_replicas_send_the_same_prefix_to_the_same_backend(tmp_path, redis_url, key_prefix):
    backends = [FakeBackend("a"), FakeBackend("b")]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in backends]
        config = {
            "instances": [{"url": u, "name": b.name} for u, b in zip(urls, backends)],
            "state": {"backend": "redis", "redis_url": redis_url, "key_prefix": key_prefix},
        }
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(config))
        one = stack.enter_context(router_process(path, free_port()))
        two = stack.enter_context(router_process(path, free_port()))
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
