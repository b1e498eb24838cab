"""The wait for KV room in the colocated TTFT estimate, and the KV a colocated request books."""

import pytest

from router.config.model import TTFTWeights
from router.core.instances import Candidate
from router.scheduling.cost import admission_wait, colocated_ttft
from router.scheduling.decide import booking_for
from router.scheduling.framework import Decision, RouteRequest, build_views
from router.scheduling.scorers import TTFTScorer
from router.state.base import Load, Snapshot

W = TTFTWeights(decode_step_s=0.01, decode_interference_s=0.0)


def _req(prompt: int = 2000, output: int = 100) -> RouteRequest:
    return RouteRequest("r", tuple(range(prompt // 100)), prompt, output, 100)


def test_a_full_cache_delays_the_estimate_even_with_an_empty_prefill_queue():
    cands = [Candidate("full", cache_tokens=8000), Candidate("roomy", cache_tokens=8000)]
    snap = Snapshot({}, {"full": Load(requests=3, kv_tokens=7000), "roomy": Load(requests=3, kv_tokens=1000)})
    full, roomy = build_views(cands, snap)
    t_full, t_roomy = colocated_ttft(_req(), full, W), colocated_ttft(_req(), roomy, W)
    assert t_roomy.admission_s == 0.0 and t_full.admission_s > 0.0
    # 7000 + 2100 - 8000 = 1100 tokens must be freed; each of the 3 running holds ~2333: the
    # first of them to end frees it, after 1/4 of an output's 100 steps
    assert t_full.admission_s == pytest.approx(1 / 4 * 100 * 0.01)
    assert TTFTScorer(W).score(_req(), [full, roomy]) == [t_roomy.total_s / t_full.total_s, 1.0]


def test_the_cached_prefix_needs_no_new_room():
    cand = [Candidate("a", cache_tokens=8000)]
    snap = Snapshot({"a": 15}, {"a": Load(requests=1, kv_tokens=6000)})  # 1500 of 2000 prompt tokens cached
    (view,) = build_views(cand, snap)
    assert colocated_ttft(_req(), view, W).admission_s == 0.0  # 6000 + 500 + 100 fits in 8000


def test_nothing_running_means_no_wait_and_the_wait_is_bounded():
    assert admission_wait(0, 0, 10**6, 1000, 100, W) == 0.0  # nothing can free room: the engine will refuse it
    assert admission_wait(1000, 1, 10**6, 1000, 100, W) == 50 * 0.01  # at most everything running ends
    assert admission_wait(4000, 4, 10**6, 4000, 100, W) == pytest.approx(4 / 5 * 100 * 0.01)  # the last of 4


def test_the_wait_is_for_whole_requests_to_end():
    # 4 running requests hold 1000 tokens each in a 4000-token cache: a deficit of one token
    # waits for the first of them to end (1/5 of an output's steps), as long as a deficit of
    # 1000; one of 1001 waits for the second (2/5): the engine frees KV a request at a time
    one = admission_wait(4000, 4, 1, 4000, 100, W)
    assert one == pytest.approx(1 / 5 * 100 * 0.01)
    assert admission_wait(4000, 4, 1000, 4000, 100, W) == pytest.approx(one)
    assert admission_wait(4000, 4, 1001, 4000, 100, W) == pytest.approx(2 / 5 * 100 * 0.01)
    # a continuous freeing would have priced the one-token deficit at almost nothing
    assert one > 100 * 0.01 * 1 / 4000 * 10


def test_the_inlined_wait_agrees_with_the_cost_model_on_full_caches():
    scorer = TTFTScorer(W)
    req = _req(2000, 100)
    for requests, kv in ((1, 7000), (3, 7000), (4, 7999), (7, 6001), (0, 500)):
        (view,) = build_views([Candidate("a", cache_tokens=8000)], Snapshot({"a": 3}, {"a": Load(requests, kv_tokens=kv)}))
        assert scorer.estimates(req, [view]) == pytest.approx([colocated_ttft(req, view, W).total_s])


def test_a_colocated_request_pins_its_blocks_and_books_its_tail_and_output():
    req = RouteRequest("r", tuple(range(19)), 2050, 100, 100)  # 19 full blocks, a 150-token tail
    snap = Snapshot({"a": 15}, {})
    booking = booking_for(req, Decision("a", frozenset({"a"}), "score"), snap)
    # its blocks are shared with whoever else in flight there holds them (the store books their union)
    assert booking.legs[0].kv_tokens == 150 + 100 and booking.legs[0].block_tokens == 100
    assert booking.keys == req.keys
    bare = booking_for(RouteRequest("r", (), 50, 100, 100), Decision("a", frozenset({"a"}), "score"), snap)
    assert bare.legs[0].kv_tokens == 150 and bare.legs[0].block_tokens == 0  # no keys: nothing to share
    pd = booking_for(req, Decision("d", frozenset({"d<-p"}), "score", prefill="p", mode="disaggregated"), snap)
    assert pd.legs[0].kv_tokens == 2150 and pd.legs[0].block_tokens == 0  # a decode instance receives the whole prompt


def test_an_engines_measured_step_prices_the_wait_whole():
    # its measured inter-token latency already holds the interference of its batch: the
    # configured per-request interference is not added on top
    w = TTFTWeights(decode_step_s=0.01, decode_interference_s=0.002)
    assert admission_wait(4000, 4, 1, 4000, 100, w) == pytest.approx(1 / 5 * 100 * (0.01 + 4 * 0.002))
    assert admission_wait(4000, 4, 1, 4000, 100, w, step_s=0.03) == pytest.approx(1 / 5 * 100 * 0.03)
    measured, configured = Candidate("m", cache_tokens=8000, decode_step_s=0.03), Candidate("c", cache_tokens=8000)
    snap = Snapshot({}, {"m": Load(requests=3, kv_tokens=7000), "c": Load(requests=3, kv_tokens=7000)})
    views = build_views([measured, configured], snap)
    terms = [colocated_ttft(_req(), v, w) for v in views]
    assert terms[0].admission_s == pytest.approx(1 / 4 * 100 * 0.03)
    assert terms[1].admission_s == pytest.approx(1 / 4 * 100 * (0.01 + 3 * 0.002))
    assert TTFTScorer(w).estimates(_req(), views) == [t.total_s for t in terms]
