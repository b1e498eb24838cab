"""The router's OpenAPI document, served at ``/openapi.json``.

FastAPI describes the routes it declares (health, models, metrics, debug, admin); the two
inference routes are plain Starlette routes for speed (router/gateway/app.py), so their
request bodies are described here, by hand: the fields the router itself checks and bounds
(router/request/prompt.py). Everything else in a body is the engine's business and passes
through, hence ``additionalProperties``. Every error answer is the OpenAI error object.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.openapi.utils import get_openapi

from router.request.prompt import MAX_N, MAX_TOKENS_LIMIT

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer", "null"]}}}},
}
_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
}
_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool", "function"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
    "name": {"type": "string"}}}
_BODIES = {
    "/v1/completions": ("Create a completion (routed to an engine)", {
        "type": "object", "required": ["model", "prompt"],
        "properties": {**_COMMON, "prompt": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}}]}}}),
    "/v1/chat/completions": ("Create a chat completion (routed to an engine)", {
        "type": "object", "required": ["model", "messages"],
        "properties": {**_COMMON, "max_completion_tokens": _COMMON["max_tokens"],
                       "messages": {"type": "array", "minItems": 1, "items": _MESSAGE}}}),
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": "an OpenAI-style error", "content": {"application/json": {"schema": _ERROR}}}
            for s in statuses}


def install_openapi(app: FastAPI) -> None:
    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title="pd-router", version="1", routes=app.routes,
                              description="Cache-aware prefill/decode router: OpenAI-compatible inference routes, "
                                          "admin routes behind a bearer token.")
            for path, (summary, schema) in _BODIES.items():
                doc["paths"][path] = {"post": {
                    "summary": summary, "operationId": path.strip("/").replace("/", "_"),
                    "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                    "responses": {"200": {"description": "the engine's answer: JSON, or an SSE stream when stream is true"},
                                  **_errors(400, 401, 404, 413, 429, 502, 503, 504)}}}
            doc["components"] = {**doc.get("components", {}), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]

    async def openapi_json() -> JSONResponse:
        return JSONResponse(build())

    app.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
