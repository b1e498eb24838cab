"""Replay with precise residency: the policy sees the simulated engines' actual caches."""

import pytest

from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.summary import summarize
from router.tools.replay.synthetic import generate

TRACE = "shared_prefix:groups=12,users=3,system=3000,question=400,output=16,stages=1x60"


def run(residency, **spec):
    cluster = ClusterSpec(mixed=3, cache_tokens=12_000, **spec)  # each engine holds ~3 of 12 tenants
    sim = Simulation(generate(TRACE, 1), cluster, policy_for("ttft", cluster, 0), residency=residency)
    sim.run()
    return sim, summarize(sim, 30.0)


def test_precise_tables_are_the_engines_caches_block_for_block():
    sim, summary = run("precise")
    assert summary["residency"] == "precise" and sim.feeds is not None and sim.feeds.events > 0
    for node in sim.nodes:
        table = sim.feeds.residency.table(node.id)
        assert table.fresh and len(table) == node.engine.kv.cached_blocks
    # decided on what the engines held: predicted and measured hits agree closely
    assert abs(summary["predicted_hit_ratio"] - summary["hit_ratio"]) < 0.05


def test_a_router_told_the_wrong_cache_size_overpredicts_unless_precise():
    _, approx = run("approximate", router_cache_tokens=500_000)
    _, precise = run("precise", router_cache_tokens=500_000)
    assert approx["predicted_hit_ratio"] > approx["hit_ratio"] + 0.1
    assert abs(precise["predicted_hit_ratio"] - precise["hit_ratio"]) < 0.05


@pytest.mark.parametrize("residency", ["approximate", "precise"])
def test_disaggregated_replays_finish_with_either_residency(residency):
    cluster = ClusterSpec(prefill=2, decode=2, cache_tokens=20_000)
    trace = generate("multi_turn:sessions=8,turns=3,rate=2,think=2,system=512,user=300,output=20", 3)
    sim = Simulation(trace, cluster, policy_for("ttft", cluster, 0), residency=residency)
    sim.run()
    assert sum(sim.record.finishes) == len(trace.requests)
