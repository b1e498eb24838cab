"""The wait for KV room in the colocated TTFT estimate, and the KV a colocated request books."""

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
    # 7000 + 2100 - 8000 = 1100 tokens must be freed by requests holding 7000, each ending ~50 steps out
    assert abs(t_full.admission_s - 50 * 0.01 * 1100 / 7000) < 1e-12
    assert TTFTScorer(W).score(_req(), [full, roomy]) == [t_roomy.total_s / t_full.total_s, 1.0]


def test_the_cached_prefix_needs_no_new_room():
    cand = [Candidate("a", cache_tokens=8000)]
    snap = Snapshot({"a": 15}, {"a": Load(requests=1, kv_tokens=6000)})  # 1500 of 2000 prompt tokens cached
    (view,) = build_views(cand, snap)
    assert colocated_ttft(_req(), view, W).admission_s == 0.0  # 6000 + 500 + 100 fits in 8000


def test_nothing_running_means_no_wait_and_the_wait_is_bounded():
    assert admission_wait(0, 0, 10**6, 1000, 100, W) == 0.0  # nothing can free room: the engine will refuse it
    assert admission_wait(1000, 1, 10**6, 1000, 100, W) == 50 * 0.01  # at most everything running ends


def test_a_colocated_request_books_only_the_kv_it_adds():
    req = _req(2000, 100)
    snap = Snapshot({"a": 15}, {})
    booking = booking_for(req, Decision("a", frozenset({"a"}), "score"), snap)
    assert booking.legs[0].kv_tokens == 500 + 100  # its 1500 cached tokens are shared with whoever holds them
    pd = booking_for(req, Decision("d", frozenset({"d<-p"}), "score", prefill="p", mode="disaggregated"), snap)
    assert pd.legs[0].kv_tokens == 2100  # a decode instance receives the whole prompt
