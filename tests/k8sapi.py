"""A loopback stand-in for the Kubernetes API server's pod list and watch, for discovery tests.

It speaks the parts of the protocol a client depends on: ``GET .../namespaces/NS/pods``
with ``labelSelector`` answers a PodList carrying the collection's resourceVersion; the
same with ``watch=true&resourceVersion=V`` streams (chunked) one JSON event per line for
every change after V, and an ERROR event with a 410 Status when V is older than the
oldest change still kept (``compact``). ``break_watches`` drops every open watch
mid-stream; ``watch_timeout_s`` ends watches cleanly, as the server's own timeout does.
Optionally TLS and a bearer token (in-cluster auth).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from servers import free_port


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _matches(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeApiServer:
    def __init__(self, namespace: str = "llm", token: str | None = None) -> None:
        self.namespace = namespace
        self.token = token
        self.watch_timeout_s: float | None = None
        self._lock = threading.Lock()
        self._rv = 100
        self._pods: dict[str, dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._oldest = 0  # watches from a version below this get 410 Gone
        self._epoch = 0
        self.requests: list[dict[str, Any]] = []

    # -- what the test does to the "cluster" -------------------------------------------------
    def _record(self, kind: str, pod: dict[str, Any]) -> None:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        self._events.append((self._rv, kind, json.loads(json.dumps(pod))))

    def add_pod(self, name: str, labels: dict[str, str], ip: str | None = "127.0.0.1", ready: bool = True,
                annotations: dict[str, str] | None = None, node: str = "node-a") -> None:
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}", "labels": dict(labels),
                         "annotations": dict(annotations or {})},
            "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "engine:1"}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
        with self._lock:
            self._pods[name] = pod
            self._record("ADDED", pod)

    def set_ready(self, name: str, ready: bool) -> None:
        with self._lock:
            pod = self._pods[name]
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
            self._record("MODIFIED", pod)

    def annotate(self, name: str, **annotations: str) -> None:
        with self._lock:
            pod = self._pods[name]
            pod["metadata"]["annotations"].update(annotations)
            self._record("MODIFIED", pod)

    def delete_pod(self, name: str) -> None:
        with self._lock:
            pod = self._pods.pop(name)
            self._record("DELETED", pod)

    def compact(self) -> None:
        """Forget every change so far: watches from an older version get 410 Gone."""
        with self._lock:
            self._oldest = self._rv + 1
            self._events.clear()

    def break_watches(self) -> None:
        with self._lock:
            self._epoch += 1

    def count(self, watch: bool) -> int:
        return sum(1 for r in self.requests if r["watch"] == watch)

    # -- the API -------------------------------------------------------------------------------
    def app(self) -> Starlette:
        async def pods(request: Request):
            params = request.query_params
            watch = params.get("watch") == "true"
            self.requests.append({"watch": watch, "params": dict(params),
                                  "authorization": request.headers.get("authorization")})
            if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse(_status(401, "Unauthorized", "Unauthorized"), status_code=401)
            if request.path_params["namespace"] != self.namespace:
                return JSONResponse({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)},
                                     "items": []})
            selector = params.get("labelSelector")
            if not watch:
                with self._lock:
                    items = [json.loads(json.dumps(p)) for p in self._pods.values() if _matches(selector, p["metadata"]["labels"])]
                    rv = self._rv
                return JSONResponse({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)},
                                     "items": items})
            since = int(params.get("resourceVersion") or 0)
            return StreamingResponse(self._stream(since, selector), media_type="application/json")

        return Starlette(routes=[Route("/api/v1/namespaces/{namespace}/pods", pods)])

    async def _stream(self, since: int, selector: str | None):
        if since and since < self._oldest - 1:
            yield json.dumps({"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since}")}) + "\n"
            return
        epoch, last = self._epoch, since
        ends = time.monotonic() + self.watch_timeout_s if self.watch_timeout_s else None
        while True:
            if self._epoch != epoch:
                raise ConnectionAbortedError("watch dropped by the test")  # uvicorn cuts the chunked body short
            if ends is not None and time.monotonic() > ends:
                return
            with self._lock:
                fresh = [(rv, kind, obj) for rv, kind, obj in self._events if rv > last]
            for rv, kind, obj in fresh:
                last = rv
                if _matches(selector, obj["metadata"]["labels"]):
                    yield json.dumps({"type": kind, "object": obj}) + "\n"
            await asyncio.sleep(0.02)


@contextmanager
def run_api_server(server: FakeApiServer, certfile: str | None = None, keyfile: str | None = None) -> Iterator[str]:
    """Serve ``server`` on 127.0.0.1 (TLS when a cert is given); yield its URL; stop it."""
    port = free_port()
    config = uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="critical", lifespan="off",
                            loop="asyncio", ssl_certfile=certfile, ssl_keyfile=keyfile)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake API server did not start")
        time.sleep(0.01)
    try:
        yield f"{'https' if certfile else 'http'}://127.0.0.1:{port}"
    finally:
        server.break_watches()
        uv.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():
            uv.force_exit = True
            thread.join(timeout=5)
