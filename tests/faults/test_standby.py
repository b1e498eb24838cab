"""Warm standby (kv_store.standby): a long stream's backup decode instance loads the prompt's KV
from the store once the first token arrived, so a migration after a decode death loads only the
generated tail; short prompts get none; a failing warm never touches the stream; warms are bounded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from faults.conftest import router, stats  # type: ignore[import-not-found]
from test_continuation import stream  # type: ignore[import-not-found]

from router.tools.emulator import FaultConfig

PREFIX = "You are the dispatcher of a parcel service; answer briefly and precisely. " * 60  # ~800 tokens
SCALE = 0.3  # slow enough that a warm finishes well within the 40 tokens before the drop


def warms(url: str) -> list[dict[str, Any]]:
    return [r for r in stats(url)["recent"] if (r["client_request_id"] or "").endswith("-standby")]


def standby_counts(url: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("pd_router_standby_warms_total{"):
            result = line.split('result="')[1].split('"')[0]
            counts[result] = float(line.rsplit(" ", 1)[1])
    return counts


def cluster(emulators, kv_store, decode_faults: dict[str, FaultConfig], decodes: int = 3, **fields: Any):
    base = {"flavor": "vllm", "kv_store_url": kv_store.url, "kv_store_write_blocks": 1, "time_scale": SCALE, **fields}
    engines = {"p0": emulators(role="prefill", engine_id="p0", **base)}
    for i in range(decodes):
        name = f"d{i}"
        engines[name] = emulators(role="decode", engine_id=name, faults=decode_faults.get(name, FaultConfig()), **base)
    instances = [{"url": e.url, "name": n, "role": "prefill" if n == "p0" else "decode", "flavor": "vllm", "model": "m"}
                 for n, e in engines.items()]
    return engines, instances


def until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.02)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_the_backup_is_warmed_and_then_takes_the_session_after_a_kill(emulators, kv_store, backend, request):
    reference = emulators()
    engines, instances = cluster(emulators, kv_store, {"d0": FaultConfig(die_after_tokens=40)})
    standby = {"enabled": True, "min_prompt_tokens": 256}
    state = {} if backend == "memory" else {
        "state": {"backend": "redis", "redis_url": request.getfixturevalue("redis_url"),
                  "key_prefix": request.getfixturevalue("key_prefix")}}
    with router(instances, kv_store={"enabled": True, "standby": standby}, **state) as (url, _):
        for i in range(10):
            body = {"model": "m", "prompt": f"{PREFIX} Parcel {i}: where is it now?", "max_tokens": 60}
            expected, _, _, _ = stream(reference.url, body)
            before = {n: stats(engines[n].url) for n in ("d1", "d2")}
            got, done, _, error = stream(url, body)
            assert not error and done == 1 and got == expected
            if stats(engines["d0"].url)["http"]["injected_drops"]:
                break
        else:
            pytest.fail("no stream went to the dying decode instance")
        new_warms = {n: [r for r in warms(engines[n].url) if r not in before[n]["recent"]] for n in ("d1", "d2")}
        prompt_tokens = min(r["prompt_tokens"] for rs in new_warms.values() for r in rs)  # the prompt itself
        # the peers warmed with the prompt (the continued stream's re-armed warm, of the prompt plus the 40
        # tokens so far, may also reach the other peer before it is cancelled, on a loaded host)
        warmed = [n for n, rs in new_warms.items() if any(r["prompt_tokens"] < prompt_tokens + 20 for r in rs)]
        assert len(warmed) == 1, "exactly one backup is warmed per session"
        backup = warmed[0]
        other = "d2" if backup == "d1" else "d1"
        after = stats(engines[backup].url)
        continuation = after["recent"][-1]
        assert not (continuation["client_request_id"] or "").endswith("-standby")
        assert continuation["prompt_tokens"] > warms(engines[backup].url)[-1]["prompt_tokens"]  # prompt + 40 generated
        # the backup held the prompt: the continuation found it cached and loaded at most the generated tail
        assert continuation["cached_tokens"] >= warms(engines[backup].url)[-1]["prompt_tokens"] - 16
        loaded = after["store"]["loaded_tokens"] - before[backup]["store"]["loaded_tokens"]
        assert loaded <= warms(engines[backup].url)[-1]["prompt_tokens"] + 40 + 16  # the warm's load and the tail only
        # the other peer served nothing of it; it may have begun the continued stream's re-armed warm
        # (prompt + text so far), cancelled when the stream ended
        extra = [r for r in stats(engines[other].url)["recent"] if r not in before[other]["recent"]]
        assert all(r["client_request_id"].endswith("-standby") and r["prompt_tokens"] > continuation["prompt_tokens"] - 16
                   for r in extra), extra
        assert standby_counts(url).get("ok", 0) >= 1


def test_short_prompts_get_no_standby(emulators, kv_store):
    engines, instances = cluster(emulators, kv_store, {}, decodes=2)
    standby = {"enabled": True, "min_prompt_tokens": 4096}
    with router(instances, kv_store={"enabled": True, "standby": standby}) as (url, _):
        for i in range(4):
            _, done, _, error = stream(url, {"model": "m", "prompt": f"{PREFIX} Parcel {i}?", "max_tokens": 20})
            assert not error and done == 1
        time.sleep(0.3)
        assert not any(warms(engines[n].url) for n in ("d0", "d1"))
        assert standby_counts(url).get("started", 0) == 0


def test_a_failing_warm_never_affects_the_stream(emulators, kv_store):
    reference = emulators()
    # d1 answers every request 503: streams end up on d0 (a 503 before the first byte is retried), and
    # d1, d0's only peer, is every session's backup, whose warm fails. A warm still in flight when its
    # stream ends is cancelled instead: at time scale 1 the 150 tokens take ~1 s, long enough for the
    # 503 to come back first on a loaded host (30 tokens at 0.3, ~0.06 s, were not)
    _, instances = cluster(emulators, kv_store, {"d1": FaultConfig(error_rate=1.0)}, decodes=2, time_scale=1.0)
    standby = {"enabled": True, "min_prompt_tokens": 256}
    with router(instances, kv_store={"enabled": True, "standby": standby}) as (url, _):
        for i in range(3):
            body = {"model": "m", "prompt": f"{PREFIX} Parcel {i}: where?", "max_tokens": 150}
            expected, _, _, _ = stream(reference.url, body)
            got, done, _, error = stream(url, body)
            assert not error and done == 1 and got == expected
            until(lambda n=i + 1: sum(standby_counts(url).get(r, 0) for r in ("ok", "failed", "cancelled", "timeout")) >= n)
        assert standby_counts(url).get("failed", 0) == 3, standby_counts(url)
        assert standby_counts(url).get("ok", 0) == 0
        # a session of one of those prompts again (its failed warm's residency taken back) still completes
        got, done, _, error = stream(url, {"model": "m", "prompt": f"{PREFIX} Parcel 0: where?", "max_tokens": 30})
        assert not error and done == 1


async def _concurrent_streams(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, bool]:
        tokens, done = 0, False
        async with client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                done = done or line == "data: [DONE]"
                tokens += line.startswith("data: {") and '"text": ""' not in line
        return tokens, done

    async with httpx.AsyncClient(timeout=60) as client:
        return list(await asyncio.gather(*(one(client, b) for b in bodies)))


def test_warms_in_flight_are_bounded_and_cancelled_with_their_stream(emulators, kv_store):
    # every decode request (a PD decode leg or a warm) stalls 1.5 s before its engine answers: three
    # streams reach their first token within a few ms of each other, while the first one's warm stalls
    stalled = FaultConfig(stall_rate=1.0, stall_seconds=1.5)
    _, instances = cluster(emulators, kv_store, {"d0": stalled, "d1": stalled}, decodes=2)
    standby = {"enabled": True, "min_prompt_tokens": 256, "max_in_flight": 1}
    with router(instances, kv_store={"enabled": True, "standby": standby}) as (url, _):
        bodies = [{"model": "m", "prompt": f"{PREFIX} Parcel {i}: where?", "max_tokens": 100} for i in range(3)]
        results = asyncio.run(_concurrent_streams(url, bodies))
        assert all(done for _, done in results)
        counts = standby_counts(url)
        assert counts.get("started", 0) == 1 and counts.get("busy", 0) == 2
        # the warm was still stalled when its stream ended: cancelled with it, nothing left in flight
        until(lambda: standby_counts(url).get("cancelled", 0) == 1)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_continued_stream_gets_a_new_backup_that_a_second_failure_finds_warm(emulators, kv_store, backend, request):
    # every decode instance drops its streams after 30 tokens: a 75-token session breaks on its first
    # instance, continues on its backup, breaks there too, and ends on the third instance, which the
    # re-armed standby warmed with the prompt plus the first 30 tokens after the first failure
    reference = emulators()
    dying = FaultConfig(die_after_tokens=30)
    # time scale 1: 30 tokens take ~0.2 s, ample for a warm to finish before the next break on a loaded host
    engines, instances = cluster(emulators, kv_store, {n: dying for n in ("d0", "d1", "d2")}, time_scale=1.0)
    standby = {"enabled": True, "min_prompt_tokens": 256}
    state = {} if backend == "memory" else {
        "state": {"backend": "redis", "redis_url": request.getfixturevalue("redis_url"),
                  "key_prefix": request.getfixturevalue("key_prefix")}}
    decodes = ("d0", "d1", "d2")
    with router(instances, kv_store={"enabled": True, "standby": standby}, **state) as (url, _):
        body = {"model": "m", "prompt": f"{PREFIX} Parcel 7: where is it now?", "max_tokens": 75}
        expected, _, _, _ = stream(reference.url, body)
        got, done, _, error = stream(url, body)
        assert not error and done == 1 and got == expected
        assert sum(stats(engines[n].url)["http"]["injected_drops"] for n in decodes) == 2
        warmed = {n: warms(engines[n].url) for n in decodes}
        first = [n for n in decodes if not warmed[n]]
        assert len(first) == 1, f"the first instance is nobody's backup: {warmed}"
        backup, rearmed = sorted((n for n in decodes if warmed[n]), key=lambda n: warmed[n][0]["prompt_tokens"])
        assert len(warmed[backup]) == len(warmed[rearmed]) == 1
        # the new backup was warmed with the prompt plus the text the first instance streamed
        assert warmed[rearmed][0]["prompt_tokens"] >= warmed[backup][0]["prompt_tokens"] + 30 - 2
        last = [r for r in stats(engines[rearmed].url)["recent"] if r not in warmed[rearmed]][-1]
        assert last["prompt_tokens"] >= warmed[rearmed][0]["prompt_tokens"] + 30 - 2  # the second continuation
        assert last["cached_tokens"] >= warmed[rearmed][0]["prompt_tokens"] - 16  # found warm
        counts = standby_counts(url)
        # the second continuation has no peer left (the two it broke on are excluded): no third backup
        assert counts.get("started") == 1 and counts.get("rearmed") == 1 and counts.get("no_backup") == 1
