"""Precise residency against real vLLM: what a token-mode router learns from the engines' own
KV events is what their prefix caches then hit, and a block an engine evicts stops counting.

The router (fixture ``precise_router``) finds each engine's publisher through its
``/kv_event_sources``, resyncs from its replay buffer and tokenizes with the model's own
tokenizer.json. Before each request the test asks ``/debug/route`` what the router
predicts per engine; after it, the engine's ``vllm:prefix_cache_hits`` delta says what was
really reused. Nothing waits on time: each step waits until the engine's counters have
counted the request and the router has applied the batch that holds the request's blocks
(seen by the test's own subscriber, then in the router's ``/debug/kv_events``). The last
test runs the same ingestion in the sidecar process, read through its shared-memory tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from kv_frames import FrameRecorder, decode
from servers import serve_app
from vllm_rig import AUTH, BEFORE_ROUTER, BLOCK, precise_config, total
from router.gateway.app import create_app
from router.state.shared_mirror import shared_tables
from router.tools.realvllm import VllmEngine
from router.tools.tiny_model import corpus

DEADLINE_S = 30.0


def text(seed: int, chars: int) -> str:
    """Pseudo-English of the tiny tokenizer's own training distribution (~4.5 characters a token)."""
    out, size, lines = [], 0, corpus(lines=10_000, seed=seed)
    while size < chars:
        out.append(next(lines))
        size += len(out[-1]) + 1
    return " ".join(out)[:chars]


