"""cache_room keeps a prefix at its home unless a copy pays for the cache it displaces;
rendezvous gives each prefix one home that every replica agrees on."""

import random
from collections import Counter

from router.config.model import PolicyConfig, TTFTWeights
from router.scheduling import Candidate, RouteRequest, build_policy
from router.scheduling.filters import BoundedLoadFilter
from router.scheduling.framework import build_views
from router.scheduling.placement import CacheRoomFilter, rendezvous_weight
from router.state.base import Load, Snapshot

CANDS = [Candidate(i, prefill_tokens_per_s=8000.0) for i in ("a", "b", "c", "d")]
W = TTFTWeights(attention_s_per_token2=0.0, request_overhead_s=0.0, decode_interference_s=0.0)


def req(first=0, blocks=32, prompt=2048, rid="r"):
    return RouteRequest(rid, tuple(range(first, first + blocks)), prompt, 16, 64)


def snap(matched=None, prefill=None, requests=None, room=None):
    ids = [c.id for c in CANDS]
    matched, prefill, requests = matched or {}, prefill or {}, requests or {}
    return Snapshot({i: matched.get(i, 0) for i in ids},
                    {i: Load(requests.get(i, 0), prefill.get(i, 0)) for i in ids}, room=room or {})


def ttft(seed=7, **kw):
    return build_policy(PolicyConfig(name="ttft", ttft=W, **kw), rng=random.Random(seed))


def test_the_prefix_stays_home_while_its_queue_costs_less_than_a_copy_displaces():
    # a holds all 2048 tokens (0.256 s to prefill elsewhere) and has 0.375 s of queue:
    # spreading would copy it (ttft_spread does), pricing the room keeps it home.
    s = snap(matched={"a": 32}, prefill={"a": 3000})
    spread = build_policy(PolicyConfig(name="ttft_spread", ttft=W), rng=random.Random(7))
    assert spread.choose(req(), CANDS, s).instance != "a"
    d = ttft().choose(req(), CANDS, s)
    assert d.instance == "a" and d.reason == "home"
    assert set(d.filtered) == {"b", "c", "d"} and set(d.filtered.values()) == {"cache_room"}


def test_a_hot_prefix_is_replicated_once_its_holders_cannot_keep_up():
    # 0.75 s of queue at the holder is more than the copy (0.256 s) plus its displacement (0.256 s)
    d = ttft().choose(req(), CANDS, snap(matched={"a": 32}, prefill={"a": 6000}))
    assert d.instance != "a" and not d.filtered
    # between the two: a copy is allowed only where it is cheap (b already holds half)
    d = ttft().choose(req(), CANDS, snap(matched={"a": 32, "b": 16}, prefill={"a": 3000}))
    assert d.instance == "b" and d.reason == "replicate" and set(d.filtered) == {"c", "d"}


def test_the_price_of_a_copy_follows_what_it_displaces_there():
    # a's 0.75 s queue is more than a copy (0.256 s) plus computing the 2048 duplicated
    # tokens again (0.256 s): with nothing known to come back, the copy is made
    heavy = {"matched": {"a": 32}, "prefill": {"a": 6000}}
    assert ttft().choose(req(), CANDS, snap(**heavy)).instance != "a"
    # full caches whose evictions come back three times over: the prefix stays home
    d = ttft().choose(req(), CANDS, snap(**heavy, room={i: (0, 3.0, 3.0) for i in "bcd"}))
    assert d.instance == "a" and d.reason == "home"
    # the same, where the copy fits in free room: it evicts nothing, and is made
    d = ttft().choose(req(), CANDS, snap(**heavy, room={"b": (40, 3.0, 3.0), "c": (0, 3.0, 3.0), "d": (0, 3.0, 3.0)}))
    assert d.instance == "b" and d.reason == "replicate"
    # room for most of it: the rest still displaces (256 tokens x 3 re-prefills: 0.608 s < 0.75 s)
    d = ttft().choose(req(), CANDS, snap(**heavy, room={i: (28, 3.0, 3.0) for i in "bcd"}))
    assert d.instance != "a"
    # room for less (768 tokens x 3: 0.8 s)
    d = ttft().choose(req(), CANDS, snap(**heavy, room={i: (20, 3.0, 3.0) for i in "bcd"}))
    assert d.instance == "a"


