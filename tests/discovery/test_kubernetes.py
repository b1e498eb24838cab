"""Kubernetes discovery through lightkube against a loopback API server (tests/k8sapi.py)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time

import pytest

from k8sapi import FakeApiServer, run_api_server
from router.config.discovery import KubernetesDiscoveryConfig
from router.discovery.kubernetes import KubernetesSource

PREFILL = {"app": "vllm", "pd-role": "prefill"}
DECODE = {"app": "vllm", "pd-role": "decode"}


class Views:
    """The sink: the last set each source published."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, object]] = {}
        self.calls = 0

    async def __call__(self, source, instances):
        self.calls += 1
        self.last[source] = {ic.id: ic for ic in instances}

    def ids(self) -> set[str]:
        return set(self.last.get("kubernetes", {}))


async def until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(source):
    task = asyncio.create_task(source.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def config(url, **kw):
    base = {"enabled": True, "api_server": url, "namespace": "llm", "selectors": {"prefill": PREFILL, "decode": DECODE},
            "backoff_initial_s": 0.05, "backoff_max_s": 0.2}
    return KubernetesDiscoveryConfig.model_validate({**base, **kw})


async def test_ready_pods_with_an_ip_become_instances_with_their_annotations():
    api = FakeApiServer()
    api.add_pod("p0", PREFILL, ip="10.0.0.1", annotations={"pd-router.io/port": "8100", "pd-router.io/flavor": "sglang",
                                                            "pd-router.io/bootstrap-port": "8998", "pd-router.io/model": "llama/8b"})
    api.add_pod("d0", DECODE, ip="10.0.0.2", node="node-b", annotations={"pd-router.io/zone": "z1"})
    api.add_pod("d-starting", DECODE, ip="10.0.0.3", ready=False)
    api.add_pod("d-pending", DECODE, ip=None)
    api.add_pod("other", {"app": "web"}, ip="10.0.0.9")
    views = Views()
    with run_api_server(api) as url:
        async with running(KubernetesSource(config(url, defaults={"port": 8000, "model": "m"}), views)):
            await until(lambda: views.ids() == {"p0", "d0"}, what="two instances")
            p0, d0 = views.last["kubernetes"]["p0"], views.last["kubernetes"]["d0"]
            assert (p0.url, p0.role, p0.flavor, p0.bootstrap_port, p0.model) == ("http://10.0.0.1:8100", "prefill", "sglang", 8998, "llama/8b")
            assert (d0.url, d0.role, d0.flavor, d0.model, d0.labels) == ("http://10.0.0.2:8000", "decode", "vllm", "m",
                                                                           {"node": "node-b", "zone": "z1"})
            # lists and watches are namespaced and carry the role's label selector
            selectors = {r["params"].get("labelSelector") for r in api.requests}
            assert selectors == {"app=vllm,pd-role=prefill", "app=vllm,pd-role=decode"}

            api.set_ready("d-starting", True)
            await until(lambda: "d-starting" in views.ids(), what="pod turning Ready")
            api.set_ready("d0", False)
            await until(lambda: "d0" not in views.ids(), what="pod turning unready")
            api.delete_pod("p0")
            await until(lambda: views.ids() == {"d-starting"}, what="deleted pod gone")
            # a bad annotation skips the pod (logged) instead of guessing
            api.add_pod("d-bad", DECODE, ip="10.0.0.4", annotations={"pd-router.io/port": "eighty"})
            api.add_pod("d1", DECODE, ip="10.0.0.5")
            await until(lambda: "d1" in views.ids(), what="pod after a bad one")
            assert "d-bad" not in views.ids()


async def test_a_broken_watch_relists_and_catches_up_with_what_it_missed():
    api = FakeApiServer()
    api.add_pod("d0", DECODE, ip="10.0.0.2")
    api.add_pod("d1", DECODE, ip="10.0.0.3")
    views = Views()
    with run_api_server(api) as url:
        source = KubernetesSource(config(url, selectors={"decode": DECODE}), views)
        async with running(source):
            await until(lambda: views.ids() == {"d0", "d1"}, what="first list")
            await until(lambda: api.count(watch=True) >= 1, what="watch opened")
            lists = api.count(watch=False)
            api.break_watches()  # the connection drops mid-stream
            api.delete_pod("d0")
            await until(lambda: views.ids() == {"d1"}, what="relist after a dropped watch")
            assert api.count(watch=False) > lists and source.relists >= 1


async def test_410_gone_after_a_clean_watch_end_relists_from_scratch():
    """The server ends a watch (its timeout); the resumed watch's version has been compacted
    away (410 Gone); only a fresh list can tell that d0 was deleted meanwhile."""
    api = FakeApiServer()
    api.watch_timeout_s = 0.3
    api.add_pod("d0", DECODE, ip="10.0.0.2")
    views = Views()
    with run_api_server(api) as url:
        source = KubernetesSource(config(url, selectors={"decode": DECODE}), views)
        async with running(source):
            await until(lambda: views.ids() == {"d0"}, what="first list")
            await until(lambda: api.count(watch=True) >= 1, what="watch opened")
            api.delete_pod("d0")
            api.add_pod("d2", DECODE, ip="10.0.0.4")
            api.compact()
            await until(lambda: views.ids() == {"d2"}, what="relist after 410")
            resumed = [r for r in api.requests if r["watch"] and r["params"].get("resourceVersion")]
            assert len(resumed) >= 2 and source.relists >= 1


@pytest.fixture
def tls_cert(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_in_cluster_service_account_auth(tmp_path, tls_cert, monkeypatch):
    """No api_server: KUBERNETES_SERVICE_HOST/PORT, the token and the CA from the service account."""
    cert, key = tls_cert
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("sa-token-1")
    (account / "ca.crt").write_bytes(cert.read_bytes())
    (account / "namespace").write_text("llm")
    api = FakeApiServer(token="sa-token-1")
    api.add_pod("d0", DECODE, ip="10.0.0.2")
    views = Views()
    with run_api_server(api, certfile=str(cert), keyfile=str(key)) as url:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", url.rsplit(":", 1)[1])
        cfg = KubernetesDiscoveryConfig.model_validate({"enabled": True, "selectors": {"decode": DECODE},
                                                        "service_account_dir": str(account), "backoff_initial_s": 0.05,
                                                        "backoff_max_s": 0.2})
        async with running(KubernetesSource(cfg, views)):
            await until(lambda: views.ids() == {"d0"}, what="pods over TLS with the token")
            assert {r["authorization"] for r in api.requests} == {"Bearer sa-token-1"}
            # the kubelet rotates the bound token: the next 401 makes the client read the file again
            api.token = "sa-token-2"
            (account / "token").write_text("sa-token-2")
            api.break_watches()
            api.add_pod("d1", DECODE, ip="10.0.0.3")
            await until(lambda: views.ids() == {"d0", "d1"}, what="pods after the token rotated")
