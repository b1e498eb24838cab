"""Schemathesis against the router's published OpenAPI document (/openapi.json, which used to
be 404): inference and admin routes, a bounded number of examples so it runs in CI time.
No 5xx, and every documented answer (OpenAI-style errors included) matches its schema."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from gateway.test_app import TOKEN, cluster  # type: ignore[import-not-found]
from servers import FakeBackend


def test_the_openapi_document_is_published_with_the_inference_routes():
    with cluster(FakeBackend("a")) as (url, _):
        doc = httpx.get(f"{url}/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/admin/config", "/admin/instances"} <= set(doc["paths"])
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["max_tokens"]["maximum"] == 2**31 - 1


def test_schemathesis_finds_no_server_error_and_no_malformed_answer():
    cli = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    with cluster(FakeBackend("a")) as (url, _):
        run = subprocess.run(
            [cli, "run", f"{url}/openapi.json", "--max-examples", "25", "--seed", "1",
             "--checks", "not_a_server_error,response_schema_conformance", "--suppress-health-check", "all",
             "--header", f"Authorization: Bearer {TOKEN}"],
            capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
