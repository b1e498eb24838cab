"""The router's request/response cycle (router/gateway/cycle.py): the same bytes on the wire as
uvicorn's cycle, in fewer writes, and uvicorn's checks kept."""

import asyncio
import logging

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from router.gateway.cycle import WHOLE_KEY, FastCycle


class Recorder:
    """The socket side of a cycle: each ``write`` call kept apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(kind: type[RequestResponseCycle], keep_alive: bool = True) -> tuple[RequestResponseCycle, Recorder, list[int]]:
    transport, finished = Recorder(), []
    scope = {"type": "http", "method": "POST", "http_version": "1.1", "path": "/v1/completions", "query_string": b"",
             "headers": [], "client": ("127.0.0.1", 1), "root_path": ""}
    c = kind(scope=scope, transport=transport, flow=FlowControl(transport), logger=logging.getLogger("t"),  # type: ignore[arg-type]
             access_logger=logging.getLogger("t.access"), access_log=False, default_headers=[(b"server", b"t")],
             message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
             on_response=lambda: finished.append(1))
    return c, transport, finished


JSON = [{"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]},
        {"type": "http.response.body", "body": b'{"ok":true}'}]
STREAM = [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]},
          {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
          {"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True},
          {"type": "http.response.body", "body": b"", "more_body": False}]


async def play(kind: type[RequestResponseCycle], messages, keep_alive: bool = True):
    c, transport, finished = cycle(kind, keep_alive)
    for message in messages:
        await c.send(message)
    return transport, finished


@pytest.mark.parametrize("messages", [JSON, STREAM], ids=["json", "stream"])
@pytest.mark.parametrize("keep_alive", [True, False])
async def test_same_bytes_as_uvicorn_with_the_head_in_the_first_body_write(messages, keep_alive):
    theirs, _ = await play(RequestResponseCycle, messages, keep_alive)
    ours, finished = await play(FastCycle, messages, keep_alive)
    assert b"".join(ours.writes) == b"".join(theirs.writes)
    assert len(ours.writes) == len(theirs.writes) - 1  # head and first body in one write
    assert ours.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and messages[1]["body"] in ours.writes[0]
    assert finished == [1] and ours.closed is (not keep_alive)


async def test_a_head_whose_body_does_not_follow_at_once_is_written_alone():
    c, transport, _ = cycle(FastCycle)
    await c.send(STREAM[0])
    assert transport.writes == []
    await asyncio.sleep(0)  # the app suspends before its first chunk: the client has the head meanwhile
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n")
    await c.send(STREAM[1])
    assert transport.writes[1] == b"9\r\ndata: 1\n\n\r\n"


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_a_whole_answer_is_one_write_of_the_same_bytes(keep_alive):
    theirs, _ = await play(RequestResponseCycle, JSON, keep_alive)
    c, transport, finished = cycle(FastCycle, keep_alive)
    whole = c.scope[WHOLE_KEY]
    await whole(200, JSON[0]["headers"], JSON[1]["body"])
    assert transport.writes == [b"".join(theirs.writes)]
    assert c.response_complete and finished == [1] and transport.closed is (not keep_alive)
    assert WHOLE_KEY not in c.scope  # no scope -> cycle -> scope reference cycle left for the GC
    with pytest.raises(RuntimeError):
        await whole(200, [], b"")


async def test_uvicorns_checks_hold():
    c, transport, _ = cycle(FastCycle)
    with pytest.raises(RuntimeError, match="header value"):
        await c.send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"b\r\nx-evil: 1")]})
    c, transport, _ = cycle(FastCycle)
    await c.send(JSON[0])
    with pytest.raises(RuntimeError, match="longer than Content-Length"):
        await c.send({"type": "http.response.body", "body": b"x" * 12})
    c, transport, _ = cycle(FastCycle)
    with pytest.raises(RuntimeError, match="Expected ASGI message 'http.response.start'"):
        await c.send(JSON[1])
    assert transport.writes == []


@pytest.mark.parametrize("bad, match", [((b"x-ok", b"1\x00"), "header value"), ((b"x bad", b"1"), "header name"),
                                        ((b"x-ok", b"a\nb"), "header value"), ((b"x(a)", b"1"), "header name")])
async def test_a_bad_header_anywhere_in_the_list_is_refused_and_nothing_is_written(bad, match):
    headers = [(b"content-type", b"application/json"), bad, (b"content-length", b"2")]
    c, transport, _ = cycle(FastCycle)
    with pytest.raises(RuntimeError, match=match):
        await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    c2, transport2, _ = cycle(FastCycle)
    with pytest.raises(RuntimeError, match=match):
        await c2.write_whole(200, headers, b"{}")
    assert transport.writes == transport2.writes == []
