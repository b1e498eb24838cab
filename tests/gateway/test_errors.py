"""The error model through the real app: every class's status, type, code and headers, the
failures that raise them for real, and an x-request-id on every answer."""

import re
import socket
import threading
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import httpx
import pytest
from servers import FakeBackend, serve_app

from router.config.model import load_config
from router.core import errors
from router.core.errors import RouterError, SLORejected
from router.gateway.app import create_app

TOKEN = "s3cret"
PROMPT = "A long shared system prompt for the error tests. " * 60
NEW_ID = re.compile(r"^[0-9a-f]{32}$")


def all_error_classes() -> list[type[RouterError]]:
    found, todo = [], [RouterError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def make(cls: type[RouterError]) -> RouterError:
    if cls is SLORejected:
        return SLORejected(SimpleNamespace(estimate_s=3.4), 1.0)
    return cls(f"{cls.__name__} raised on purpose")


@contextmanager
def router(*backends, instances=(), admin_token=TOKEN, **overrides):
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in backends]
        listed = [{"url": u, "name": b.name} for u, b in zip(urls, backends)] + list(instances)
        config = load_config(overrides={"instances": listed, "policy": {"seed": 1}, "health": {"interval_s": 60},
                                        "server": {"admin_token": admin_token}, **overrides})
        app = create_app(config)

        async def boom(request):  # a route of this test only: raises what the query names
            name = request.query_params["name"]
            if name == "bug":
                raise RuntimeError("a bug")
            raise make(getattr(errors, name))

        app.add_route("/test/boom", boom, methods=["GET"])
        yield stack.enter_context(serve_app(app)), app