def test_a_new_prefix_is_not_filtered():
    flt = CacheRoomFilter(W, displacement=1.0)
    views_snap = snap(prefill={"a": 100})
    from router.scheduling.framework import build_views
    views = build_views(CANDS, views_snap)
    kept, reason = flt.keep(req(), views)
    assert kept == views and reason is None


def test_a_new_prefix_fills_free_room_before_it_pushes_other_prefixes_out():
    # nobody holds it; a is idle but full, and what the pool evicts comes back once (1 re-prefill
    # per token: 2048 / 8000 = 0.256 s); b has room for it and 0.1 s of queue: b takes it
    rooms = {"a": (0, 1.0, 1.0), "b": (40, 1.0, 1.0), "c": (0, 1.0, 1.0), "d": (0, 1.0, 1.0)}
    s = snap(prefill={"b": 800, "c": 800, "d": 800}, room=rooms)
    d = ttft().choose(req(), CANDS, s)
    assert d.instance == "b" and d.reason == "room" and set(d.filtered) == {"a", "c", "d"}
    # more queue at b than the eviction costs at a: a after all, and every full route is priced alike
    s = snap(prefill={"b": 3000, "c": 800, "d": 800}, room=rooms)
    assert ttft().choose(req(), CANDS, s).instance == "a"
    # where the pool's evictions are cold, nothing is filtered: the least loaded takes it
    cold = {i: (r[0], 0.0, 0.0) for i, r in rooms.items()}
    d = ttft().choose(req(), CANDS, snap(prefill={"b": 800, "c": 800, "d": 800}, room=cold))
    assert d.instance == "a" and not d.filtered


def test_a_new_prefix_is_priced_at_the_pools_share_not_each_caches_own():
    # a's own evictions look hot, b's cold, the pool's share is the same for both: the
    # prefix goes where it is served first (a), not to whichever cache looks coldest
    rooms = {"a": (0, 5.0, 1.0), "b": (0, 0.1, 1.0), "c": (0, 1.0, 1.0), "d": (0, 1.0, 1.0)}
    s = snap(prefill={"b": 400, "c": 800, "d": 800}, room=rooms)
    assert ttft().choose(req(), CANDS, s).instance == "a"
    # an instance never recorded (absent: FULL_ROOM) holds nothing to push out
    del rooms["c"]
    d = ttft().choose(req(), CANDS, snap(prefill={"a": 400, "b": 400, "c": 800, "d": 800}, room=rooms))
    assert d.instance == "c" and d.reason == "room"


def test_displacement_zero_is_plain_lowest_ttft():
    flt = CacheRoomFilter(W, displacement=0.0)
    from router.scheduling.framework import build_views
    views = build_views(CANDS, snap(matched={"a": 32}, prefill={"a": 3000}))
    kept, _ = flt.keep(req(), views)
    assert {v.id for v in kept} == {"a", "b", "c", "d"}  # every copy beats a's queue once it is free


def test_bounded_load_still_holds_over_the_home():
    # a is the home but already carries far more than its share of requests
    d = ttft().choose(req(), CANDS, snap(matched={"a": 32}, requests={"a": 24}))
    assert d.instance != "a" and d.filtered.get("a") == "bounded_load"


def test_the_bound_never_pushes_a_long_held_prefix_off_its_home():
    # a holds all 16K tokens of a long document and carries 24 requests (the bound is 14):
    # leaving would recompute the document elsewhere, so the request stays home; with
    # keep_tokens 0 (the bound as before) it is pushed off.
    long = req(blocks=256, prompt=16384)
    s = snap(matched={"a": 256}, requests={"a": 24})
    assert ttft().choose(long, CANDS, s).instance == "a"
    always = build_policy(PolicyConfig(name="ttft", ttft=W.model_copy(update={"bounded_load_keep_tokens": 0})),
                          rng=random.Random(7))
    pushed = always.choose(long, CANDS, s)
    assert pushed.instance != "a" and pushed.filtered.get("a") == "bounded_load"


def test_the_bound_still_pushes_a_long_prompt_off_an_instance_that_barely_holds_it():
    # The exemption is for what leaving would recompute, not for the prompt's length: a
    # holds 2K of the 16K (a system prompt), or all of it at a confidence of 0.1 (believed
    # mostly evicted), so the bound moves the request as it moves short ones.
    long = req(blocks=256, prompt=16384)
    for s in (snap(matched={"a": 32}, requests={"a": 24}),
              Snapshot(snap(matched={"a": 256}, requests={"a": 24}).matched,
                       snap(requests={"a": 24}).loads, confidence={"a": 0.1})):
        d = ttft().choose(long, CANDS, s)
        assert d.instance != "a" and d.filtered.get("a") == "bounded_load"


