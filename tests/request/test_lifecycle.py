"""Lifecycle hooks: the events of every attempt, in order and exactly once, whatever the end.

Through the real app (fake engines on loopback) for the ways an attempt ends, and directly on
a Lifecycle for what the emitter guarantees (isolation, once only, shielded abandon)."""

import asyncio
import time
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import httpx
import pytest
from servers import FakeBackend, serve_app

from router.config.model import load_config
from router.gateway.app import create_app
from router.request.lifecycle import Abandon, Attempt, Hook, Lifecycle

PROMPT = "A shared preamble for the lifecycle tests. " * 50


class Recorder(Hook):
    """Appends (name, event, attempt, detail) to a shared log."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    async def before_send(self, attempt):
        self.log.append((self.name, "before_send", attempt, attempt.instance.id))

    async def first_byte(self, attempt):
        self.log.append((self.name, "first_byte", attempt, attempt.instance.id))

    async def end(self, attempt, outcome):
        self.log.append((self.name, "end", attempt, outcome))

    async def abandon(self, attempt, why):
        self.log.append((self.name, "abandon", attempt, (why.kind, why.reason, why.instance)))


def attempts(log: list, name: str = "A") -> list[list[tuple[str, object]]]:
    """The events of each attempt, in order, as ``name`` saw them."""
    by_attempt: dict[int, list] = {}
    for hook, event, attempt, detail in log:
        if hook == name:
            by_attempt.setdefault(id(attempt), []).append((event, detail))
    return list(by_attempt.values())


@contextmanager
def cluster(*backends, roles=None, **overrides):
    log: list = []
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in backends]
        roles = roles or ["mixed"] * len(backends)
        config = load_config(overrides={
            "instances": [{"url": u, "name": b.name, "role": role, "model": "m"} for u, b, role in zip(urls, backends, roles)],
            "policy": {"name": "round_robin"}, "health": {"interval_s": 60, "failures_to_unhealthy": 10}, **overrides})
        app = create_app(config, hooks=[Recorder("A", log), Recorder("B", log)])
        yield stack.enter_context(serve_app(app)), log


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def inflight(url: str, instance: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'pd_router_inflight_requests{{engine="{instance}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no inflight gauge for {instance}")


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_relayed_to_its_end(stream):
    with cluster(FakeBackend("a")) as (url, log):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": stream})
        assert r.status_code == 200
        wait_for(lambda: len(log) == 6)
        assert inflight(url, "a") == 0
    assert attempts(log) == [[("before_send", "a"), ("first_byte", "a"), ("end", "ok")]]
    assert [(hook, event) for hook, event, _, _ in log] == [  # each event to every hook, in the order given
        ("A", "before_send"), ("B", "before_send"), ("A", "first_byte"), ("B", "first_byte"), ("A", "end"), ("B", "end")]


def test_an_engine_dying_mid_stream():
    with cluster(FakeBackend("a", chunks=5, chunk_s=0.05, die_after=2)) as (url, log):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": True})
        assert r.status_code == 200 and '"code": "upstream_disconnected"' in r.text
        wait_for(lambda: any(event == "end" for _, event, _, _ in log))
        assert inflight(url, "a") == 0
    assert attempts(log) == [[("before_send", "a"), ("first_byte", "a"), ("end", "upstream_error")]]
    assert attempts(log, "B") == attempts(log)


def test_a_client_leaving_mid_stream():
    with cluster(FakeBackend("a", chunks=20, chunk_s=0.2)) as (url, log):
        with httpx.stream("POST", f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        wait_for(lambda: any(event == "end" for _, event, _, _ in log))
        assert inflight(url, "a") == 0
    assert attempts(log) == [[("before_send", "a"), ("first_byte", "a"), ("end", "client_disconnect")]]


def test_a_retry_before_the_first_byte_abandons_then_a_new_attempt_serves():
    with cluster(FakeBackend("busy", status=503), FakeBackend("good")) as (url, log):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": True})
        assert r.status_code == 200
        wait_for(lambda: any(event == "end" for _, event, _, _ in log))
        assert inflight(url, "busy") == inflight(url, "good") == 0
        text = httpx.get(f"{url}/metrics").text
        assert 'pd_router_retries_total{engine="busy",reason="503"} 1.0' in text
    assert attempts(log) == [
        [("before_send", "busy"), ("abandon", ("retry", "503", "busy"))],
        [("before_send", "good"), ("first_byte", "good"), ("end", "ok")],
    ]


def test_an_engine_error_passed_back_is_an_abandon():
    with cluster(FakeBackend("refusing", status=400)) as (url, log):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT})
        assert r.status_code == 400 and r.json()["error"]["message"] == "refusing says no"
        assert 'pd_router_requests_total{engine="refusing",model="m",outcome="http_400"} 1.0' in httpx.get(f"{url}/metrics").text
    assert attempts(log) == [[("before_send", "refusing"), ("abandon", ("passed", "http_400", "refusing"))]]


def test_a_failed_prefill_leg_abandons_and_the_decode_instance_prefills_itself():
    p, d = FakeBackend("p", status=503), FakeBackend("d")
    with cluster(p, d, roles=["prefill", "decode"], policy={"seed": 2}) as (url, log):
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": True})
        assert r.status_code == 200
        wait_for(lambda: any(event == "end" for _, event, _, _ in log))
        assert inflight(url, "d") == 0
    assert attempts(log) == [
        [("before_send", "d"), ("abandon", ("retry", "prefill_failed", "p"))],
        [("before_send", "d"), ("first_byte", "d"), ("end", "ok")],
    ]
    assert len(p.received) == 1 and "kv_transfer_params" not in d.received[0]["body"]


# -- the emitter's guarantees, without a network ---------------------------------------------

def attempt() -> Attempt:
    routed = SimpleNamespace(started=time.perf_counter())
    return Attempt("rid", routed, SimpleNamespace(id="a"))  # type: ignore[arg-type]


class Failing(Hook):
    async def end(self, attempt, outcome):
        raise RuntimeError("this hook is broken")

    async def abandon(self, attempt, why):
        raise RuntimeError("this hook is broken")


async def test_a_failing_hook_is_logged_and_the_others_still_run(caplog):
    log: list = []
    lifecycle = Lifecycle([Failing(), Recorder("A", log)])
    a = attempt()
    await lifecycle.end(a, "ok")
    assert [event for _, event, _, _ in log] == ["end"] and a.duration_s is not None
    assert "Failing.end failed on end" in caplog.text


async def test_end_and_abandon_run_once_between_them_and_first_byte_only_before():
    log: list = []
    lifecycle = Lifecycle([Recorder("A", log)])
    a = attempt()
    await lifecycle.first_byte(a)
    await lifecycle.first_byte(a)
    await lifecycle.end(a, "ok")
    await lifecycle.end(a, "client_disconnect")
    await lifecycle.abandon(a, Abandon("failed", "x", "a"))
    await lifecycle.first_byte(a)
    b = attempt()
    await lifecycle.abandon(b, Abandon("retry", "503", "a"))
    await lifecycle.end(b, "ok")
    assert [(event, detail) for _, event, _, detail in log] == [
        ("first_byte", "a"), ("end", "ok"), ("abandon", ("retry", "503", "a"))]


async def test_abandon_finishes_even_when_its_task_is_cancelled():
    done = asyncio.Event()

    class Slow(Hook):
        async def abandon(self, attempt, why):
            await asyncio.sleep(0.1)
            done.set()

    task = asyncio.create_task(Lifecycle([Slow()]).abandon(attempt(), Abandon("failed", "x", "a")))
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.wait_for(done.wait(), 1)


def test_the_engines_prompt_count_reaches_the_attempt_even_when_a_read_splits_its_event():
    """The relay hands the end of a stream to the attempt: the usage event, split over two
    reads and followed by the terminator in a third, still gives the engine's count; a JSON
    answer's body gives it too; a stream without usage gives none."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def completion(request):
        body = await request.json()
        if not body.get("stream"):
            return JSONResponse({"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 123, "completion_tokens": 1}})

        async def events():
            yield 'data: {"choices": [{"text": "a"}]}\n\n'
            if body.get("stream_options"):
                for part in ('data: {"choices": [], "usage": {"prompt_t', 'okens": 321, "total_tokens": 330}}\n\n'):
                    await asyncio.sleep(0.05)  # separate reads at the router
                    yield part
            await asyncio.sleep(0.05)
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    engine = Starlette(routes=[Route("/v1/completions", completion, methods=["POST"]), Route("/v1/models", models),
                               Route("/health", lambda r: JSONResponse({}))])
    log: list = []
    with serve_app(engine) as engine_url:
        config = load_config(overrides={"instances": [{"url": engine_url, "name": "a", "model": "m"}],
                                        "health": {"interval_s": 60}})
        with serve_app(create_app(config, hooks=[Recorder("A", log)])) as url:
            for extra in ({"stream": True, "stream_options": {"include_usage": True}}, {}, {"stream": True}):
                r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT, **extra})
                assert r.status_code == 200
            wait_for(lambda: sum(event == "end" for _, event, _, _ in log) == 3)
    ends = [attempt for _, event, attempt, _ in log if event == "end"]
    assert [a.reported_prompt_tokens for a in ends] == [321, 123, None]
    estimates = {a.estimated_prompt_tokens for a in ends}  # the same prompt each time, estimated from its characters
    assert len(estimates) == 1 and 0.2 * len(PROMPT) < estimates.pop() < 0.3 * len(PROMPT)
    assert all(a.model == "m" for a in ends)
