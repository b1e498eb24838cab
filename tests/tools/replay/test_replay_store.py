"""The replay's shared KV store: what one engine computed another loads, over shared bandwidth."""

import pytest

from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.summary import summarize
from tests.tools.replay.test_replay_handoff import SMALL, req, trace_of, ttfts
from tests.tools.replay.test_replay_sim import Scripted, assert_store_drained, mixed_workload


def test_a_prefix_computed_on_one_engine_is_loaded_on_another_while_the_rest_computes():
    trace = trace_of(req(8000, t=0.0), req(8000, t=5.0))
    route = Scripted([("colocated", "m0", None), ("colocated", "m1", None)])
    cold = Simulation(trace, ClusterSpec(mixed=2, **SMALL), route).run()
    sim = Simulation(trace, ClusterSpec(mixed=2, store_tokens=1_000_000, store_gbps=100.0, **SMALL), route)
    rec = sim.run()
    assert rec.loaded[0] == 0 and rec.loaded[1] == 7984 and rec.cached[1] == 0  # whole blocks, less the last token's
    # the load (8 K x 128 KiB at 100 Gbit/s = 84 ms) replaces a 0.3 s prefill
    assert ttfts(rec)[1] < 0.5 * ttfts(cold)[1]
    assert sim.kvstore.counters.loaded_bytes == 7984 * sim.spec.kv_bytes_per_token()


def test_concurrent_loads_share_the_store_bandwidth():
    first = [req(8000, t=0.0)]
    again = [req(8000, t=5.0, base=100), req(8000, t=5.0, base=100)]
    spec = ClusterSpec(mixed=3, store_tokens=1_000_000, store_gbps=2.0, **SMALL)  # 4.2 s per load alone
    one = Simulation(trace_of(*first, again[0]), spec, Scripted([("colocated", "m0", None), ("colocated", "m1", None)])).run()
    two = Simulation(trace_of(*first, *again), spec,
                     Scripted([("colocated", "m0", None), ("colocated", "m1", None), ("colocated", "m2", None)])).run()
    alone = ttfts(one)[1]
    assert alone > 4.0
    assert min(ttfts(two)[1:]) == pytest.approx(2 * alone, rel=0.05)


@pytest.mark.parametrize("cluster", [{"mixed": 3}, {"prefill": 2, "decode": 2},
                                     {"prefill": 2, "decode": 1, "mixed": 1, "flavor": "sglang"}])
@pytest.mark.parametrize("name", ["round_robin", "ttft"])
def test_with_a_store_more_of_the_prompts_is_served_and_every_request_finishes(cluster, name):
    trace = mixed_workload()
    without = ClusterSpec(**cluster, cache_tokens=4_000)
    spec = ClusterSpec(**cluster, cache_tokens=4_000, store_tokens=2_000_000)
    base = summarize(_run(trace, without, name), 30.0)
    sim = _run(trace, spec, name)
    assert_store_drained(sim)
    s = summarize(sim, 30.0)
    assert s["finished"] == s["requests"]
    assert s["store_hit_ratio"] > 0 and s["hit_ratio"] > base["hit_ratio"]
    if name == "round_robin":  # cache-blind placement: the store serves what the engines' caches do not
        assert s["hit_ratio"] > base["hit_ratio"] + 0.1


def _run(trace, spec, name):
    sim = Simulation(trace, spec, policy_for(name, spec, 0))
    sim.run()
    return sim


def test_the_router_told_of_the_store_keeps_its_tier_and_an_unaware_one_none():
    spec = ClusterSpec(mixed=2, store_tokens=100_000, **SMALL)
    assert Simulation(trace_of(req(600)), spec, Scripted([("colocated", "m0", None)])).tier is not None
    blind = ClusterSpec(mixed=2, store_tokens=100_000, store_aware=False, **SMALL)
    assert Simulation(trace_of(req(600)), blind, Scripted([("colocated", "m0", None)])).tier is None
