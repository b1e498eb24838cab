"""The peers' policies follow their documented rules on hand-built snapshots."""

import random
from collections import Counter

import pytest

from router.config.model import PDConfig, PolicyConfig
from router.scheduling import Candidate, RouteRequest, build_policy
from router.scheduling.framework import build_views
from router.scheduling.baselines import DynamoCostScorer
from router.scheduling.pd import TwoProfilePolicy
from router.scheduling.scorers import QueueScorer
from router.state.base import Load, Snapshot

CANDS = [Candidate("a", cache_tokens=100_000), Candidate("b", cache_tokens=100_000), Candidate("c", cache_tokens=100_000)]


def req(blocks=10, prompt=640, max_tokens=64):
    return RouteRequest("r", tuple(range(blocks)), prompt, max_tokens, 64)


def snap(matched=None, loads=None, cands=CANDS):
    matched, loads = matched or {}, loads or {}
    return Snapshot({c.id: matched.get(c.id, 0) for c in cands}, {c.id: loads.get(c.id, Load()) for c in cands})


def policy(name, pd=None, seed=7, **config):
    return build_policy(PolicyConfig(name=name, **config), pd=pd, rng=random.Random(seed))


# -- sglang_cache_aware ----------------------------------------------------------------------

def test_sglang_ties_go_to_the_first_index_not_at_random():
    p = policy("sglang_cache_aware")
    picks = Counter(p.choose(req(), CANDS, snap()).instance for _ in range(50))
    assert picks == {"a": 50}  # cold cluster: every miss herds onto the first instance


def test_sglang_hit_needs_a_match_ratio_strictly_above_the_threshold():
    p = policy("sglang_cache_aware")
    loads = {"a": Load(1), "b": Load(5), "c": Load(0)}
    # 3 of 10 blocks = 0.3, not > 0.3: a miss, so least loaded (c)
    d = p.choose(req(), CANDS, snap({"b": 3}, loads))
    assert (d.instance, d.reason) == ("c", "prefix_miss")
    # 4 of 10: a hit, and the hit ignores load
    d = p.choose(req(), CANDS, snap({"b": 4}, loads))
    assert (d.instance, d.reason) == ("b", "prefix_hit")


def test_sglang_deepest_match_wins_and_equal_depths_go_to_the_first():
    p = policy("sglang_cache_aware")
    assert p.choose(req(), CANDS, snap({"b": 6, "c": 9})).instance == "c"
    assert p.choose(req(), CANDS, snap({"b": 9, "c": 9})).instance == "b"


def test_sglang_imbalance_needs_both_the_absolute_and_the_relative_gap():
    p = policy("sglang_cache_aware")
    cached = {"a": 10}
    # 100 vs 30: gap 70 > 64 and 100 > 45 -> least loaded despite the full hit on a
    d = p.choose(req(), CANDS, snap(cached, {"a": Load(100), "b": Load(30), "c": Load(31)}))
    assert (d.instance, d.reason) == ("b", "load_imbalance")
    # 164 vs 110: gap 54 <= 64 -> balanced, the hit wins
    d = p.choose(req(), CANDS, snap(cached, {"a": Load(164), "b": Load(110), "c": Load(110)}))
    assert (d.instance, d.reason) == ("a", "prefix_hit")
    # 300 vs 210: gap 90 > 64 but 300 < 1.5 * 210 -> balanced
    d = p.choose(req(), CANDS, snap(cached, {"a": Load(300), "b": Load(210), "c": Load(210)}))
    assert d.reason == "prefix_hit"


def test_sglang_empty_prompt_is_a_miss():
    d = policy("sglang_cache_aware").choose(req(blocks=0, prompt=10), CANDS, snap())
    assert d.reason == "prefix_miss" and d.instance == "a"


# -- llmd_weighted ---------------------------------------------------------------------------

def test_queue_scorer_is_min_max_normalised():
    views = build_views(CANDS, snap(loads={"a": Load(0, 1000), "b": Load(0, 3000), "c": Load(0, 2000)}))
    assert QueueScorer().score(req(), views) == [1.0, 0.0, 0.5]
    assert QueueScorer().score(req(), build_views(CANDS, snap())) == [1.0, 1.0, 1.0]


def test_llmd_weights_prefix_three_queue_two_kv_two():
    d = policy("llmd_weighted").choose(
        req(), CANDS, snap({"a": 10, "b": 5}, {"a": Load(1, 4000, 50_000), "b": Load(1, 0, 0), "c": Load(0, 2000, 0)})
    )
    # a: 3*1.0 + 2*0 + 2*0.5 = 4.0; b: 3*0.5 + 2*1 + 2*1 = 5.5; c: 0 + 2*0.5 + 2*1 = 3.0
    assert d.scores == pytest.approx({"a": 4.0, "b": 5.5, "c": 3.0})
    assert d.instance == "b"


def test_llmd_breaks_ties_at_random():
    p = policy("llmd_weighted")
    picks = Counter(p.choose(req(), CANDS, snap()).instance for _ in range(300))
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) > 60


# -- dynamo_cost -----------------------------------------------------------------------------

def test_dynamo_cost_matches_the_documented_formula():
    loads = {"a": Load(2, 1280, 6400), "b": Load(0, 0, 12_800), "c": Load(1, 640, 640)}
    d = policy("dynamo_cost").choose(req(), CANDS, snap({"a": 10, "b": 2}, loads))
    # a: prefill (1280 + 0)/64 = 20, decode (6400 + 704)/64 = 111 -> 131
    # b: prefill (0 + 512)/64 = 8,   decode (12800 + 704)/64 = 211 -> 219
    # c: prefill (640 + 640)/64 = 20, decode (640 + 704)/64 = 21 -> 41
    assert d.scores == pytest.approx({"a": -131.0, "b": -219.0, "c": -41.0})
    assert d.terms["a"] == pytest.approx({"prefill_blocks": 20.0, "decode_blocks": 111.0})
    assert d.instance == "c"


def test_dynamo_overlap_weight_scales_only_the_prefill_term():
    views = build_views(CANDS, snap({"a": 10}))
    costs = DynamoCostScorer(overlap_weight=0.0).logits(req(), views)
    assert [p for p, _ in costs] == [0.0, 10.0, 10.0]
    pipeline = {"scorers": [{"name": "dynamo_cost", "params": {"overlap_weight": 0.0}}]}
    d = policy("dynamo", pipeline=pipeline).choose(req(), CANDS, snap({"a": 10}))
    assert d.acceptable == {"a", "b", "c"}  # weight 0: the cache no longer matters


def test_dynamo_ties_are_random():
    p = policy("dynamo_cost")
    picks = Counter(p.choose(req(), CANDS, snap()).instance for _ in range(300))
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) > 60


# -- registration ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sglang_cache_aware", "llmd_weighted", "dynamo_cost"])
def test_baselines_are_built_by_name_colocated_and_pd(name):
    assert policy(name).name == name
    pd = policy(name, pd=PDConfig())
    assert isinstance(pd, TwoProfilePolicy) and pd.name == name
    cands = [Candidate("p1", role="prefill"), Candidate("p2", role="prefill"), Candidate("d1", role="decode")]
    d = pd.choose(req(), cands, snap({"p2": 10}, cands=cands))
    # P by the named policy (all three follow the fully cached prefix), D by load
    assert d.mode == "disaggregated" and d.instance == "d1" and d.prefill == "p2"
