"""The replay measures each engine's decode step as the live router's poller does (router/engines/decode_step.py)."""

import dataclasses

import pytest

from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.synthetic import generate

TRACE = generate("multi_turn:sessions=16,turns=4,rate=6,think=1,system=1024,user=300,output=64", 3)


def test_each_engine_is_priced_at_the_step_its_requests_saw():
    spec = ClusterSpec(mixed=2, cache_tokens=60_000, told=False, slowdown=1.7)
    sim = Simulation(TRACE, spec, policy_for("ttft", spec, 0))
    assert all(c.decode_step_s is None for c in sim._candidates)  # nothing measured before traffic
    sim.run()
    for node, cand in zip(sim.nodes, sim._candidates):
        c = node.engine.counters
        seen = c.itl_seconds / c.itl_tokens  # the mean step over the whole run
        assert cand.decode_step_s is not None and cand.decode_step_s == pytest.approx(seen, rel=0.3), node.id
    # the configured default (8 ms + 2 ms per running request) is not what these engines run at
    assert min(c.decode_step_s for c in sim._candidates) > 0.008 * 1.3


def test_a_router_that_does_not_read_the_histogram_keeps_the_configured_step():
    spec = dataclasses.replace(ClusterSpec(mixed=2, cache_tokens=60_000, told=False), decode_step_measured=False)
    sim = Simulation(TRACE, spec, policy_for("ttft", spec, 0))
    sim.run()
    assert sim.decode_steps is None and all(c.decode_step_s is None for c in sim._candidates)


def test_a_config_that_turns_the_measurement_off_is_honoured():
    from router.config.engines import EnginesConfig
    from router.tools.replay.calibrate import ReplayDecodeSteps

    spec = ClusterSpec(mixed=2, cache_tokens=60_000, told=False)
    sim = Simulation(TRACE, spec, policy_for("ttft", spec, 0))
    sim.decode_steps = ReplayDecodeSteps(sim._candidates, [n.engine for n in sim.nodes], sim._clock,
                                         EnginesConfig(decode_step={"enabled": False}))
    sim.run()
    assert all(c.decode_step_s is None for c in sim._candidates)
