"""Loads landing while another prefill computes: the store tier books where and when each
load waits for its last token, and a route that computes there is priced the delay it causes
(store_cost.landing_delay_s), without changing its own TTFT estimate."""

import random

import pytest

from router.config.model import PolicyConfig, TTFTWeights
from router.core.instances import Candidate
from router.scheduling import RouteRequest, build_policy
from router.scheduling.cost import colocated_ttft
from router.scheduling.decide import decide
from router.scheduling.framework import View
from router.scheduling.store_cost import landing_delay_s
from router.state.base import Load, Snapshot
from router.state.memory import MemoryStore
from router.state.store_tier import StoreTier

RATE = 8000.0
CHUNK = 2048
W = TTFTWeights(attention_s_per_token2=0.0, request_overhead_s=0.0, decode_interference_s=0.0,
                prefill_chunk_tokens=CHUNK)
CANDS = [Candidate(i, prefill_tokens_per_s=RATE, kv_bytes_per_token=1000) for i in ("a", "b")]


def req(prompt=8192, landings=None, rid="r", blocks=0, first=0):
    return RouteRequest(rid, tuple(range(first, first + blocks)), prompt, 16, 64, landings=landings)


def view(name="a", prefill=0):
    return View(next(c for c in CANDS if c.id == name), 0, Load(prefill_tokens=prefill))


def test_the_tier_lists_each_instances_landings_from_now_and_drops_past_ones():
    now = [0.0]
    tier = StoreTier(capacity=100, bytes_per_s=1000.0, bytes_per_token=1, clock=lambda: now[0])
    assert tier.landings() == {}
    tier.book_load(500, 1, "a", ready_s=2.0)  # ready at the decision's estimate
    tier.book_load(1000, 1, "b")  # no estimate: at the load's own end (1 s alone, shared with a's 0.5 s left)
    tier.book_load(100, 1)  # no instance: bandwidth only
    now[0] = 0.5
    got = tier.landings()
    assert got.keys() == {"a", "b"}
    assert got["a"] == (pytest.approx(1.5),)
    assert got["b"][0] > 0.5
    now[0] = 2.5
    assert "a" not in tier.landings()


def test_the_landings_are_bounded():
    tier = StoreTier(capacity=10, bytes_per_s=1.0, bytes_per_token=1, clock=lambda: 0.0)
    for _ in range(StoreTier.max_loads + 10):
        tier.book_load(1, 1, "a", ready_s=1.0)
    assert len(tier.landings()["a"]) == StoreTier.max_loads


def test_a_landing_waits_for_the_step_in_progress_and_shares_the_next_chunk():
    r = req(landings={"a": (0.5, 5.0)})
    # 8192 tokens in 4 steps of 0.256 s from 0.1 s: the landing at 0.5 s waits half a step,
    # then a step shared with the next chunk; the one at 5 s is after the prefill
    assert landing_delay_s(r, view(), 0.1, 1.024, 8192, CHUNK) == pytest.approx(0.256 * 1.25)
    # one step only: half of it, on average
    assert landing_delay_s(r, view(), 0.4, 0.2, 1600, CHUNK) == pytest.approx(0.1)
    assert landing_delay_s(r, view(), 0.6, 1.0, 8192, CHUNK) == 0.0  # it lands before the prefill starts
    assert landing_delay_s(r, view("b"), 0.1, 1.024, 8192, CHUNK) == 0.0  # nothing lands on b
    assert landing_delay_s(r, view(), 0.1, 1.024, 8192, 0) == 0.0  # the step budget is not known


def test_the_delay_is_a_cost_of_the_route_not_of_its_own_first_token():
    r = req(landings={"a": (0.5,)})
    t = colocated_ttft(r, view(), W)
    plain = colocated_ttft(req(), view(), W)
    assert t.total_s == pytest.approx(plain.total_s)  # its own TTFT does not change
    assert t.delays_s == pytest.approx(1.024 / 4 * 1.25) and t.cost_s == pytest.approx(t.total_s + t.delays_s)


def policy(weights=W):
    return build_policy(PolicyConfig(name="ttft", ttft=weights), rng=random.Random(5))


def test_a_long_prefill_goes_where_no_load_is_about_to_land():
    s = Snapshot({"a": 0, "b": 0}, {"a": Load(), "b": Load()})
    r = req(landings={"a": (0.3,)})
    for seed in range(10):  # a and b are otherwise a tie, broken at random
        d = build_policy(PolicyConfig(name="ttft", ttft=W), rng=random.Random(seed)).choose(r, CANDS, s)
        assert d.instance == "b" and d.estimate_s == pytest.approx(8192 / RATE)
    blind = TTFTWeights(attention_s_per_token2=0.0, request_overhead_s=0.0, decode_interference_s=0.0)
    assert policy(blind).choose(r, CANDS, s).acceptable == {"a", "b"}  # no step budget: no delay priced


async def test_decide_books_the_landing_of_a_load_at_the_decisions_estimate():
    now = [0.0]
    tier = StoreTier(capacity=1000, bytes_per_s=10e6, bytes_per_token=1000, clock=lambda: now[0])  # 10K tok/s
    store = MemoryStore({c.id: 100_000 for c in CANDS}, clock=lambda: now[0])
    keys = tuple(range(128))  # 8192 tokens of 64-token blocks, all in the store
    tier.record(keys)
    routed = await decide(store, policy(), req(blocks=128, rid="r1"), CANDS, tier=tier)
    d = routed.decision
    assert d.terms[d.instance]["uncached_tokens"] == 0  # it loads (0.82 s) rather than computes (1.02 s)
    assert tier.landings() == {d.instance: (pytest.approx(d.estimate_s),)}
    # the next long new prompt is priced the delay on that instance: it goes to the other
    other = await decide(store, policy(), req(blocks=128, first=1000, rid="r2"), CANDS, tier=tier)
    assert other.decision.instance != d.instance
    assert other.decision.terms[d.instance]["delays_s"] > 0
