"""OpenAI-compatible endpoints: completions, chat, models, tokenize, health.

Why it looks like this: a router cannot tell the emulator from vLLM/SGLang
only if the wire format matches (SSE ``data:`` chunks, ``[DONE]``, usage with
``prompt_tokens_details.cached_tokens``, OpenAI error bodies). Each handler
applies faults first, validates, lets the PD leg prepare, submits to the
engine driver, then streams or collects the tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from router import __version__
from router.tools.emulator.driver import RequestStream
from router.tools.emulator.faults import ConnectionDropped, stall
from router.tools.emulator.openai_render import DONE, Renderer, usage_dict
from router.tools.emulator.openai_schema import ApiError, bad_request, parse_generation
from router.tools.emulator.pd import plan_leg
from router.tools.emulator.pd_common import Leg
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.runtime import EmulatorRuntime

Kind = Literal["completion", "chat"]


def _runtime(request: Request) -> EmulatorRuntime:
    runtime: EmulatorRuntime = request.app.state.runtime
    return runtime


def _parse_json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        raise bad_request("request body is not valid JSON") from None


def _error(rt: EmulatorRuntime, exc: ApiError, headers: dict[str, str] | None = None
           ) -> JSONResponse:
    if exc.status >= 500:
        rt.stats.http.server_errors += 1
    else:
        rt.stats.http.client_errors += 1
    return exc.response(headers)


async def _generate(http: Request, kind: Kind) -> Response:
    rt = _runtime(http)
    rt.faults.crash_if_armed()
    rt.stats.http.generation_requests += 1
    if rt.faults.should_error():
        rt.stats.http.injected_errors += 1
        return _error(rt, ApiError(503, "injected fault: engine unavailable",
                                   "ServiceUnavailableError"))
    raw = await http.body()  # read first: polling for disconnects consumes it
    stall_s = rt.faults.stall_duration()
    if stall_s is not None:
        rt.stats.http.injected_stalls += 1
        await stall(stall_s, http.is_disconnected)
    external_id = http.headers.get("x-request-id") or uuid.uuid4().hex
    leg: Leg | None = None
    requests: list[EngineRequest] = []
    try:
        gen = parse_generation(_parse_json(raw), kind, rt.tokenizer, rt.limits)
        for prompt in gen.prompts:
            if not rt.engine.can_ever_fit(len(prompt), gen.max_tokens):
                raise bad_request(
                    f"{len(prompt)} prompt + {gen.max_tokens} output tokens exceed the "
                    f"KV cache ({rt.engine.kv.num_blocks * rt.engine.kv.block_size} "
                    "tokens)", "max_tokens")
        leg = plan_leg(rt, gen)
        requests = [EngineRequest(rt.next_request_id(), p, gen.max_tokens,
                                  sample_key=rt.sampler.request_key(p), tag=external_id)
                    for p in gen.prompts]
        await leg.prepare(requests)
        await rt.lookup_store(requests)
        streams = [rt.driver.submit(r) for r in requests]
    except ApiError as exc:
        if leg is not None:
            leg.abort(requests)
        return _error(rt, exc, leg.headers if leg is not None else None)
    except ValueError as exc:
        if leg is not None:
            leg.abort(requests)
        return _error(rt, bad_request(str(exc)))

    prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
    renderer = Renderer(kind, prefix + external_id, int(time.time()), rt.model, rt.sampler)
    headers = {"x-request-id": external_id, "x-emulator-engine-id": rt.engine_id,
               **leg.headers}
    drop_after = rt.faults.drop_after()
    if gen.stream:
        body = _sse(rt, renderer, streams, leg, gen.include_usage, kind, drop_after)
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    return await _unless_disconnected(http, _collect(rt, renderer, streams, leg, drop_after, headers))


async def _unless_disconnected(http: Request, work: Awaitable[Response]) -> Response:
    """As vLLM: a client that goes away before a JSON answer aborts its generation."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()  # _collect's finally aborts the requests
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return Response(status_code=499)
    return task.result()


