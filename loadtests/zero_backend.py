"""A zero-work OpenAI-style backend for measuring router overhead.

Why not the emulator or ``stub_backend.py``: to see what a router *adds*, the backend must
cost (almost) nothing and must not be the bottleneck on a 2-core machine. So this is a bare
``asyncio.Protocol`` on uvloop with the httptools parser (the same C parser uvicorn uses),
keep-alive, and pre-encoded responses: no framework, no JSON decoding of the request.

Answers:
  POST /v1/completions, /v1/chat/completions  fixed small non-streaming JSON; with ``"stream": true``
                                              in the body, a fixed chunked SSE answer (4 events + [DONE])
  POST /v1/completions/render, /tokenize      fixed token ids (vllm-router's cache_aware asks)
  GET  /health, /v1/models                    200
  anything else                               404 (routers tolerate it: /server_info, ...)

One process can listen on several ports (``--port 0 --port 0``) so routers see several
"workers" without spending a core per worker. Ports are printed as ``PORTS p1,p2`` once bound.

    python loadtests/zero_backend.py --port 0 --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import httptools

_TOKENS = list(range(1, 129))


def _response(status: str, payload: object) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: keep-alive\r\n\r\n")
    return head.encode() + body


_COMPLETION = _response("200 OK", {
    "id": "cmpl-zero", "object": "text_completion", "created": 0, "model": "zero-model",
    "choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
})
_CHAT = _response("200 OK", {
    "id": "chatcmpl-zero", "object": "chat.completion", "created": 0, "model": "zero-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
})
ROUTES: dict[tuple[bytes, bytes], bytes] = {
    (b"POST", b"/v1/completions"): _COMPLETION,
    (b"POST", b"/v1/chat/completions"): _CHAT,
    (b"POST", b"/v1/completions/render"): _response("200 OK", {"token_ids": _TOKENS}),
    (b"POST", b"/tokenize"): _response("200 OK", {"tokens": _TOKENS, "count": len(_TOKENS), "max_model_len": 32768}),
    (b"GET", b"/health"): _response("200 OK", {"status": "ok"}),
    (b"GET", b"/v1/models"): _response("200 OK", {"object": "list", "data": [{"id": "zero-model", "object": "model"}]}),
}


def _sse(events: list[object]) -> bytes:
    """A chunked ``text/event-stream`` answer: one chunk per event, then ``[DONE]`` and the last chunk."""
    frames = [f"data: {json.dumps(e, separators=(',', ':'))}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    return head + chunks


def _stream_events(chat: bool) -> list[object]:
    def choice(text: str, finish: str | None) -> dict[str, object]:
        if chat:
            return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    kind = "chat.completion.chunk" if chat else "text_completion"
    events: list[object] = [{"id": "zero", "object": kind, "created": 0, "model": "zero-model",
                             "choices": [choice(t, "length" if i == 2 else None)]} for i, t in enumerate([" o", "k", "!"])]
    events.append({"id": "zero", "object": kind, "created": 0, "model": "zero-model", "choices": [],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})
    return events


STREAMS: dict[bytes, bytes] = {b"/v1/completions": _sse(_stream_events(False)),
                               b"/v1/chat/completions": _sse(_stream_events(True))}
_NOT_FOUND = _response("404 Not Found", {"error": {"message": "not found", "type": "not_found"}})


class ZeroProtocol(asyncio.Protocol):
    """One keep-alive connection: parse with httptools, answer each request on completion."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._stream = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    # httptools callbacks -------------------------------------------------------------
    def on_url(self, url: bytes) -> None:
        self._url = url
        self._stream = False

    def on_body(self, body: bytes) -> None:
        # no JSON decoding: a byte search is enough to tell a streaming request (cost stays ~0)
        if b'"stream":true' in body or b'"stream": true' in body:
            self._stream = True

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0]
        if self._transport is not None:
            answer = STREAMS.get(path) if self._stream and method == b"POST" else None
            self._transport.write(answer or ROUTES.get((method, path), _NOT_FOUND))
            if not self._parser.should_keep_alive():
                self._transport.close()


async def serve(host: str, ports: list[int]) -> None:
    """Listen on every port (0 = any free one), print the bound ports, run until signalled."""
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(ZeroProtocol, host, port, backlog=1024, reuse_address=True) for port in ports]
    bound = [s.sockets[0].getsockname()[1] for s in servers]
    print("PORTS " + ",".join(str(p) for p in bound), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, action="append", help="port to listen on (repeat; 0 = free port)")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # still correct on plain asyncio, only slower
        asyncio.run(serve(args.host, args.port or [0]))
    else:
        uvloop.run(serve(args.host, args.port or [0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
