"""The store term: a load from a shared KV store against a recompute, and what it changes
for placement (a copy costs a load) and for selective disaggregation."""

import random
from dataclasses import replace

import pytest

from router.config.kvstore import KVStoreConfig
from router.config.model import PDConfig, PolicyConfig, TTFTWeights
from router.core.instances import Candidate
from router.scheduling import RouteRequest, build_policy
from router.scheduling.cost import colocated_ttft, prefill_seconds, prefill_work
from router.scheduling.decide import decide
from router.scheduling.framework import View
from router.scheduling.scorers import TTFTScorer
from router.scheduling.store_cost import load_seconds
from router.state.base import Load, Snapshot
from router.state.memory import MemoryStore
from router.state.store_tier import StoreHit, StoreTier, build_store_tier

W = TTFTWeights(attention_s_per_token2=0.0, request_overhead_s=0.0, decode_interference_s=0.0)
RATE = 8000.0
CANDS = [Candidate(i, prefill_tokens_per_s=RATE, kv_bytes_per_token=1000) for i in ("a", "b", "c", "d")]


def req(blocks=32, prompt=2048, store=None, rid="r"):
    return RouteRequest(rid, tuple(range(blocks)), prompt, 16, 64, store=store)


def hit(blocks=32, gbps=80.0):  # 80 Gbit/s = 10 GB/s: 1000-byte tokens load at 10M tok/s
    return StoreHit(blocks, 1.0, gbps * 1e9 / 8, 1000, 0.0)


def view(name="b", matched=0, prefill=0):
    return View(next(c for c in CANDS if c.id == name), matched, Load(prefill_tokens=prefill))


def test_a_stored_prefix_costs_its_load_or_the_rest_of_the_prefill_whichever_is_longer():
    r = req(prompt=2048, store=hit(blocks=24))  # the store holds 1536 tokens; the rest is 512
    t = colocated_ttft(r, view(), W)
    assert t.prefill_s == pytest.approx(512 / RATE)  # the load (0.15 ms) hides behind the rest
    assert t.uncached_tokens == 512
    assert colocated_ttft(replace(r, store=None), view(), W).prefill_s == pytest.approx(2048 / RATE)
    slow = colocated_ttft(replace(r, store=hit(blocks=24, gbps=0.08)), view(), W)  # 10 MB/s: 0.15 s of load
    assert slow.prefill_s == pytest.approx(1536 * 1000 / 10e6)


def test_a_store_slower_than_computing_is_not_used():
    r = req(store=hit(gbps=0.001))  # 125 KB/s: 16 s to load what computes in 0.26 s
    assert colocated_ttft(r, view(), W).prefill_s == pytest.approx(2048 / RATE)
    assert prefill_work(r, view(), W) == 2048


def test_what_the_instance_caches_is_not_loaded_again_and_only_the_rest_is_booked_as_work():
    r = req(store=hit(blocks=32))
    assert prefill_work(r, view(matched=16), W) == 0  # all stored: nothing is computed
    assert prefill_work(req(store=hit(blocks=16)), view(matched=8), W) == 2048 - 1024  # 64-token blocks
    # 3 MB/s: the 512 tokens to load take 0.171 s, longer than the rest (0.128 s), shorter than
    # computing them too (0.192 s): the load is the prefill
    t = colocated_ttft(req(store=hit(blocks=16, gbps=0.024)), view(matched=8), W)
    assert t.prefill_s == pytest.approx(512 * 1000 / 3e6)
    assert prefill_seconds(1024, 2048, RATE, W) < t.prefill_s < prefill_seconds(1536, 2048, RATE, W)


def test_the_scorer_prices_the_store_as_colocated_ttft_does():
    r = req(store=hit(blocks=20, gbps=0.8))
    views = [view("a", 32, 5000), view("b", 4, 0), view("c", 0, 100)]
    est = TTFTScorer(W).estimates(r, views)
    assert est == [pytest.approx(colocated_ttft(r, v, W).total_s) for v in views]


def ttft_policy():
    return build_policy(PolicyConfig(name="ttft", ttft=W), rng=random.Random(7))


def snap(matched=None, prefill=None):
    ids = [c.id for c in CANDS]
    matched, prefill = matched or {}, prefill or {}
    return Snapshot({i: matched.get(i, 0) for i in ids}, {i: Load(0, prefill.get(i, 0)) for i in ids})