def _abort_all(rt: EmulatorRuntime, streams: list[RequestStream], leg: Leg) -> None:
    for stream in streams:
        rt.driver.abort(stream.request.request_id)
    leg.abort([s.request for s in streams])


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, list[int]]]:
    """(choice index, new tokens) as they arrive, across all choices."""
    if len(streams) == 1:
        stream = streams[0]
        while tokens := await stream.next_tokens():
            yield 0, tokens
        return
    pending = {asyncio.ensure_future(s.next_tokens()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                index = pending.pop(fut)
                tokens = fut.result()
                if tokens:
                    pending[asyncio.ensure_future(streams[index].next_tokens())] = index
                    yield index, tokens
    finally:
        for fut in pending:
            fut.cancel()


async def _sse(rt: EmulatorRuntime, renderer: Renderer, streams: list[RequestStream],
               leg: Leg, include_usage: bool, kind: Kind, drop_after: int
               ) -> AsyncIterator[bytes]:
    completed = False
    # As vLLM, a chat stream's assistant-role delta goes out with its first token, not before:
    # anything earlier would be a first byte that says nothing about TTFT.
    opened: set[int] = set() if kind == "chat" else set(range(len(streams)))
    # With a shared store, a single stream writes its generated blocks every few blocks, so
    # that a session moving to another engine finds them there (session migration).
    write_every = rt.config.kv_store_write_blocks if rt.kv_store is not None and len(streams) == 1 else 0
    sequence = list(streams[0].request.prompt) if write_every else []
    written = len(sequence) // rt.engine.config.block_size
    try:
        sent = 0
        async for index, tokens in _merged(streams):
            if write_every:
                sequence.extend(tokens)
                if len(sequence) // rt.engine.config.block_size - written >= write_every:
                    written = rt.write_store(sequence)
            if index not in opened:
                opened.add(index)
                yield renderer.role_chunk(index)
            if 0 <= drop_after <= sent + len(tokens):
                keep = tokens[: drop_after - sent]
                if keep:
                    yield renderer.token_chunks(index, keep)
                rt.stats.http.injected_drops += 1
                raise ConnectionDropped(f"injected drop after {drop_after} tokens")
            sent += len(tokens)
            yield renderer.token_chunks(index, tokens)
        requests = [s.request for s in streams]
        extra = await leg.finalize(requests)
        for index, request in enumerate(requests):
            last = index == len(requests) - 1
            yield renderer.final_chunk(index, request.finish_reason or "abort",
                                       extra if last else None)
        if include_usage:
            yield renderer.usage_chunk(usage_dict(requests))
        yield DONE
        completed = True
    finally:
        if not completed:
            _abort_all(rt, streams, leg)


async def _collect(rt: EmulatorRuntime, renderer: Renderer, streams: list[RequestStream],
                   leg: Leg, drop_after: int, headers: dict[str, str]) -> Response:
    outputs: list[list[int]] = [[] for _ in streams]
    completed = False
    try:
        count = 0
        async for index, tokens in _merged(streams):
            outputs[index].extend(tokens)
            count += len(tokens)
            if 0 <= drop_after <= count:
                _abort_all(rt, streams, leg)
                completed = True
                rt.stats.http.injected_drops += 1
                return StreamingResponse(_dropping_body(), media_type="application/json",
                                         headers=headers)
        extra = await leg.finalize([s.request for s in streams])
        completed = True
    finally:
        if not completed:
            _abort_all(rt, streams, leg)
    body = renderer.full_response(outputs, [s.request for s in streams], extra)
    return JSONResponse(body, headers=headers)


async def _dropping_body() -> AsyncIterator[bytes]:
    yield b'{"id":"'
    raise ConnectionDropped("injected drop of a non-streaming response")


async def completions(request: Request) -> Response:
    return await _generate(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _generate(request, "chat")


async def models(request: Request) -> Response:
    rt = _runtime(request)
    return JSONResponse({"object": "list", "data": [{
        "id": rt.model, "object": "model", "created": int(time.time()),
        "owned_by": rt.config.flavor, "root": rt.model, "parent": None,
        "max_model_len": rt.max_model_len, "permission": []}]})


async def tokenize(request: Request) -> Response:
    rt = _runtime(request)
    try:
        body = _parse_json(await request.body())
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        if "messages" in body:
            kind: Kind = "chat"
        elif isinstance(body.get("prompt"), str):
            kind = "completion"
        else:
            raise bad_request("give either prompt (a string) or messages", "prompt")
        probe = {k: v for k, v in body.items() if k in ("model", "prompt", "messages")}
        # as vLLM 0.32: /tokenize counts a prompt of any length (only generation checks max_model_len)
        unbounded = dataclasses.replace(rt.limits, max_model_len=2**31 - 1)
        gen = parse_generation({**probe, "max_tokens": 1}, kind, rt.tokenizer, unbounded)
    except ApiError as exc:
        return _error(rt, exc)
    tokens = gen.prompts[0]
    if kind == "completion" and body.get("add_special_tokens") is False:
        tokens = tokens[1:]
    return JSONResponse({"count": len(tokens), "max_model_len": rt.max_model_len,
                         "tokens": tokens, "token_strs": None})


async def health(request: Request) -> Response:
    rt = _runtime(request)
    if rt.faults.config.unhealthy:
        return Response(status_code=503)
    return Response(status_code=200)


async def kv_event_sources(request: Request) -> Response:
    """Where this engine publishes KV events (vLLM 0.32: configs keyed by DP rank, {} when off)."""
    publisher = _runtime(request).kv_events
    return JSONResponse(publisher.sources() if publisher is not None else {})


async def version(request: Request) -> Response:
    return JSONResponse({"version": f"emulator-{__version__}"})


def routes() -> list[Route]:
    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/kv_event_sources", kv_event_sources, methods=["GET"]),
    ]