def until(what: str, probe: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """``probe()`` once it is truthy; AssertionError naming ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s}s: {what}")
        time.sleep(0.02)
    return found


def counters(client: httpx.Client, engines: list[VllmEngine]) -> list[tuple[float, float]]:
    """(prefix-cache queries, hits) per engine, in tokens."""
    return [(total(client, e, "vllm:prefix_cache_queries_total"), total(client, e, "vllm:prefix_cache_hits_total"))
            for e in engines]


def counted(client: httpx.Client, engines: list[VllmEngine], before: list[tuple[float, float]],
            prompt_tokens: int) -> tuple[int, float]:
    """(engine index, hit tokens) of the one request sent since ``before``, once counted."""
    def probe() -> tuple[int, float] | None:
        now = counters(client, engines)
        queried = [a[0] - b[0] for a, b in zip(now, before)]
        if sorted(queried) != [0, prompt_tokens]:
            return None
        served = queried.index(prompt_tokens)
        return served, now[served][1] - before[served][1]
    found: tuple[int, float] = until(f"a {prompt_tokens}-token query in the engines' counters", probe)
    return found


def blocks_stored(frames: list[list[bytes]]) -> Iterator[tuple[int, int, int | None, list[int]]]:
    """(sequence, engine hash, parent hash, the block's tokens) of every stored block."""
    for frame in frames:
        _topic, seq, batch = decode(frame)
        for event in batch[1]:
            if event.get("type") != "BlockStored":
                continue
            parent, tokens = event["parent_block_hash"], event["token_ids"]
            for j, block_hash in enumerate(event["block_hashes"]):
                yield seq, block_hash, parent, tokens[j * BLOCK:(j + 1) * BLOCK]
                parent = block_hash


def stored_at(recorder: FrameRecorder, since: int, block: list[int]) -> tuple[int, int]:
    """(sequence, engine hash) of the batch, after frame ``since``, that stored ``block``."""
    def probe() -> tuple[int, int] | None:
        return next(((seq, h) for seq, h, _p, tokens in blocks_stored(recorder.frames[since:]) if tokens == block), None)
    found: tuple[int, int] = until("the engine's BlockStored of the prompt's last full block", probe)
    return found


def removed_at(recorder: FrameRecorder, since: int, block_hash: int) -> int | None:
    for frame in recorder.frames[since:]:
        _topic, seq, batch = decode(frame)
        if any(e.get("type") == "BlockRemoved" and block_hash in e["block_hashes"] for e in batch[1]):
            return seq
    return None


def kv_source(client: httpx.Client, router: str, instance: str) -> dict[str, Any]:
    doc = client.get(f"{router}/debug/kv_events", headers=AUTH).json()
    (source,) = [s for s in doc["sources"] if s["instance"] == instance]
    return dict(source)


def applied(client: httpx.Client, router: str, instance: str, seq: int) -> None:
    """Until the router has applied ``instance``'s batch ``seq`` and is in sync."""
    def probe() -> bool:
        source = kv_source(client, router, instance)
        return bool(source["fresh"]) and source["last_sequence"] is not None and source["last_sequence"] >= seq
    until(f"the router applying batch {seq} of {instance}", probe)


def predicted(client: httpx.Client, router: str, body: dict[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    """Leading blocks the router believes each engine holds for ``body``, and its view of the request."""
    doc = client.post(f"{router}/debug/route", json=body, headers=AUTH).json()
    return {c["id"]: c["matched_blocks"] for c in doc["candidates"]}, doc["request"]


def tokenize(client: httpx.Client, engine: VllmEngine, prompt: str) -> list[int]:
    ids: list[int] = client.post(f"{engine.url}/tokenize", json={"model": "tiny", "prompt": prompt}).json()["tokens"]
    return ids


def test_residency_from_real_kv_events_predicts_the_engines_own_prefix_cache_hits(
        precise_router: str, engines: list[VllmEngine], client: httpx.Client) -> None:
    """A prefix engine 0 cached before the router started, three tenants' prefixes and their
    users' questions, then a conversation that goes on:
    for every request, the router's predicted cached blocks on the engine that served it
    are the blocks that engine's prefix cache hit (vLLM always recomputes a prompt's last
    token, so a fully cached prompt hits one block less when its length is a multiple of 128)."""
    tenants = [f"Tenant {t} handbook. " + text(100 + t, 1800) for t in range(3)] + [BEFORE_ROUTER]
    plan = [3, 0, 1, 0, 2, 1, 0, 2, 1, 0]  # first a prefix engine 0 cached before the router started
    rows: list[tuple[int, int, int, dict[str, int], float]] = []  # step, engine, tokens, predicted, hit tokens
    previous = ""
    with FrameRecorder(engines[0].kv_events_endpoint) as r0, FrameRecorder(engines[1].kv_events_endpoint) as r1:
        recorders = [r0, r1]
        for step, tenant in enumerate([*plan, -1]):
            # every prompt ends in >= 1 full block of its own, so every request stores one to wait on
            prompt = (f"{previous} Follow-up {step}: " + text(900, 700) if tenant < 0
                      else f"{tenants[tenant]} Question {step}: " + text(500 + step, 1500))
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
            ids = tokenize(client, engines[0], prompt)
            n = len(ids)
            guess, request = predicted(client, precise_router, body)
            assert (request["keys"], request["prompt_tokens"], request["blocks"]) == ("tokens", n, n // BLOCK), request
            marks = [len(r.frames) for r in recorders]
            before = counters(client, engines)
            answer = client.post(f"{precise_router}/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["prompt_tokens"] == n
            served, hits = counted(client, engines, before, n)
            rows.append((step, served, n, guess, hits))
            seq, _ = stored_at(recorders[served], marks[served], ids[(n // BLOCK - 1) * BLOCK:(n // BLOCK) * BLOCK])
            applied(client, precise_router, f"vllm{served}", seq)  # before the next prediction
            previous = prompt
    report = "\n".join(f"step {s}: vllm{e}, {n} tokens, predicted {g}, engine hit {h:.0f} tokens"
                       for s, e, n, g, h in rows)
    print(report)  # pytest -s shows it
    for _step, served, n, guess, hits in rows:
        assert hits == min(guess[f"vllm{served}"], (n - 1) // BLOCK) * BLOCK, report
    assert sum(1 for *_, hits in rows if hits > 0) >= 5, report  # tenants came back: not a test of zeros
    warm = len(tokenize(client, engines[0], BEFORE_ROUTER)) // BLOCK
    assert rows[0][1] == 0 and rows[0][4] >= warm * BLOCK, report  # known from the replay, routed to it
    assert rows[-1][4] >= (rows[-2][2] // BLOCK) * BLOCK, report  # the conversation reused its whole history


def test_a_block_the_engine_evicts_stops_counting(precise_router: str, engines: list[VllmEngine],
                                                  client: httpx.Client) -> None:
    """A prompt cached on an engine, then traffic straight to that engine (bypassing the
    router) until the engine evicts the prompt's first block: the router saw the
    BlockRemoved, predicts nothing cached there any more, and the engine's own counters
    confirm the miss."""
    engine, name = engines[0], "vllm0"
    prompt = "Eviction probe. " + text(777, 2400)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    ids = tokenize(client, engine, prompt)
    n, full = len(ids), len(ids) // BLOCK
    with FrameRecorder(engine.kv_events_endpoint) as recorder:
        mark = len(recorder.frames)
        assert client.post(f"{engine.url}/v1/completions", json=body).status_code == 200
        seq, _ = stored_at(recorder, mark, ids[(full - 1) * BLOCK:full * BLOCK])
        root = next(h for _s, h, parent, tokens in blocks_stored(recorder.frames[mark:])
                    if parent is None and tokens == ids[:BLOCK])
        applied(client, precise_router, name, seq)
        assert predicted(client, precise_router, body)[0][name] == full
        removed_before = kv_source(client, precise_router, name)["applied"]["removed_blocks"]

        for k in range(40):  # 1,000-token prompts of their own: 8 blocks each, of 64
            filler = [200 + k] + [(i * 17 + k * 31) % 2000 + 3 for i in range(999)]
            r = client.post(f"{engine.url}/v1/completions", json={"model": "tiny", "prompt": filler, "max_tokens": 1})
            assert r.status_code == 200, r.text
            if (gone := removed_at(recorder, mark, root)) is not None:
                break
        else:
            raise AssertionError("the engine never evicted the probe's first block")
        applied(client, precise_router, name, gone)
        assert predicted(client, precise_router, body)[0][name] == 0
        assert kv_source(client, precise_router, name)["applied"]["removed_blocks"] >= removed_before + full

    before = counters(client, engines)
    assert client.post(f"{engine.url}/v1/completions", json=body).status_code == 200
    served, hits = counted(client, engines, before, n)
    assert (served, hits) == (0, 0)  # the engine agrees: nothing of it was left


def test_token_mode_refuses_an_overlong_text_prompt_by_its_exact_count(precise_router: str, engines: list[VllmEngine],
                                                                        tiny_model: Path, client: httpx.Client) -> None:
    """9,000 characters of '7, ': at most 32 bytes a token, the character bound says >= 282 tokens;
    the tokenizer says thousands more than max_model_len 4096, so the precise router refuses it
    as vLLM does, and it never reaches an engine."""
    prompt = "7, " * 3000
    ids = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(prompt).ids
    counted = len(ids)
    assert counted >= 4096
    assert tokenize(client, engines[0], prompt) == ids  # vLLM's /tokenize counts it too (the emulator's does the same)

    def received() -> float:
        return sum(total(client, e, "http_requests_total", handler="/v1/completions") for e in engines)

    before = received()
    via = client.post(f"{precise_router}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert via.status_code == 400 and via.json()["error"]["code"] == "context_length_exceeded", via.text
    assert f"has {counted} tokens" in via.json()["error"]["message"]
    assert received() == before
    direct = client.post(f"{engines[0].url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert direct.status_code == 400  # as the engine itself answers


def test_the_emulator_advertises_its_kv_events_as_vllm_does(engines: list[VllmEngine], client: httpx.Client) -> None:
    """The emulator's GET /kv_event_sources has the real engine's shape (the router's discovery
    is tested against the emulator, so the two must not drift)."""
    from router.tools.emulator.config import EmulatorConfig
    from router.tools.emulator.launch import start_in_thread

    real = client.get(f"{engines[0].url}/kv_event_sources").json()
    with start_in_thread(EmulatorConfig(model="tiny", kv_events_endpoint="tcp://*:0", kv_events_topic="kv",
                                        kv_events_replay_endpoint="tcp://*:0")) as emulator:
        emulated = client.get(f"{emulator.url}/kv_event_sources").json()
    assert list(real) == list(emulated) == ["0"]
    wanted = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "topic"}
    assert wanted <= set(real["0"]) and wanted <= set(emulated["0"])
    for key in ("enable_kv_cache_events", "publisher", "topic"):
        assert real["0"][key] == emulated["0"][key]
    assert all(a["endpoint"].startswith("tcp://*:") for a in (real["0"], emulated["0"]))


@pytest.fixture
def sidecar_router(engines: list[VllmEngine], tiny_model: Path) -> Iterator[str]:
    """``precise_router``'s configuration with ingestion in the sidecar process, whose
    tables the loop reads in shared memory (the default with the sidecar on Linux)."""
    config = precise_config(engines, tiny_model, sidecar=True)
    with serve_app(create_app(config)) as url, httpx.Client(trust_env=False, timeout=60) as client:
        until("both engines' residency fresh through the sidecar", lambda: {
            s["instance"] for s in client.get(f"{url}/debug/kv_events", headers=AUTH).json()["sources"] if s["fresh"]
        } == {"vllm0", "vllm1"}, timeout_s=60)
        yield url


def test_real_kv_events_reach_decisions_through_the_sidecars_shared_tables(
        sidecar_router: str, engines: list[VllmEngine], client: httpx.Client) -> None:
    """A prompt sent straight to engine 1: its blocks reach the router through the sidecar's
    shared-memory tables, the router predicts them all on engine 1 and none on engine 0,
    routes the prompt there, and the engine's own counters hit what was predicted."""
    doc = client.get(f"{sidecar_router}/debug/kv_events", headers=AUTH).json()
    assert doc["mirror"] == shared_tables() == "shared", doc["mirror"]
    prompt = "Sidecar probe. " + text(4242, 2400)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    ids = tokenize(client, engines[1], prompt)
    n, full = len(ids), len(ids) // BLOCK
    with FrameRecorder(engines[1].kv_events_endpoint) as recorder:
        mark = len(recorder.frames)
        assert client.post(f"{engines[1].url}/v1/completions", json=body).status_code == 200  # bypassing the router
        seq, _ = stored_at(recorder, mark, ids[(full - 1) * BLOCK:full * BLOCK])
    applied(client, sidecar_router, "vllm1", seq)
    guess, _request = predicted(client, sidecar_router, body)
    assert (guess["vllm1"], guess["vllm0"]) == (full, 0), guess
    before = counters(client, engines)
    answer = client.post(f"{sidecar_router}/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    served, hits = counted(client, engines, before, n)
    assert (served, hits) == (1, min(full, (n - 1) // BLOCK) * BLOCK)
