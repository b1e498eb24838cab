"""Isolation by a TBT objective: the priced stall of a decode-alone prefill, the window's
ledger, and the policy that spends (1 - q) of the pool's decode steps and no more."""

import random

import pytest

from router.config.handoff import TBTObjective
from router.config.model import PDConfig, PolicyConfig, TTFTWeights
from router.scheduling import Candidate, RouteRequest, build_policy
from router.scheduling.framework import View
from router.scheduling.stall_budget import StallLedger, decode_steps_per_s, stall_steps
from router.state.base import Load, Snapshot

COMPAT = ("m", "auto", 16, "vllm")
W = TTFTWeights(request_overhead_s=0.0, attention_s_per_token2=0.0)
PD = PDConfig()  # 8192-token chunks, tbt_target_s 0.1


def cand(id, role):
    return Candidate(id, cache_tokens=400_000, prefill_tokens_per_s=10_000.0, role=role, compat=COMPAT, zone="z1")


def view(load):
    return View(cand("d1", "decode"), 0, load, None, None, 1.0)


def req(prompt, rid="r"):
    return RouteRequest(rid, tuple(range(prompt // 64)), prompt, 256, 64)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_each_chunk_that_passes_the_target_stalls_every_decode_there():
    # 32K at 10K tokens/s: four 8K chunks of 0.8 s each, each holding the 10 decodes running there
    assert stall_steps(req(32_768), view(Load(10, 0, 10_000, 0)), W, PD, 0.1) == 40
    # nobody decoding there: nothing to stall
    assert stall_steps(req(32_768), view(Load()), W, PD, 0.1) == 0
    # a 700-token prompt's chunk (70 ms + the step) fits within the target
    assert stall_steps(req(700), view(Load(10, 0, 10_000, 0)), W, PD, 0.1) == 0
    # a looser target lets the same chunks through
    assert stall_steps(req(32_768), view(Load(10, 0, 10_000, 0)), W, PD, 1.0) == 0


def test_a_short_prompt_stalls_when_it_tips_the_step_it_shares_with_the_queue_past_the_target():
    # 100 tokens queued: the engine packs our 700 into the same step, 80 ms + a decode step
    assert stall_steps(req(700), view(Load(10, 100, 10_000, 0)), W, PD, 0.1) == 0
    # 600 queued (70 ms with the step): with ours the step holds 1,300 tokens (140 ms), a stall ours caused
    assert stall_steps(req(700), view(Load(10, 600, 10_000, 0)), W, PD, 0.1) == 10
    # 8,000 queued in one step stalls already: ours adds no stalled step of its own (rest: 508 tokens)
    assert stall_steps(req(700), view(Load(10, 8_000, 10_000, 0)), W, PD, 0.1) == 0


def test_the_decodes_stalled_are_those_booked_there_now():
    # 16K queued ahead: our four chunks run later, and hold the 10 decodes booked now, however long the wait
    assert stall_steps(req(32_768), view(Load(10, 16_384, 10_000, 0)), W, PD, 0.1) == 40
    assert stall_steps(req(32_768), view(Load(25, 16_384, 10_000, 0)), W, PD, 0.1) == 100


def test_the_ledger_forgets_what_left_the_window_and_counts_a_request_once():
    clock = Clock()
    ledger = StallLedger(10.0, 3, clock)
    ledger.book("a", 30)
    ledger.book("a", 20)  # decided again: replaces its own entry
    clock.now = 4.0
    ledger.book("b", 5)
    assert ledger.spent() == 25 and len(ledger) == 2
    ledger.book("b", 0)  # revised to a route that stalls nobody
    assert ledger.spent() == 20
    clock.now = 10.5  # "a" was booked 10.5 s ago
    assert ledger.spent() == 0 and len(ledger) == 0
    for rid in "wxyz":  # bounded: the oldest goes first
        ledger.book(rid, 1)
    assert len(ledger) == 3 and ledger.spent() == 3


P1, P2, D1, D2 = cand("p1", "prefill"), cand("p2", "prefill"), cand("d1", "decode"), cand("d2", "decode")
CLUSTER = [P1, P2, D1, D2]
# both prefill instances swamped: without isolation a long prompt is faster on a decode instance
LOADS = {"p1": Load(10, 400_000, 0, 0), "p2": Load(10, 400_000, 0, 0),
         "d1": Load(30, 0, 30_000, 0), "d2": Load(30, 0, 30_000, 0)}
SNAP = Snapshot({c.id: 0 for c in CLUSTER}, LOADS)


def objective_policy(clock, prompts_allowed):
    """The objective's window sized so the pool's share (1%) holds ``prompts_allowed`` 8K stalls (30 decodes each)."""
    pd = PDConfig()
    d = View(D1, 0, LOADS["d1"], None, None, 1.0)
    rate = decode_steps_per_s([d, d._replace(candidate=D2)], pd)
    window = prompts_allowed * 30 / (0.01 * rate)
    pd = PDConfig(handoff={"link_aware": True, "isolation": "objective", "tbt_objective": {"window_s": window}})
    return build_policy(PolicyConfig(), pd, random.Random(3), clock=clock)


def test_the_objective_lets_decode_instances_take_stalling_prefills_while_the_window_has_room():
    clock = Clock()
    policy = objective_policy(clock, 2.5)
    r8k = RouteRequest("r1", tuple(range(128)), 8192, 256, 64)
    assert policy.choose(r8k, CLUSTER, SNAP).mode == "decode_only"
    assert policy.choose(r8k, CLUSTER, SNAP).mode == "decode_only"  # the same request again: counted once
    assert policy.choose(RouteRequest("r2", r8k.keys, 8192, 256, 64), CLUSTER, SNAP).mode == "decode_only"
    # two stalls of 30 spent, 15 left: a third would pass the share, so it goes to a pair
    d = policy.choose(RouteRequest("r3", r8k.keys, 8192, 256, 64), CLUSTER, SNAP)
    assert d.mode == "disaggregated"
    # a short prompt stalls nobody: decode instances still take it
    assert policy.choose(RouteRequest("r4", tuple(range(11)), 700, 64, 64), CLUSTER, SNAP).mode == "decode_only"
    clock.now = 1e6  # the window moved past every stall booked: room again
    assert policy.choose(RouteRequest("r5", r8k.keys, 8192, 256, 64), CLUSTER, SNAP).mode == "decode_only"


def test_the_budget_rule_alone_would_not_stop_at_the_share():
    # the one-at-a-time budget sees nothing queued in this snapshot, so it takes every one: the
    # objective's ledger is what stops the third
    policy = build_policy(PolicyConfig(), PDConfig(handoff={"link_aware": True, "isolation": "budget"}), random.Random(3))
    for i in range(4):
        assert policy.choose(RouteRequest(f"r{i}", tuple(range(128)), 8192, 256, 64), CLUSTER, SNAP).mode == "decode_only"


def test_the_objective_is_validated():
    assert TBTObjective().target_s is None and TBTObjective().quantile == 0.99
    with pytest.raises(ValueError):
        TBTObjective(quantile=1.0)
    with pytest.raises(ValueError):
        TBTObjective(window_s=0)


def test_a_stalled_step_costs_more_ttft_the_more_of_the_share_is_in_use():
    from router.scheduling.stall_budget import StallBudget

    clock = Clock()
    budget = StallBudget(TBTObjective(), W, PD, clock)  # target 0.1 s per stalled step at half the share
    # 100 steps free, none spent: a 10-step stall uses a tenth, priced 0.1 x 0.1/0.9 s per step
    assert budget.worth(10, 100, 0.12) and not budget.worth(10, 100, 0.10)
    # half the share for one route: 0.1 s per step, 5 s of TTFT for 50 steps
    assert budget.worth(50, 100, 5.01) and not budget.worth(50, 100, 4.99)
    # past the allowance: no TTFT buys it
    assert not budget.worth(101, 100, 1e9)
    budget.ledger.book("a", 80)  # 80 spent, 20 left: the same 10 steps are now at z = 0.9, 0.9 s per step
    assert budget.worth(10, 20, 9.01) and not budget.worth(10, 20, 8.99)


def test_a_pool_whose_decode_steps_are_priced_free_has_a_finite_rate():
    free = PDConfig(decode_step_base_s=0, decode_step_per_request_s=0, decode_step_per_kv_token_s=0)
    assert decode_steps_per_s([view(Load(10, 0, 0, 0))], free) == pytest.approx(10e6)
    assert decode_steps_per_s([view(Load())], free) == 0
