"""The arrival rate a policy measures from its own decisions (router/scheduling/arrivals.py),
and the copy price it feeds: a recompute delays the requests arriving behind it."""

from __future__ import annotations

import pytest

from router.config.model import TTFTWeights
from router.core.instances import Candidate
from router.scheduling import RouteRequest
from router.scheduling.arrivals import ArrivalRate
from router.scheduling.framework import build_views
from router.scheduling.placement import CacheRoomFilter
from router.state.base import Load, Snapshot

CANDS = [Candidate(i, prefill_tokens_per_s=8000.0) for i in ("a", "b", "c", "d")]
W = TTFTWeights(attention_s_per_token2=0.0, request_overhead_s=0.0, decode_interference_s=0.0)


def test_the_rate_is_the_inverse_of_the_smoothed_gap_between_requests():
    rate = ArrivalRate(smoothing=0.5)
    assert rate.per_second() == 0.0  # nothing known before two requests
    now = 0.0
    for i in range(40):
        rate.tick(f"r{i}", now)
        now += 0.1
    assert rate.per_second() == pytest.approx(10.0)
    for i in range(40, 80):  # the pool slows to one request every 2 s
        rate.tick(f"r{i}", now)
        now += 2.0
    assert rate.per_second() == pytest.approx(0.5, rel=1e-3)


def test_a_request_priced_twice_ticks_once_and_an_idle_gap_is_capped():
    rate = ArrivalRate(smoothing=1.0, max_gap_s=5.0)
    rate.tick("a", 0.0)
    rate.tick("b", 1.0)
    rate.tick("b", 1.5)  # a shared store's revise prices the same request again
    assert rate.per_second() == pytest.approx(1.0)
    rate.tick("c", 3600.0)
    assert rate.per_second() == pytest.approx(0.2)  # the idle hour counts as 5 s
    with pytest.raises(ValueError):
        ArrivalRate(smoothing=0.0)


def _decide_copy(gap_s: float, externality: float = 1.0) -> set[str]:
    """a holds a 16K-token document (2 s to recompute elsewhere) behind 5 s of queue;
    requests have been arriving every ``gap_s`` over the four instances."""
    arrivals = ArrivalRate()
    flt = CacheRoomFilter(W, displacement=1.0, arrivals=arrivals, externality=externality)
    for i in range(200):
        arrivals.tick(f"warm{i}", i * gap_s)
    req = RouteRequest("r", tuple(range(256)), 16384, 16, 64, arrived_s=200 * gap_s)
    ids = [c.id for c in CANDS]
    snap = Snapshot({i: (256 if i == "a" else 0) for i in ids},
                    {i: Load(0, 40_000 if i == "a" else 0) for i in ids})
    kept, _ = flt.keep(req, build_views(CANDS, snap))
    return {v.id for v in kept}


def test_a_copy_that_would_stall_a_busy_pool_is_priced_out():
    # Quiet pool (a request every 10 s): copying costs its 2 s recompute twice over (own
    # prefill + displacement) = 4 s < a's 5 s queue, so the copies are kept.
    assert _decide_copy(10.0) == {"a", "b", "c", "d"}
    # Ten requests a second: 2.5 a second arrive at each instance, and the 2 s recompute
    # delays them by 2.5 x 2^2 / 2 = 5 s more: the document stays home.
    assert _decide_copy(0.1) == {"a"}
    # With the externality weighed 0 the busy pool copies as the quiet one does.
    assert _decide_copy(0.1, externality=0.0) == {"a", "b", "c", "d"}


def test_a_request_without_an_arrival_time_is_not_counted():
    # /debug/route and a retried request price routes without being new arrivals
    arrivals = ArrivalRate()
    flt = CacheRoomFilter(W, displacement=1.0, arrivals=arrivals)
    ids = [c.id for c in CANDS]
    snap = Snapshot({i: 4 for i in ids}, {i: Load() for i in ids})
    for i in range(5):
        flt.keep(RouteRequest(f"x{i}", tuple(range(4)), 256, 16, 64), build_views(CANDS, snap))
    assert arrivals.per_second() == 0.0
    for i in range(5):
        flt.keep(RouteRequest(f"y{i}", tuple(range(4)), 256, 16, 64, arrived_s=i * 0.5), build_views(CANDS, snap))
    assert arrivals.per_second() == pytest.approx(2.0)
