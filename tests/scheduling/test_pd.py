"""Pair scoring: each cost term moves the choice the way it should."""

import random

from router.config.model import PDConfig, PolicyConfig
from router.scheduling import Candidate, RouteRequest, build_policy
import pytest

from router.scheduling.pd import NoRoute
from router.state.base import Load, Snapshot

COMPAT = ("m", "auto", 16, "vllm")


def cand(id, role, **kw):
    return Candidate(id, cache_tokens=kw.pop("cache_tokens", 400_000), prefill_tokens_per_s=kw.pop("rate", 10_000.0),
                     role=role, compat=kw.pop("compat", COMPAT), **kw)


def req(prompt=8192, blocks=128, max_tokens=256):
    return RouteRequest("r", tuple(range(blocks)), prompt, max_tokens, 64)


def snap(cands, matched=None, loads=None):
    matched, loads = matched or {}, loads or {}
    return Snapshot({c.id: matched.get(c.id, 0) for c in cands}, {c.id: loads.get(c.id, Load()) for c in cands})


def policy(**pd):
    return build_policy(PolicyConfig(), PDConfig(**pd), random.Random(3))


P1, P2 = cand("p1", "prefill", zone="z1"), cand("p2", "prefill", zone="z1")
D1, D2 = cand("d1", "decode", zone="z1"), cand("d2", "decode", zone="z1")
CLUSTER = [P1, P2, D1, D2]


def test_idle_cluster_disaggregates_long_prompts():
    d = policy().choose(req(), CLUSTER, snap(CLUSTER))
    assert d.mode == "disaggregated" and d.prefill in {"p1", "p2"} and d.instance in {"d1", "d2"}
    assert d.estimate_s and d.estimate_s == d.terms[d.key]["ttft_s"]
    for key in ("queue_s", "prefill_s", "transfer_s", "admission_s", "decode_step_s"):
        assert key in d.terms[d.key]


def test_pair_avoids_a_queued_prefill_instance():
    d = policy().choose(req(), CLUSTER, snap(CLUSTER, loads={"p1": Load(3, 60_000, 0, 0)}))
    assert d.prefill == "p2"


def test_pair_follows_the_cached_prefix():
    d = policy().choose(req(), CLUSTER, snap(CLUSTER, matched={"p2": 120}))
    assert d.prefill == "p2" and d.terms[d.key]["prefill_tokens"] == 8192 - 120 * 64


def test_pair_avoids_a_congested_link():
    s = snap(CLUSTER, loads={"p1": Load(0, 0, 0, 12, 48 << 30), "d1": Load(0, 0, 0, 12, 48 << 30)})
    d = policy().choose(req(), CLUSTER, s)
    assert d.prefill == "p2" and d.instance == "d2"
    assert d.terms["d1<-p1"]["transfer_s"] > 5 * d.terms["d2<-p2"]["transfer_s"]


def test_pair_prefers_a_closer_link():
    far = cand("p_far", "prefill", zone="z9")
    near = cand("p_near", "prefill", zone="z1", node="n1")
    dn = cand("dn", "decode", zone="z1", node="n1")
    cands = [far, near, dn]
    d = policy().choose(req(), cands, snap(cands))
    assert d.prefill == "p_near"


def test_pair_avoids_a_decode_without_kv_room():
    s = snap(CLUSTER, loads={"d1": Load(50, 0, 398_000, 0)})
    d = policy().choose(req(), CLUSTER, s)
    assert d.instance == "d2"


def test_selective_disaggregation_threshold_both_ways():
    # d1 already caches all but 64 tokens: below the threshold, run on d1 alone
    s = snap(CLUSTER, matched={"d1": 127})
    d = policy(selective_threshold_tokens=512).choose(req(), CLUSTER, s)
    assert d.mode == "decode_only" and d.instance == "d1" and d.prefill is None
    # with a threshold of 0 the same state is disaggregated (transfer of 64 tokens is cheap)
    d = policy(selective_threshold_tokens=0).choose(req(), CLUSTER, s)
    assert d.mode in {"disaggregated", "decode_only"}
    # nothing cached on any decode: remote prefill
    d = policy(selective_threshold_tokens=512).choose(req(), CLUSTER, snap(CLUSTER))
    assert d.mode == "disaggregated"


def test_prefill_pool_slower_than_local_prefill_runs_on_decode():
    loads = {"p1": Load(10, 400_000, 0, 0), "p2": Load(10, 400_000, 0, 0)}
    d = policy().choose(req(), CLUSTER, snap(CLUSTER, loads=loads))
    assert d.mode == "decode_only" and d.reason == "decode_only_faster"


