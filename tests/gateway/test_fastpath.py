"""The bare ASGI front of the inference routes (router/gateway/fastpath.py): same answers as
Starlette's path, and never a way around a middleware someone installs."""

from contextlib import contextmanager

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from router.config.model import load_config
from router.gateway.app import create_app
from servers import FakeBackend, serve_app


@contextmanager
def router(middleware=None):
    backend = FakeBackend("a")
    with serve_app(backend.app()) as backend_url:
        config = load_config(overrides={"instances": [{"url": backend_url, "name": "a"}], "health": {"interval_s": 60}})
        app = create_app(config)
        if middleware is not None:
            app.add_middleware(middleware)
        with serve_app(app) as url:
            yield url


def test_answers_carry_the_request_id_and_errors_are_openai_bodies():
    with router() as url:
        ok = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2},
                        headers={"x-request-id": "abc-123"})
        assert ok.status_code == 200 and ok.headers["x-request-id"] == "abc-123"
        assert ok.json()["choices"]
        bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert len(bad.headers["x-request-id"]) == 32
        wrong_method = httpx.get(f"{url}/v1/completions")  # not the fast path: Starlette's 405, same error model
        assert wrong_method.status_code == 405 and "error" in wrong_method.json()


class Deny:
    """A stand-in for an API-key check: refuses every inference request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


def test_an_installed_middleware_is_never_bypassed():
    with router(Deny) as url:
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 401
