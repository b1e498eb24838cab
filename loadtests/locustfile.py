"""Locust load test for an OpenAI-compatible endpoint (pd-router or an engine directly).

Workload: the "shared prefix" shape, from ``router.tools.shared_prefix`` (the generator the
demo and the replay use too). GROUPS groups each own a long system prompt; each group has
PROMPTS_PER_GROUP distinct questions. A request is one group's system prompt followed by
one of its questions, so requests in a group share a long prefix that a cache-aware router
can reuse. Text is seeded random words (about one token per word), so the same settings
always produce the same prompts; each user walks every (group, question) pair in an order
of its own.

Every request streams. Locust records, per request:
  * the request itself (POST /v1/completions or /v1/chat/completions), timed to the end
    of the stream; it fails on a non-200 status, an error chunk, no content or no [DONE];
  * "ttft": time from sending to the first SSE data chunk carrying text;
  * "tpot": mean time per output token after the first (when more than one token).
Output tokens are taken from the stream's usage block when the server sends one, else
counted as content chunks; a total and tokens/s are logged when the test stops.

Environment variables (default):
  PDR_LT_GROUPS=8              number of shared-prefix groups
  PDR_LT_PROMPTS_PER_GROUP=16  distinct questions per group
  PDR_LT_SYSTEM_PROMPT_LEN=1024  shared prefix length, in words (~tokens)
  PDR_LT_QUESTION_LEN=128      question length, in words (~tokens)
  PDR_LT_OUTPUT_LEN=64         max_tokens per request
  PDR_LT_SEED=1                seed for the prompts and each user's request order
  PDR_LT_MODEL=                model name; empty = first id from GET /v1/models
  PDR_LT_CHAT_RATIO=0          fraction of requests sent to /v1/chat/completions
  PDR_LT_IGNORE_EOS=1          send ignore_eos (vLLM/SGLang) so outputs reach max_tokens
  PDR_LT_USAGE=1               ask for stream_options.include_usage
  PDR_LT_THINK_S=0             pause between a user's requests, seconds
  PDR_LT_TIMEOUT_S=300         per-request timeout, seconds
  PDR_LT_API_KEY=              sent as "Authorization: Bearer ..." when set

Run: locust -f loadtests/locustfile.py --headless -u 32 -r 8 -t 30s \
         --host http://127.0.0.1:8080 --csv out/run
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path

from locust import HttpUser, constant, events, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, not only installed

from router.tools.shared_prefix import SharedPrefix  # noqa: E402

log = logging.getLogger("pd-router-loadtest")


def _env(name: str, default, cast=str):
    raw = os.environ.get(f"PDR_LT_{name}")
    if raw is None or raw == "":
        return default
    if cast is bool:
        return raw.strip().lower() not in ("0", "false", "no", "off")
    return cast(raw)


GROUPS = _env("GROUPS", 8, int)
PROMPTS_PER_GROUP = _env("PROMPTS_PER_GROUP", 16, int)
SYSTEM_PROMPT_LEN = _env("SYSTEM_PROMPT_LEN", 1024, int)
QUESTION_LEN = _env("QUESTION_LEN", 128, int)
OUTPUT_LEN = _env("OUTPUT_LEN", 64, int)
SEED = _env("SEED", 1, int)
MODEL = _env("MODEL", "")
CHAT_RATIO = _env("CHAT_RATIO", 0.0, float)
IGNORE_EOS = _env("IGNORE_EOS", True, bool)
USAGE = _env("USAGE", True, bool)
THINK_S = _env("THINK_S", 0.0, float)
TIMEOUT_S = _env("TIMEOUT_S", 300.0, float)
API_KEY = _env("API_KEY", "")

WORKLOAD = SharedPrefix(GROUPS, PROMPTS_PER_GROUP, SYSTEM_PROMPT_LEN, QUESTION_LEN, SEED)
TEXTS = WORKLOAD.texts()
_user_ids = itertools.count()
_model_lock = threading.Lock()
_model: str | None = MODEL or None
_totals = {"requests": 0, "tokens": 0}


@events.test_start.add_listener
def _on_start(environment, **_kw):
    _totals.update(requests=0, tokens=0, started=time.monotonic())


@events.test_stop.add_listener
def _on_stop(environment, **_kw):
    elapsed = max(time.monotonic() - _totals.get("started", time.monotonic()), 1e-9)
    log.info(
        "shared-prefix load: %d ok streams, %d output tokens, %.1f output tokens/s",
        _totals["requests"], _totals["tokens"], _totals["tokens"] / elapsed,
    )


class SharedPrefixUser(HttpUser):
    """One closed-loop client walking a seeded random order of all (group, question) pairs."""

    wait_time = constant(THINK_S)

    def on_start(self) -> None:
        runner = self.environment.runner
        worker = getattr(runner, "worker_index", 0) or 0
        uid = next(_user_ids) + 100_000 * worker
        self._order = WORKLOAD.rotation(uid)
        self._rng = random.Random(SEED * 1_000_003 + uid)  # chat or completion, per request
        self._headers = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
        self._model = self._discover_model()

    def _discover_model(self) -> str:
        global _model
        with _model_lock:
            if _model is None:
                _model = "default"
                try:
                    resp = self.client.get("/v1/models", headers=self._headers, name="/v1/models", timeout=30)
                    data = resp.json().get("data") or []
                    if data:
                        _model = data[0]["id"]
                except Exception as exc:  # noqa: BLE001 - fall back to a placeholder name
                    log.warning("could not list models (%s); using %r", exc, _model)
            return _model

    @task
    def shared_prefix_request(self) -> None:
        pair = next(self._order)
        chat = self._rng.random() < CHAT_RATIO
        body: dict = {"model": self._model, "max_tokens": OUTPUT_LEN, "stream": True, "temperature": 0}
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = TEXTS.messages(pair)
        else:
            path = "/v1/completions"
            body["prompt"] = TEXTS.prompt(pair)
        if IGNORE_EOS:
            body["ignore_eos"] = True
        if USAGE:
            body["stream_options"] = {"include_usage": True}
        self._stream(path, body, chat)

    def _stream(self, path: str, body: dict, chat: bool) -> None:
        start = time.perf_counter()
        ttft = None
        chunks = 0
        usage_tokens = None
        done = False
        error = None
        with self.client.post(
            path, json=body, headers=self._headers, stream=True, catch_response=True, timeout=TIMEOUT_S
        ) as resp:
            try:
                if resp.status_code != 200:
                    detail = getattr(resp, "error", None) or resp.text or ""  # .error: connection failures
                    error = f"HTTP {resp.status_code}: {str(detail)[:200]}"
                else:
                    for line in resp.iter_lines(decode_unicode=True):
                        if not line or not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True  # keep reading to the end so the connection is reused
                            continue
                        if done:
                            continue
                        event = json.loads(data)
                        if "error" in event:
                            error = f"error chunk: {json.dumps(event['error'])[:200]}"
                            break
                        if event.get("usage"):
                            usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
                        for choice in event.get("choices") or []:
                            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                            if text:
                                chunks += 1
                                if ttft is None:
                                    ttft = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001 - a broken stream is a failed request
                error = f"stream broken: {type(exc).__name__}: {exc}"
            total = time.perf_counter() - start
            if error is None and ttft is None:
                error = "no content in stream"
            if error is None and not done:
                error = "stream ended without [DONE]"
            tokens = usage_tokens if usage_tokens is not None else chunks
            resp.request_meta["response_time"] = total * 1000  # the whole stream, not just headers
            resp.request_meta["response_length"] = tokens  # output tokens, shown as "size"
            if error:
                resp.failure(error)
                return
            resp.success()

        suffix = " (chat)" if chat else ""
        fire = self.environment.events.request.fire
        fire(request_type="SSE", name="ttft" + suffix, response_time=ttft * 1000, response_length=0,
             exception=None, context={})
        if tokens > 1:
            fire(request_type="SSE", name="tpot" + suffix, response_time=(total - ttft) * 1000 / (tokens - 1),
                 response_length=0, exception=None, context={})
        _totals["requests"] += 1
        _totals["tokens"] += tokens
