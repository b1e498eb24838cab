"""A PD decode instance's measured step scales the configured step model (pd_cost.decode_step_seconds):
the TBT filter, the admission wait and the stall budget then see the engine's own speed."""

import dataclasses
import random

import pytest

from router.config.model import PDConfig, PolicyConfig
from router.scheduling import Candidate, RouteRequest, build_policy
from router.scheduling.framework import View
from router.scheduling.pd_cost import MAX_STEP_SCALE, decode_step_seconds
from router.state.base import Load, Snapshot

COMPAT = ("m", "auto", 16, "vllm")
PD = PDConfig(decode_step_base_s=0.01, decode_step_per_request_s=0.001, decode_step_per_kv_token_s=1e-7)


def decode(**kw: object) -> Candidate:
    return Candidate("d1", cache_tokens=100_000, prefill_tokens_per_s=10_000.0, role="decode", compat=COMPAT,
                     **kw)  # type: ignore[arg-type]


def view(c: Candidate, load: Load) -> View:
    return View(c, 0, load, None, None, 1.0)


def test_without_a_measurement_the_configured_model_prices_the_step():
    # 10 ms + 20 requests x 1 ms + 50K KV tokens x 0.1 us
    assert decode_step_seconds(view(decode(), Load(20, 0, 50_000, 0)), PD) == pytest.approx(0.035)
    # a step measured where the engine reported no batch cannot be placed on the model: configured
    c = decode(decode_step_s=0.2)
    assert decode_step_seconds(view(c, Load(20, 0, 50_000, 0)), PD) == pytest.approx(0.035)


def test_a_measured_step_scales_the_model_by_its_ratio_at_the_batch_it_was_measured_at():
    # measured 60 ms at 10 running and 40% of 100K KV: the model says 10 + 10 + 4 = 24 ms there, so 2.5x
    c = decode(decode_step_s=0.06, decode_step_batch=10.0, decode_step_kv_share=0.4)
    assert decode_step_seconds(view(c, Load(10, 0, 40_000, 0)), PD) == pytest.approx(0.06)  # the measurement itself
    # the model's shape, the engine's speed: 20 running and 50K KV -> 35 ms x 2.5
    assert decode_step_seconds(view(c, Load(20, 0, 50_000, 0)), PD) == pytest.approx(0.0875)
    # with this request added (what the TBT filter asks)
    assert decode_step_seconds(view(c, Load(20, 0, 50_000, 0)), PD, 1, 10_000) == pytest.approx(2.5 * 0.037)
    # a faster engine than configured scales down alike
    fast = dataclasses.replace(c, decode_step_s=0.012)
    assert decode_step_seconds(view(fast, Load(20, 0, 50_000, 0)), PD) == pytest.approx(0.5 * 0.035)


def test_the_scale_is_bounded():
    c = decode(decode_step_s=1.0, decode_step_batch=0.0)  # 100x the configured 10 ms
    assert decode_step_seconds(view(c, Load()), PD) == pytest.approx(0.01 * MAX_STEP_SCALE)
    zero = PDConfig(decode_step_base_s=0.0, decode_step_per_request_s=0.0, decode_step_per_kv_token_s=0.0)
    assert decode_step_seconds(view(c, Load(5, 0, 0, 0)), zero) == 0.0  # nothing to scale: no division by zero


def test_the_tbt_filter_skips_a_decode_instance_whose_engine_steps_slower_than_configured():
    """Two decode instances with the same bookings; d1's engine measures 3x the configured step,
    which passes the TBT target with this request added, so the pair goes to d2."""
    p = Candidate("p1", cache_tokens=100_000, prefill_tokens_per_s=10_000.0, role="prefill", compat=COMPAT)
    d1 = decode(decode_step_s=0.066, decode_step_batch=10.0, decode_step_kv_share=0.1)  # model there: 22 ms
    d2 = dataclasses.replace(decode(), id="d2")
    cands = [p, d1, d2]
    loads = {"d1": Load(10, 0, 10_000, 0), "d2": Load(12, 0, 10_000, 0)}  # d2 a little busier
    snap = Snapshot({c.id: 0 for c in cands}, {c.id: loads.get(c.id, Load()) for c in cands})
    pd = PD.model_copy(update={"tbt_target_s": 0.05})
    req = RouteRequest("r", tuple(range(64)), 4096, 128, 64)
    picked = build_policy(PolicyConfig(), pd, random.Random(1)).choose(req, cands, snap)
    assert picked.instance == "d2"
    # told nothing, d1 is the less loaded and is chosen
    unmeasured = [p, decode(), d2]
    assert build_policy(PolicyConfig(), pd, random.Random(1)).choose(req, unmeasured, snap).instance == "d1"


