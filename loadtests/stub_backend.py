"""A tiny OpenAI-compatible streaming server (stdlib only) to smoke-test the load test.

It is not an engine: it answers /health, /v1/models, /v1/completions and
/v1/chat/completions with made-up tokens after a fixed delay, streaming SSE when asked.

    python loadtests/stub_backend.py --port 8000 --ttft-ms 20 --itl-ms 5 --max-seconds 120
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE writes must not wait for delayed ACKs
    model = "stub-model"
    ttft_s = 0.02
    itl_s = 0.005

    def log_message(self, *_args) -> None:  # keep the console quiet
        pass

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return self._json(400, {"error": {"message": "body is not JSON"}})
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        n = max(1, int(body.get("max_tokens") or 16))
        rid = f"cmpl-{uuid.uuid4().hex[:12]}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        time.sleep(self.ttft_s)
        if not body.get("stream"):
            text = " tok" * n
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            usage = {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}
            return self._json(200, {"id": rid, "object": obj.removesuffix(".chunk"), "model": self.model,
                                    "choices": [{**choice, "finish_reason": "length"}], "usage": usage})
        try:
            self._stream(rid, obj, chat, n, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream

    def _stream(self, rid: str, obj: str, chat: bool, n: int, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n):
            if i:
                time.sleep(self.itl_s)
            piece = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
            piece["finish_reason"] = "length" if i == n - 1 else None
            self._event({"id": rid, "object": obj, "model": self.model, "choices": [piece]})
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}
            self._event({"id": rid, "object": obj, "model": self.model, "choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, payload: dict) -> None:
        self._chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class StubServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many load-test clients connect at once

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients hanging up are normal
            super().handle_error(request, client_address)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=StubHandler.model)
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="delay before the first token")
    parser.add_argument("--itl-ms", type=float, default=5.0, help="delay between tokens")
    parser.add_argument("--max-seconds", type=float, default=0, help="exit after this long (0 = run until Ctrl-C)")
    args = parser.parse_args()
    StubHandler.model, StubHandler.ttft_s, StubHandler.itl_s = args.model, args.ttft_ms / 1000, args.itl_ms / 1000
    server = StubServer((args.host, args.port), StubHandler)
    if args.max_seconds > 0:
        threading.Timer(args.max_seconds, server.shutdown).start()
    print(f"stub OpenAI server on http://{args.host}:{args.port} (model {args.model})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
