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


def test_a_pd_decode_instance_is_priced_at_its_engines_speed_on_the_configured_shape():
    """The router left on the config's decode step model (8 ms + 0.2 ms a request), engines ~3.5x slower:
    each decode instance's step, at the batch its engine ran, comes out at what its tokens saw."""
    from router.scheduling.framework import View
    from router.scheduling.pd_cost import decode_step_seconds
    from router.state.base import Load

    trace = generate("multi_turn:sessions=24,turns=3,rate=4,think=1,system=1024,user=300,output=128", 5)
    spec = ClusterSpec(prefill=2, decode=2, profile="llama3-70b-h100x4", slowdown=1.7, decode_steps_told=False)
    sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
    sim.run()
    pd = spec.pd_config()
    assert pd.decode_step_base_s == 0.008  # not told: the config's default model
    decodes = [(n, c) for n, c in zip(sim.nodes, sim._candidates) if c.role == "decode"]
    assert len(decodes) == 2
    for node, cand in decodes:
        seen = node.engine.counters.itl_seconds / node.engine.counters.itl_tokens
        assert cand.decode_step_batch is not None and cand.decode_step_batch >= 1
        at = Load(round(cand.decode_step_batch), 0, int(cand.decode_step_kv_share * cand.cache_tokens), 0)
        unmeasured = dataclasses.replace(cand, decode_step_s=None, decode_step_batch=None)
        assert decode_step_seconds(View(unmeasured, 0, at, None, None, 1.0), pd) < 0.5 * seen
        assert decode_step_seconds(View(cand, 0, at, None, None, 1.0), pd) == pytest.approx(seen, rel=0.3)


def test_a_slower_decode_instance_is_measured_slower_and_never_told():
    from router.tools.replay.cluster import build_cluster

    spec = ClusterSpec(prefill=1, decode=2, slowdown=1.5, decode_slowdowns=(2.5,), tbt_target_s=0.07)
    nodes = build_cluster(spec)
    assert [n.engine.time_multiplier for n in nodes] == [1.5, 1.5 * 2.5, 1.5]
    assert spec.pd_config().tbt_target_s == 0.07 and ClusterSpec(prefill=1, decode=1).pd_config().tbt_target_s == 0.1
    with pytest.raises(ValueError):
        ClusterSpec(decode=1, decode_slowdowns=(0.0,))
    trace = generate("multi_turn:sessions=24,turns=3,rate=4,think=1,system=1024,user=300,output=128", 5)
    sim = Simulation(trace, spec, policy_for("ttft", spec, 0))
    sim.run()
    d0, d1 = (c for c in sim._candidates if c.role == "decode")
    assert d0.decode_step_s is not None and d1.decode_step_s is not None
    assert d0.decode_step_s > 1.8 * d1.decode_step_s  # the slow one is seen as slow; the config says nothing of it