def test_isolations_stall_arithmetic_keeps_the_pure_step():
    """The measured inter-token latency holds the stalls of prefill chunks on D, which the stall
    budget prices itself: it must not count them again through a slower step."""
    from router.config.model import TTFTWeights
    from router.scheduling.stall_budget import decode_steps_per_s, stall_steps

    w = TTFTWeights(request_overhead_s=0.0, attention_s_per_token2=0.0)
    load = Load(10, 0, 10_000, 0)
    pure, slow = decode(), decode(decode_step_s=0.063, decode_step_batch=10.0, decode_step_kv_share=0.1)
    req = RouteRequest("r", tuple(range(16)), 900, 128, 64)  # one 90 ms chunk at 10K tokens/s
    pd = PD.model_copy(update={"tbt_target_s": 0.12})
    # 90 ms + the 21 ms configured step passes no 0.12 s target; + the 63 ms measured one would
    assert stall_steps(req, view(pure, load), w, pd, 0.12) == stall_steps(req, view(slow, load), w, pd, 0.12) == 0
    assert decode_steps_per_s([view(slow, load)], pd) == decode_steps_per_s([view(pure, load)], pd)
    # while the TBT filter's question, what this request's tokens will wait, is the measured one
    assert decode_step_seconds(view(slow, load), pd) == pytest.approx(3 * decode_step_seconds(view(pure, load), pd))


def test_the_wait_for_kv_room_on_d_runs_at_the_measured_step():
    """Running decodes free KV room a step at a time: on an engine stepping 3x slower than
    configured the wait is 3x longer, while the route's first step stays the pure one."""
    from router.config.model import TTFTWeights
    from router.scheduling.pd_cost import admission_seconds, route_cost

    load = Load(10, 0, 99_000, 0)  # 1,000 tokens of room left
    pure, slow = decode(), decode(decode_step_s=0.063, decode_step_batch=10.0, decode_step_kv_share=0.1)
    req = RouteRequest("r", tuple(range(64)), 4096, 128, 64)
    waited = admission_seconds(req, view(pure, load), PD)
    assert waited > 0 and admission_seconds(req, view(slow, load), PD) == pytest.approx(3 * waited)
    p = Candidate("p1", cache_tokens=100_000, prefill_tokens_per_s=10_000.0, role="prefill", compat=COMPAT)
    w = TTFTWeights()
    assert (route_cost(req, view(slow, load), view(p, Load()), w, PD).step_s
            == route_cost(req, view(pure, load), view(p, Load()), w, PD).step_s)


def test_the_pd_tbt_scorer_prefers_the_decode_instance_whose_engine_steps_faster():
    """Two decode instances alike to the config, one measured 3x slower: the TTFT scorer alone
    cannot tell them apart (the step is not a TTFT term), pd_tbt weighed in takes the faster."""
    p = Candidate("p1", cache_tokens=100_000, prefill_tokens_per_s=10_000.0, role="prefill", compat=COMPAT)
    slow = decode(decode_step_s=0.063, decode_step_batch=10.0, decode_step_kv_share=0.1)  # 3x the model there
    fast = dataclasses.replace(decode(), id="d2")
    cands = [p, slow, fast]
    loads = {"d1": Load(10, 0, 10_000, 0), "d2": Load(10, 0, 10_000, 0)}
    snap = Snapshot({c.id: 0 for c in cands}, {c.id: loads.get(c.id, Load()) for c in cands})
    req = RouteRequest("r", tuple(range(64)), 4096, 128, 64)
    pipeline = {"routes": "pd_pairs", "scorers": ["pd_ttft", {"name": "pd_tbt", "weight": 0.5}],
                "picker": {"name": "max_score", "params": {"tolerance": 0.05}}}
    with_tbt = PolicyConfig.model_validate({"pipeline": pipeline})
    assert {build_policy(with_tbt, PD, random.Random(s)).choose(req, cands, snap).instance for s in range(20)} == {"d2"}
    alone = PolicyConfig.model_validate({"pipeline": {**pipeline, "scorers": ["pd_ttft"]}})
    assert {build_policy(alone, PD, random.Random(s)).choose(req, cands, snap).instance for s in range(20)} == {"d1", "d2"}
    # the scores themselves: best / each route's step with this request added
    from router.scheduling.pd import PDTBTScorer

    views = [View(slow, 0, loads["d1"], None, None, 1.0), View(fast, 0, loads["d2"], None, None, 1.0)]
    assert PDTBTScorer(PD).score(req, views) == pytest.approx([1 / 3, 1.0])