def test_the_exemption_keeps_the_bound_on_every_instance_that_does_not_hold_the_prompt():
    # b holds the document but is over the bound; c is over it too and holds nothing:
    # c stays skipped whatever the prompt's length
    long = req(blocks=256, prompt=16384)
    flt = BoundedLoadFilter(2.0, 8, keep_tokens=4096)
    views = build_views(CANDS, snap(matched={"b": 256}, requests={"b": 30, "c": 30}))
    assert {v.id for v in flt.keep(long, views)[0]} == {"a", "b", "d"}


def test_replicas_agree_on_every_prefix_home_without_sharing_state():
    # Two router replicas: different RNG seeds, same idle cluster view. Every tenant's
    # first request goes to the same instance from both, and homes spread over the pool.
    one, two = ttft(seed=1), ttft(seed=99)
    homes = Counter()
    for tenant in range(200):
        r = req(first=tenant * 1000)
        a, b = one.choose(r, CANDS, snap()), two.choose(r, CANDS, snap())
        assert a.instance == b.instance
        homes[a.instance] += 1
    assert set(homes) == {"a", "b", "c", "d"} and min(homes.values()) > 25


def test_a_system_prompt_every_tenant_shares_does_not_send_every_tie_to_one_instance():
    # every prompt starts with the same 2 blocks, held everywhere; homes follow what comes after
    p = ttft()
    held = snap(matched={c.id: 2 for c in CANDS})
    homes = Counter()
    for tenant in range(200):
        keys = (7, 8) + tuple(range(tenant * 1000, tenant * 1000 + 30))
        r = RouteRequest("r", keys, 2048, 16, 64)
        first, again = p.choose(r, CANDS, held), p.choose(r, CANDS, held)
        assert first.instance == again.instance
        homes[first.instance] += 1
    assert set(homes) == {"a", "b", "c", "d"} and min(homes.values()) > 25


def test_a_home_survives_other_instances_joining_except_for_the_prefixes_they_win():
    # Rendezvous hashing: adding an instance moves only the prefixes whose new top weight is it.
    ids = ["a", "b", "c", "d"]
    moved = 0
    for tenant in range(400):
        key = tenant * 7919
        before = max(ids, key=lambda i: rendezvous_weight(key, i))
        after = max(ids + ["e"], key=lambda i: rendezvous_weight(key, i))
        assert after in (before, "e")
        moved += after == "e"
    assert 40 < moved < 130  # about a fifth


def test_ties_without_blocks_fall_back_to_random():
    p = ttft()
    short = RouteRequest("r", (), 10, 16, 64)
    picks = Counter(p.choose(short, CANDS, snap()).instance for _ in range(200))
    assert len(picks) == 4


def test_a_session_goes_home_when_only_its_history_nears_the_old_end():
    # a holds the session (system prompt + 12 blocks of its history, the history at the old
    # end of a's LRU); b, c and d hold the system prompt alone, fresh. Priced at the deepest
    # block's confidence, a's whole run looked gone: shorter than the system prompt the
    # others hold, so cache_room dropped a as a would-be copy, and the history was computed
    # again elsewhere. Counting the fresh head whole, a is the prefix's holder and wins.
    from router.state.residency import ResidencyIndex

    from state.test_confidence import _session_near_the_old_end  # type: ignore[import-not-found]

    idx = ResidencyIndex(ttl_s=600, margin=0.25)
    keys = _session_near_the_old_end(idx)
    for other in "bcd":
        idx.record(other, keys[:8], cap=40, now=0)
    request = RouteRequest("r", tuple(keys + [900, 901]), 22 * 64, 16, 64)
    matched = idx.matched(request.keys, [c.id for c in CANDS], now=0)
    assert matched == {"a": 20, "b": 8, "c": 8, "d": 8}
    s = Snapshot(matched, {c.id: Load() for c in CANDS}, idx.confidences(request.keys, matched))
    d = ttft().choose(request, CANDS, s)
    assert d.instance == "a" and "a" not in d.filtered