def assert_openai_error(r: httpx.Response, status: int, type_: str, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == type_ and err["code"] == code, err
    assert NEW_ID.match(r.headers["x-request-id"]), r.headers
    return err


@pytest.fixture(scope="module")
def boom_url():
    with router(FakeBackend("a")) as (url, _):
        yield url


@pytest.mark.parametrize("cls", all_error_classes(), ids=lambda c: c.__name__)
def test_every_error_class_maps_to_its_status_type_code_and_headers(boom_url, cls):
    r = httpx.get(f"{boom_url}/test/boom", params={"name": cls.__name__})
    assert_openai_error(r, cls.status, cls.type, cls.default_code)
    if cls.says_retry_after:
        expected = "3" if cls is SLORejected else "2"  # its estimate, else health.retry_after_s
        assert r.headers["retry-after"] == expected
    else:
        assert "retry-after" not in r.headers
    assert ("www-authenticate" in r.headers) == (cls is errors.Unauthorized)


def test_the_classes_cover_the_statuses_clients_see():
    statuses = {cls.status for cls in all_error_classes()}
    assert statuses >= {400, 401, 403, 404, 405, 413, 429, 500, 502, 503, 504}
    for cls in all_error_classes():
        assert cls.type in {"invalid_request_error", "authentication_error", "permission_error", "rate_limit_error",
                            "server_error"}
        assert (cls.type == "server_error") == (cls.status >= 500)


def test_an_unhandled_exception_is_an_openai_500_with_the_request_id(boom_url):
    r = httpx.get(f"{boom_url}/test/boom", params={"name": "bug"})
    err = assert_openai_error(r, 500, "server_error", "internal_error")
    assert "a bug" not in err["message"]  # details stay in the log
    r = httpx.get(f"{boom_url}/test/boom", params={"name": "bug"}, headers={"x-request-id": "trace-7"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "trace-7"


def test_client_errors_raised_for_real(boom_url):
    assert_openai_error(httpx.post(f"{boom_url}/v1/completions", content=b"{nope"), 400, "invalid_request_error", "invalid_json")
    r = httpx.post(f"{boom_url}/v1/completions", json={"model": "m", "prompt": "x"}, headers={"x-ttft-slo-ms": "soon"})
    assert_openai_error(r, 400, "invalid_request_error", "invalid_header")
    r = httpx.get(f"{boom_url}/debug/instances")
    assert_openai_error(r, 401, "authentication_error", "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    assert_openai_error(httpx.get(f"{boom_url}/v2/nothing"), 404, "invalid_request_error", "not_found")
    r = httpx.get(f"{boom_url}/v1/completions")
    assert_openai_error(r, 405, "invalid_request_error", "method_not_allowed")
    assert r.headers["allow"] == "POST"
    big = {"model": "m", "prompt": "x" * (9 * 1024 * 1024)}
    assert_openai_error(httpx.post(f"{boom_url}/v1/completions", json=big), 413, "invalid_request_error", "body_too_large")


def test_admin_routes_without_a_token_are_403():
    with router(FakeBackend("a"), admin_token=None) as (url, _):
        assert_openai_error(httpx.get(f"{url}/debug/instances"), 403, "permission_error", "admin_disabled")


def test_ttft_slo_rejection_is_429_with_retry_after():
    a = FakeBackend("a")
    with router(a) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT}, headers={"x-ttft-slo-ms": "0.001"})
        assert_openai_error(r, 429, "rate_limit_error", "ttft_slo")
        assert int(r.headers["retry-after"]) >= 1
    assert a.received == []


class MisbehavingEngine:
    """A TCP server that takes requests and either hangs up at once or never answers."""

    def __init__(self, mode: str) -> None:
        self.mode, self.sock = mode, socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            if self.mode == "hang_up":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("mode, status, code", [("hang_up", 502, "upstream_failed"), ("silent", 504, "upstream_timeout")])
def test_an_engine_failing_before_any_answer_is_502_or_504(mode, status, code):
    engine = MisbehavingEngine(mode)
    try:
        with router(instances=[{"url": engine.url, "name": "bad"}], proxy={"request_timeout_s": 0.5}) as (url, app):
            app.state.pool.get("bad").healthy = True  # its /health check failed at start
            r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10)
            assert_openai_error(r, status, "server_error", code)
            assert "retry-after" not in r.headers
            text = httpx.get(f"{url}/metrics").text
            assert f'pd_router_rejected_total{{status="{status}"}} 1.0' in text
    finally:
        engine.close()


def test_no_capacity_and_no_route_are_503_with_retry_after():
    dead = {"url": "http://127.0.0.1:9", "name": "dead"}
    with router(instances=[dead]) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi"})
        assert_openai_error(r, 503, "server_error", "no_healthy_instance")
        assert r.headers["retry-after"] == "2"
    p = FakeBackend("p")
    with ExitStack() as stack:
        p_url = stack.enter_context(serve_app(p.app()))
        with router(instances=[{"url": p_url, "name": "p", "role": "prefill"}]) as (url, _):
            r = httpx.post(f"{url}/debug/route", json={"model": "m", "prompt": "hi"},
                           headers={"authorization": f"Bearer {TOKEN}"})
            assert_openai_error(r, 503, "server_error", "no_route")
            assert r.headers["retry-after"] == "2"


def test_every_answer_carries_a_request_id(boom_url):
    good = FakeBackend("good")
    refusing = FakeBackend("refusing", status=400)
    for backend, status in ((good, 200), (refusing, 400)):
        with router(backend) as (url, _):
            for stream in (False, True):
                r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "stream": stream})
                assert r.status_code == status and NEW_ID.match(r.headers["x-request-id"])
                r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "stream": stream},
                               headers={"x-request-id": "abc.123:x-y_z"})
                assert r.headers.get_list("x-request-id") == ["abc.123:x-y_z"]
    assert {s["headers"]["x-request-id"] for s in good.received} >= {"abc.123:x-y_z"}
    for path in ("/health", "/ready", "/metrics", "/v1/models"):
        r = httpx.get(f"{boom_url}{path}")
        assert r.status_code == 200 and NEW_ID.match(r.headers["x-request-id"]), path
    for bad in ("has space", "x" * 129, "semi;colon"):
        r = httpx.get(f"{boom_url}/health", headers={"x-request-id": bad})
        assert NEW_ID.match(r.headers["x-request-id"]), bad