def test_with_a_store_a_copy_costs_a_load_so_a_busy_home_is_left_for_an_idle_instance():
    # a holds the prefix with 0.375 s of queue; a copy elsewhere would recompute 0.256 s and
    # displace as much: cache_room keeps it home. With the prefix in the store, the copy is a
    # load of 2 ms: it goes to an idle instance.
    s = snap(matched={"a": 32}, prefill={"a": 3000})
    assert ttft_policy().choose(req(), CANDS, s).instance == "a"
    d = ttft_policy().choose(req(store=hit()), CANDS, s)
    assert d.instance != "a" and not d.filtered


def test_a_displaced_prefix_is_priced_at_its_reload_on_the_store_as_busy_as_it_is():
    from router.scheduling.placement import CacheRoomFilter

    flt = CacheRoomFilter(W, displacement=1.0)
    held = 2048.0  # the home holds it all; a copy on b duplicates it
    assert flt.displacement_s(req(), view(), held) == pytest.approx(2048 / RATE)  # no store: a recompute
    idle = hit()  # 10M tokens/s: 0.2 ms
    assert flt.displacement_s(req(store=idle), view(), held) == pytest.approx(2048 * 1000 / 10e9)
    # three loads still moving 1 s of bytes: the reload shares the store with them
    busy = replace(idle, loads=3, backlog_s=1.0)
    assert flt.displacement_s(req(store=busy), view(), held) == pytest.approx(4 * 2048 * 1000 / 10e9)
    # never more than recomputing: a store slower than the GPU is not how the prefix comes back
    jammed = replace(idle, loads=10_000, backlog_s=1e6)
    assert flt.displacement_s(req(store=jammed), view(), held) == pytest.approx(2048 / RATE)


async def test_decide_tells_the_request_what_the_store_holds_and_records_what_it_books():
    now = [0.0]
    tier = StoreTier(capacity=1000, bytes_per_s=10e9, bytes_per_token=1000, clock=lambda: now[0])
    store = MemoryStore({c.id: 10_000 for c in CANDS}, clock=lambda: now[0])
    policy = ttft_policy()
    first = await decide(store, policy, req(rid="r1"), CANDS, tier=tier)
    assert tier.hit(req().keys).blocks == 32
    await store.release(first.booking)
    await store.forget_instance(first.decision.instance)  # its engine restarted: only the store has the prefix
    without = await decide(store, policy, req(rid="r2"), CANDS)
    assert without.decision.terms[without.decision.instance]["uncached_tokens"] == 2048
    await store.release(without.booking)
    await store.forget_instance(without.decision.instance)
    again = await decide(store, policy, req(rid="r3"), CANDS, tier=tier)
    assert again.decision.terms[again.decision.instance]["uncached_tokens"] == 0  # all of it loads


async def test_a_load_is_booked_so_the_next_one_is_priced_behind_it_until_it_should_be_done():
    now = [0.0]
    tier = StoreTier(capacity=1000, bytes_per_s=10e9, bytes_per_token=1000, clock=lambda: now[0])  # 10M tok/s
    store = MemoryStore({c.id: 10_000 for c in CANDS}, clock=lambda: now[0])
    tier.record(req().keys)
    first = await decide(store, ttft_policy(), req(rid="r1"), CANDS, tier=tier)  # loads 2048 tokens: 0.2 ms
    assert first.decision.terms[first.decision.instance]["uncached_tokens"] == 0
    h = tier.hit(req().keys)
    assert h.loads == 1 and h.backlog_s == pytest.approx(2048 * 1000 / 10e9)
    # a second load of the same size shares the bandwidth with it: twice as long, stretched by
    # the store's utilization (the first load's 0.2 ms of bandwidth in the 30 s window)
    alone = 2048 * 1000 / 10e9
    assert h.utilization == pytest.approx(alone / 30.0)
    assert colocated_ttft(req(store=h), view(), W).prefill_s == pytest.approx(2 * alone / (1 - alone / 30.0))
    now[0] = 0.0001024  # half way through: half of it left to share
    h = tier.hit(req().keys)
    assert h.loads == 1 and h.backlog_s == pytest.approx(1024 * 1000 / 10e9)
    now[0] = 0.01  # expected done: the booking expires by itself
    assert tier.hit(req().keys).loads == 0
    # an instance that caches the prefix loads nothing, and books nothing
    await decide(store, ttft_policy(), req(rid="r2"), CANDS, tier=tier)
    assert tier.hit(req().keys).loads == 0


