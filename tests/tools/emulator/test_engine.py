"""The scheduler in virtual time: deterministic TTFT, batching, KV limits, PD."""

from __future__ import annotations

import random

import pytest

from router.tools.emulator import EmulatorConfig
from router.tools.emulator.build import build_engine
from router.tools.emulator.engine import Engine
from router.tools.emulator.request import EngineRequest, EventKind, RequestStatus
from router.tools.emulator.vclock import run_virtual


def make_engine(**fields: object) -> Engine:
    return build_engine(EmulatorConfig(**fields)).engine  # type: ignore[arg-type]


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100_000) for _ in range(n)]


def test_ttft_falls_with_cached_prefix_length() -> None:
    base = tokens(8192, seed=1)
    ttfts: list[float] = []
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        engine = make_engine()
        shared = int(8192 * fraction)
        if shared:
            run_virtual(engine, [(0.0, EngineRequest("warm", base[:shared], 1))])
        probe = EngineRequest("probe", base, 1)
        run_virtual(engine, [(0.0, probe)])
        assert probe.num_cached == min(shared, 8191) // 16 * 16
        assert probe.ttft is not None
        ttfts.append(probe.ttft)
    assert all(a > b for a, b in zip(ttfts, ttfts[1:])), ttfts
    assert ttfts[-1] < ttfts[0] / 10  # a full hit skips almost all of it


def test_ttft_grows_with_queue_depth() -> None:
    def last_ttft(depth: int) -> float:
        engine = make_engine(max_batched_tokens=2048)
        reqs = [EngineRequest(f"r{i}", tokens(2048, seed=i), 4) for i in range(depth)]
        run_virtual(engine, [(0.0, r) for r in reqs])
        assert all(r.ttft is not None for r in reqs)
        return reqs[-1].ttft  # type: ignore[return-value]

    depths = [last_ttft(d) for d in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(depths, depths[1:])), depths
    assert depths[-1] > 6 * depths[0]


def test_chunked_prefill_respects_budget_and_decodes_batch() -> None:
    engine = make_engine(max_batched_tokens=1000)
    long = EngineRequest("long", tokens(2500, seed=3), 3)
    engine.add_request(long, 0.0)
    shapes = []
    now = 0.0
    while engine.has_work():
        out = engine.step(now)
        now += out.duration
        shapes.append(out.shape.prefill_tokens)
    assert shapes[:3] == [1000, 1000, 500]
    assert long.num_output == 3 and long.status is RequestStatus.FINISHED

    engine = make_engine()
    reqs = [EngineRequest(f"d{i}", tokens(64, seed=i), 5) for i in range(10)]
    for r in reqs:
        engine.add_request(r, 0.0)
    first = engine.step(0.0)
    assert first.shape.prefill_tokens == 640
    assert sum(e.kind is EventKind.FIRST_TOKEN for e in first.events) == 10
    second = engine.step(first.duration)
    assert second.shape.decode_seqs == 10


def test_events_and_output_are_deterministic() -> None:
    def run() -> list[tuple[int, str, int, int]]:
        engine = make_engine(seed=5)
        engine.add_request(EngineRequest("a", tokens(40, seed=9), 6, sample_key=123), 0.0)
        events = []
        now = 0.0
        while engine.has_work():
            out = engine.step(now)
            now += out.duration
            events += [tuple(e) for e in out.events]
        return events  # type: ignore[return-value]

    events = run()
    assert events == run()
    kinds = [e[0] for e in events]
    assert kinds == [EventKind.FIRST_TOKEN] + [EventKind.TOKEN] * 5 + [EventKind.FINISHED]
    assert [e[2] for e in events[:-1]] == list(range(6))


