"""The prefill queue as the router prices it: work ahead less what its head has computed,
plus the others' work sharing the step of a queued request's last chunk."""

import random

import pytest

from router.config.model import TTFTWeights
from router.core.instances import Candidate
from router.engines.external import add_loads
from router.scheduling.cost import colocated_ttft, shared_step_tokens
from router.scheduling.framework import RouteRequest, View
from router.scheduling.scorers import TTFTScorer
from router.state.base import Booking, Load, Snapshot
from router.state.memory import MemoryStore

W = TTFTWeights(prefill_tokens_per_s=8000.0, attention_s_per_token2=0.0, request_overhead_s=0.0,
                decode_interference_s=0.0, prefill_chunk_tokens=8192)


def test_no_queue_no_shared_step():
    assert shared_step_tokens(0, 1000, 8192) == 0
    assert shared_step_tokens(3000, 1000, 0) == 0  # not modelled


def test_the_last_chunk_shares_its_step_with_what_waits_behind():
    # 3000 ahead + 1000 ours end mid-step: the rest of it (4192) is filled, up to what waits (~3000)
    assert shared_step_tokens(3000, 1000, 8192) == 3000
    # 10,000 ahead + 6,000 ours end 384 tokens before a step boundary
    assert shared_step_tokens(10_000, 6_000, 8192) == 384


def queue_s(role: str = "prefill", **load) -> float:
    v = View(Candidate("a", role=role), 0, Load(requests=2, prefill_tokens=8000, **load))
    return colocated_ttft(RouteRequest("r", (), 100, 16, 16), v, TTFTWeights(prefill_tokens_per_s=8000.0)).queue_s


def test_a_mixed_engine_keeps_its_whole_queue():
    # it interleaves decode steps and several prompts' chunks: the head does not run alone
    assert queue_s("mixed", prefill_started_s=0.25, prefill_head_tokens=4000) == pytest.approx(1.0)


def test_a_started_head_shortens_the_queue_by_at_most_its_own_work():
    assert queue_s(prefill_started_s=0.25, prefill_head_tokens=4000) == pytest.approx(0.75)
    # the head (4000 tokens, 0.5 s) has run 3 s: the engine is slower than believed, or the
    # head waits on something; what is behind it has not started
    assert queue_s(prefill_started_s=3.0, prefill_head_tokens=4000) == pytest.approx(0.5)
    assert queue_s(prefill_started_s=3.0) == pytest.approx(1.0)  # a store that does not know the head (Redis)


def test_the_inlined_estimate_keeps_agreeing_with_the_cost_model():
    rng = random.Random(5)
    scorer = TTFTScorer(W)
    for _ in range(300):
        views = [View(Candidate(f"i{k}", prefill_tokens_per_s=rng.choice([None, 5000.0, 20000.0]),
                                role=rng.choice(["mixed", "prefill"]), cache_tokens=rng.choice([8192, 40_000])),
                      rng.randint(0, 20),
                      Load(rng.randint(0, 4), rng.choice([0, rng.randint(1, 40_000)]),
                           rng.choice([0, rng.randint(1, 60_000)]),  # booked KV: the admission wait too
                           prefill_started_s=rng.uniform(0, 2), prefill_head_tokens=rng.randint(0, 20_000)),
                      confidence=rng.uniform(0.3, 1.0)) for k in range(4)]
        req = RouteRequest("r", tuple(range(20)), rng.randint(1, 30_000), rng.choice([16, 300]), 64)
        assert scorer.estimates(req, views) == pytest.approx([colocated_ttft(req, v, W).total_s for v in views])


async def test_the_memory_store_says_how_long_the_queue_head_has_run():
    now = [0.0]
    store = MemoryStore({"a": 8}, clock=lambda: now[0])

    def head() -> tuple[float, int]:
        load = store.snapshot_now([], ["a"]).loads["a"]
        return load.prefill_started_s, load.prefill_head_tokens

    _, first = await store.decide([], ["a"], _Book("r1", 100))
    now[0] = 2.0
    assert head() == (2.0, 100)
    _, second = await store.decide([], ["a"], _Book("r2", 300))  # queued behind: the head is still r1
    _, third = await store.decide([], ["a"], _Book("r3", 500))
    now[0] = 5.0
    assert head() == (5.0, 100)
    await store.release(second)  # r2 gave up before it started: r1 is still the head
    assert head() == (5.0, 100)
    await store.prefill_done(first)  # r1 finished: r3 starts now
    now[0] = 6.0
    assert head() == (1.0, 500)
    await store.prefill_done(third)
    assert head() == (0.0, 0) and store.snapshot_now([], ["a"]).loads["a"].prefill_tokens == 0


class _Book:
    def __init__(self, rid: str, work: int) -> None:
        self.rid, self.work = rid, work

    def __call__(self, snap: Snapshot) -> Booking:
        return Booking.single(self.rid, "a", self.work, self.work + 10)

    def revise(self, snap: Snapshot, booking: Booking) -> None:
        return None


def test_external_load_keeps_the_bytes_in_flight_and_the_confidence():
    snap = Snapshot({"a": 3}, {"a": Load(1, 10, 20, 1, 5_000, prefill_started_s=0.5)}, {"a": 0.4})
    out = add_loads(snap, {"a": Load(2, 30, 40, 0)})
    load = out.loads["a"]
    assert (load.requests, load.prefill_tokens, load.kv_tokens, load.transfers, load.transfer_bytes) == (3, 40, 60, 1, 5_000)
    assert load.prefill_started_s == 0.5 and out.confidence == {"a": 0.4}