def test_booked_loads_are_bounded():
    tier = StoreTier(capacity=10, bytes_per_s=1.0, bytes_per_token=1, clock=lambda: 0.0)
    for _ in range(StoreTier.max_loads + 10):
        tier.book_load(1, 1)
    tier.record((1,))
    assert tier.hit((1,)).loads == StoreTier.max_loads


def test_the_tier_is_bounded_and_forgets_the_deepest_blocks_first():
    tier = StoreTier(capacity=40, bytes_per_s=1.0, bytes_per_token=1)
    tier.record(tuple(range(32)))
    tier.record(tuple(range(100, 116)))  # 16 more: 8 of the first prefix's deepest go
    assert tier.hit(tuple(range(32))).blocks == 24
    assert tier.hit(tuple(range(100, 116))).blocks == 16 and len(tier) == 40
    assert tier.hit((999,)) is None


def test_the_tier_follows_the_config():
    assert build_store_tier(KVStoreConfig(), 131072, 16) is None
    on = KVStoreConfig(enabled=True, capacity_tokens=1600, kv_dtype="fp8", bandwidth_gbps=8.0)
    tier = build_store_tier(on, 131072, 16)
    assert tier is not None and tier.capacity == 100
    tier.record((1, 2, 3))
    h = tier.hit((1, 2, 3, 4))
    assert (h.blocks, h.bytes_per_token, h.bytes_per_s) == (3, 65536, 1e9)


def test_a_decode_instance_that_would_only_load_may_serve_alone():
    pd = PDConfig(kv_bytes_per_token=1000)
    policy = build_policy(PolicyConfig(name="ttft", ttft=W), pd=pd, rng=random.Random(3))
    compat = ("m", "auto", 16, "vllm")
    cands = [Candidate("p", role="prefill", compat=compat, prefill_tokens_per_s=RATE),
             Candidate("d", role="decode", compat=compat, prefill_tokens_per_s=RATE, kv_bytes_per_token=1000)]
    s = Snapshot({"p": 0, "d": 0}, {"p": Load(), "d": Load()})
    assert policy.choose(req(prompt=4096, blocks=256), cands, s).prefill == "p"
    d = policy.choose(req(prompt=4096, blocks=256, store=hit(blocks=256)), cands, s)
    assert d.prefill is None and d.mode == "decode_only"


def test_loads_booked_lately_stretch_the_next_load_by_the_stores_utilization():
    """Loads that start while a load moves share its bandwidth too: at utilization rho the
    expected stay in a processor-sharing queue is 1 / (1 - rho) of its work."""
    now = [0.0]
    tier = StoreTier(capacity=1000, bytes_per_s=1000.0, bytes_per_token=1, clock=lambda: now[0], window_s=10.0)
    tier.record(tuple(range(32)))
    for _ in range(5):  # 1 s of bandwidth each, at 0, 2.5, ... 10 s, each over before the next
        tier.book_load(1000, 1)
        now[0] += 2.5
    h = tier.hit(tuple(range(32)))
    assert h is not None and h.loads == 0 and h.backlog_s == 0.0  # nothing moving now...
    assert h.utilization == pytest.approx(0.3)  # ...but at 12.5 s, 3 s in the last 10 (those at 5, 7.5, 10 s)
    r = RouteRequest("r", tuple(range(32)), 2048, 16, 64, store=h)
    cand = Candidate("a", prefill_tokens_per_s=1.0, kv_bytes_per_token=1)
    assert load_seconds(r, View(cand, 0, Load()), 600) == pytest.approx(0.6 / (1 - 0.3))
    now[0] += 10.0  # a quiet store: the stretch is gone
    assert tier.hit(tuple(range(32))).utilization == 0.0


def test_the_stretch_is_bounded_when_bookings_outrun_the_bandwidth():
    now = [0.0]
    tier = StoreTier(capacity=10, bytes_per_s=1.0, bytes_per_token=1, clock=lambda: now[0], window_s=1.0)
    tier.book_load(100, 1)  # 100 s of bandwidth asked for in a 1 s window
    assert tier.utilization(now[0]) == StoreTier.max_utilization
    now[0] = 2.0
    assert tier.utilization(now[0]) == 0.0
    # a hit built anywhere else is bounded alike: a saturated store prices 10x, never a division by zero
    r = RouteRequest("r", (0,), 100, 1, 1, store=StoreHit(1, 1.0, 1.0, 1, 0.0, utilization=1.0))
    assert load_seconds(r, View(Candidate("a", kv_bytes_per_token=1), 0, Load()), 1) == pytest.approx(10.0)