def test_requests_wait_when_kv_is_full() -> None:
    engine = make_engine(cache_tokens=64 * 16)  # 64 blocks
    a = EngineRequest("a", tokens(600, seed=1), 100)   # ~44 blocks with output
    b = EngineRequest("b", tokens(600, seed=2), 100)
    run_virtual(engine, [(0.0, a), (0.0, b)])
    assert b.schedule_time is not None and a.finish_time is not None
    assert b.schedule_time >= a.finish_time  # b could only start once a left
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request(EngineRequest("huge", tokens(2000, seed=3), 1), 0.0)


def test_eviction_under_capacity_pressure() -> None:
    engine = make_engine(cache_tokens=40 * 16)
    first = tokens(320, seed=1)   # 20 blocks
    run_virtual(engine, [(0.0, EngineRequest("a", first, 1))])
    run_virtual(engine, [(0.0, EngineRequest("b", tokens(480, seed=2), 1))])
    again = EngineRequest("a2", first, 1)
    run_virtual(engine, [(0.0, again)])
    assert engine.kv.evictions > 0
    assert again.num_cached < 304  # partly evicted


def test_abort_releases_everything() -> None:
    engine = make_engine(cache_tokens=4096)
    r = EngineRequest("x", tokens(1000, seed=1), 50)
    engine.add_request(r, 0.0)
    engine.step(0.0)
    assert engine.kv.usage > 0
    assert engine.abort("x")
    assert engine.kv.usage == 0 and engine.kv.reserved == 0 and not engine.has_work()
    assert not engine.abort("x")


def test_pd_prefill_holds_and_decode_skips_transferred_tokens() -> None:
    prompt = tokens(4000, seed=11)
    prefill = make_engine()
    held = EngineRequest("p", prompt, 1, hold_on_finish=True)
    run_virtual(prefill, [(0.0, held)])
    assert held.status is RequestStatus.HELD and prefill.kv.usage > 0
    assert prefill.release_held("p") is held and prefill.kv.usage == 0

    decode = make_engine()
    remote = EngineRequest("d", prompt, 8, kv_ready_tokens=len(prompt) - 1)
    local = EngineRequest("l", list(prompt), 8)
    run_virtual(decode, [(0.0, remote)])
    assert remote.num_transferred == len(prompt) - 1
    assert decode.counters.prefill_computed_tokens == 1
    run_virtual(make_engine(), [(0.0, local)])
    assert remote.ttft is not None and local.ttft is not None
    assert remote.ttft < local.ttft / 10


def test_a_prefix_scheduled_in_the_same_step_is_computed_once() -> None:
    """vLLM publishes a chunk's blocks when it schedules the chunk (allocate_slots), so a
    request admitted later in the same step shares them: the shared prefix is computed once."""
    prefix = tokens(1024, seed=7)
    engine = make_engine(max_batched_tokens=8192)
    a = EngineRequest("a", prefix + tokens(64, seed=8), 1)
    b = EngineRequest("b", prefix + tokens(64, seed=9), 1)
    engine.add_request(a, 0.0)
    engine.add_request(b, 0.0)
    out = engine.step(0.0)
    assert a.num_cached == 0
    assert b.num_cached == 1024  # every block of the shared prefix, from a's chunk of this very step
    assert out.shape.prefill_tokens == 1088 + 64  # the prefix once, each request's own tail
    assert a.first_token_time is not None and b.first_token_time is not None


def test_a_long_prompt_s_last_chunk_is_shared_in_the_step_that_computes_it() -> None:
    """A request admitted in the step that schedules a long prompt's last chunk hits every block
    of it (before: only the chunks of earlier steps, 1,200 tokens here)."""
    prompt = tokens(2048, seed=10)
    engine = make_engine(max_batched_tokens=1200)
    engine.add_request(EngineRequest("long", prompt, 1), 0.0)
    engine.step(0.0)  # long's first 1,200 tokens take the whole budget
    late = EngineRequest("late", prompt[:2000] + tokens(48, seed=11), 1)
    engine.add_request(late, 0.0)
    engine.step(0.0)  # long's last 848 tokens, then late in the budget left
    assert late.schedule_time is not None
    assert late.num_cached == 2000 // 16 * 16
