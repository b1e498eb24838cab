"""Isolation by a TBT objective in the replay (loadtests/burst_objective.py): the same
policy object as live, spending the TBT tail it is allowed on a burst of long prompts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # loadtests/ is not an installed package

from loadtests.burst_objective import DRAW_SEED, Shape, drawn, run  # noqa: E402
from router.config.model import RouterConfig  # noqa: E402
from router.scheduling import build_policy  # noqa: E402
from router.tools.replay.cluster import ClusterSpec  # noqa: E402
from router.tools.replay.run import policy_for  # noqa: E402


def test_the_objective_keeps_the_stalled_share_within_its_quantile_where_no_isolation_passes_it() -> None:
    shape = Shape.parse("32x32000/4+4/50")
    off = run(shape, 0, False, "auto")
    strict = run(shape, 0, False, "strict")
    objective = run(shape, 0, True, "objective")
    assert off.stalled > 0.01 and off.tbt_p99 > 0.1  # without isolation the burst's chunks set the p99
    assert objective.stalled <= 0.01 and objective.tbt_p99 <= 0.1  # p99 under pd.tbt_target_s
    # it spends the tail on TTFT: some long prompts prefill on decode instances, unlike strict isolation
    assert strict.long_local == 0 < objective.long_local < off.long_local
    assert objective.ttft_p90 < strict.ttft_p90


def test_the_saturation_measure_tells_a_burst_that_fills_the_decode_nics_from_one_that_does_not() -> None:
    # burst_objective_rule.md item 1, measured without link-aware booking: six prefill instances sending a
    # burst into two decode NICs move most of its KV on a divided link; four into four move most of it alone
    into_two = run(Shape.parse("24x32000/6+2/50"), 0, False, "auto")
    four_by_four = run(Shape.parse("32x32000/4+4/50"), 0, False, "auto")
    assert into_two.link_shared >= 0.5 > four_by_four.link_shared
    assert into_two.nic_peak > 0.7 > four_by_four.nic_peak > 0  # the two decode NICs are busy most of the burst


def test_the_held_out_shapes_are_drawn_from_their_seed_alone() -> None:
    shapes = drawn(6)
    assert shapes == drawn(6) != drawn(6, seed=DRAW_SEED + 1)
    for s in shapes:
        assert 8000 <= s.tokens <= 64000 and 6 <= s.prefill + s.decode <= 8 and 2 <= s.prefill <= 6 and s.decode >= 2
        assert Shape.parse(f"{s.prompts}x{s.tokens}/{s.prefill}+{s.decode}/{s.gbps:g}/{s.spread_s:g}/{s.background}") == s


def test_a_replay_of_the_objective_needs_the_virtual_clock() -> None:
    spec = ClusterSpec(prefill=1, decode=1, link_aware=True, isolation="objective")
    with pytest.raises(ValueError, match="VirtualClock"):
        policy_for("ttft", spec, 0)


def test_the_live_router_builds_the_same_objective_from_its_config() -> None:
    cfg = RouterConfig.model_validate({
        "instances": [{"url": "http://127.0.0.1:1", "role": "prefill"},
                      {"url": "http://127.0.0.1:2", "role": "decode"}],
        "pd": {"handoff": {"link_aware": True, "isolation": "objective",
                           "tbt_objective": {"quantile": 0.95, "window_s": 30}}}})
    policy = build_policy(cfg.policy, cfg.pd)
    stalls = policy.routes.stalls  # type: ignore[attr-defined]
    assert stalls is not None and stalls.ledger.spent() == 0
    assert stalls.allowance([]) == 0  # nothing decoding: no step to stall