def test_incompatible_instances_are_never_paired():
    odd = cand("p_odd", "prefill", compat=("m", "fp8", 16, "vllm"), rate=1e9)  # fastest by far, but fp8 KV
    cands = [odd, P1, D1]
    for _ in range(20):
        d = policy().choose(req(), cands, snap(cands))
        assert d.prefill != "p_odd"
    only_odd = [odd, D1]
    d = policy().choose(req(), only_odd, snap(only_odd))
    assert d.prefill is None and d.mode == "decode_only"


def test_independent_baseline_ignores_transfer_and_decode_cache():
    pol = build_policy(PolicyConfig(name="cache_aware", seed=1), PDConfig())
    d = pol.choose(req(), CLUSTER, snap(CLUSTER, matched={"p1": 128}, loads={"d1": Load(5, 0, 0, 0)}))
    assert d.mode == "disaggregated" and d.prefill == "p1" and d.instance == "d2"
    assert d.reason.startswith("independent")


def test_sglang_decode_workers_never_serve_alone():
    sp = cand("sp", "prefill", compat=("m", "auto", 16, "sglang"))
    sd = cand("sd", "decode", compat=("m", "auto", 16, "sglang"), standalone=False)
    cands = [sp, sd]
    d = policy().choose(req(), cands, snap(cands, matched={"sd": 127}))  # even with the prefix cached on D
    assert d.mode == "disaggregated" and d.prefill == "sp"
    with pytest.raises(NoRoute):
        policy().choose(req(), [sd], snap([sd]))


def test_isolation_keeps_a_long_prefill_off_decode_instances_with_decodes_running():
    # both prefill instances are swamped: without isolation the prompt runs on a decode instance
    queued = {"p1": Load(10, 400_000, 0, 0), "p2": Load(10, 400_000, 0, 0)}
    busy = {**queued, "d1": Load(30, 0, 30_000, 0), "d2": Load(30, 0, 30_000, 0)}
    assert policy().choose(req(), CLUSTER, snap(CLUSTER, loads=busy)).reason == "decode_only_faster"
    isolated = policy(handoff={"link_aware": True, "isolation": "strict"})
    d = isolated.choose(req(), CLUSTER, snap(CLUSTER, loads=busy))
    # an 8K chunk (0.8 s at 10K tokens/s) would hold 30 running decodes far past the 0.1 s TBT target
    assert d.mode == "disaggregated" and not any(r.startswith("d") and "<-" not in r for r in d.terms)
    # an idle decode instance stalls nobody: it may still prefill for itself
    d = isolated.choose(req(), CLUSTER, snap(CLUSTER, loads={**queued, "d1": Load(30, 0, 30_000, 0)}))
    assert d.mode == "decode_only" and d.instance == "d2"
    # a short prompt's chunk fits within the target: decode instances may take it
    short = RouteRequest("r", tuple(range(12)), 700, 64, 64)
    d = isolated.choose(short, CLUSTER, snap(CLUSTER, loads=busy))
    assert d.mode == "decode_only"


def test_isolation_by_budget_lets_each_busy_decode_instance_take_one_stalling_prefill_at_a_time():
    queued = {"p1": Load(10, 400_000, 0, 0), "p2": Load(10, 400_000, 0, 0)}
    busy = {**queued, "d1": Load(30, 0, 30_000, 0), "d2": Load(30, 0, 30_000, 0)}
    budget = policy(handoff={"link_aware": True})  # isolation: auto = budget with link_aware
    # nothing stalling queued on either: the long prompt may run on a decode instance, as without isolation
    assert budget.choose(req(), CLUSTER, snap(CLUSTER, loads=busy)).mode == "decode_only"
    # d1 already has a long prefill queued (its chunks stall its decodes): only d2 is offered
    one_taken = {**busy, "d1": Load(31, 30_000, 60_000, 0)}
    for _ in range(10):
        d = budget.choose(req(), CLUSTER, snap(CLUSTER, loads=one_taken))
        assert d.instance != "d1" or d.mode == "disaggregated"
    assert budget.choose(req(), CLUSTER, snap(CLUSTER, loads=one_taken)).instance == "d2"
    # both taken: the prompt goes to a pair, however long the prefill queues
    both = {**one_taken, "d2": Load(31, 30_000, 60_000, 0)}
    assert budget.choose(req(), CLUSTER, snap(CLUSTER, loads=both)).mode == "disaggregated"
    # a short prefill queued on d1 stalls nobody past the target: it does not use up d1's turn
    short_queued = {**busy, "d1": Load(31, 700, 31_000, 0), "d2": Load(31, 30_000, 60_000, 0)}
    d = budget.choose(req(), CLUSTER, snap(CLUSTER, loads=short_queued))
    assert d.mode == "decode_only" and d.instance == "d1"
