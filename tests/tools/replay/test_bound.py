"""The replay's bound is below every policy, gap_closed and the capacity sweep mean what they say."""

import json
import math

import pytest

from router.cli import main
from router.tools.replay.bound import (LRU_ALONE, add_gap_closed, bound_summary, bound_ttfts, gap_closed, lru_summary, lru_ttfts,
                                      reference_summaries)
from router.tools.replay.capacity import sustained
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import replay
from router.tools.replay.sim import Simulation
from router.tools.replay.run import policy_for
from router.tools.replay.synthetic import generate
from router.tools.replay.trace import Trace, TraceRequest

WORKLOAD = "multi_turn:sessions=10,turns=3,rate=4,think=1,system=1024,user=300,output=16"


@pytest.mark.parametrize("cluster", [{"mixed": 3}, {"prefill": 1, "decode": 2}])
def test_no_policy_beats_the_bound_on_any_request(cluster):
    trace = generate(WORKLOAD, 2)
    spec = ClusterSpec(cache_tokens=60_000, **cluster)
    bound, _, _ = bound_ttfts(trace, spec)
    for name in ("round_robin", "sglang_cache_aware", "ttft"):
        sim = Simulation(trace, spec, policy_for(name, spec, 0))
        sim.run()
        rec = sim.record
        for i, b in enumerate(bound):
            actual = rec.first_token[i] - rec.arrival[i]
            assert b <= actual + 1e-9, (name, i, b, actual)
    summary = bound_summary(trace, spec, 1.0)
    assert summary["ttft_p90"] <= min(replay(trace, spec, n).summary["ttft_p90"] for n in ("random", "ttft"))


def test_the_bound_caches_every_earlier_block_and_only_those():
    spec = ClusterSpec(mixed=1, cache_tokens=100_000)
    first = TraceRequest(0.0, 2048, 4, (1, 2, 3, 4))
    again = TraceRequest(100.0, 2048, 4, (1, 2, 3, 4))
    other = TraceRequest(200.0, 2048, 4, (9, 8, 7, 6))
    bound, cached, prompt = bound_ttfts(Trace("t", 512, (first, again, other)), spec)
    assert bound[1] < bound[0] / 5  # all but the last block cached
    assert math.isclose(bound[2], bound[0])  # nothing in common: a cold prefill
    assert prompt == 3 * 2048 and 0 < cached < 2048


def test_gap_closed_is_the_share_of_the_way_from_the_best_baseline_to_the_bound():
    assert gap_closed(1.0, 2.0, 0.0) == 0.5
    assert gap_closed(2.0, 2.0, 1.0) == 0.0 and gap_closed(0.0 + 1.0, 2.0, 1.0) == 1.0
    assert gap_closed(3.0, 2.0, 1.0) == -1.0
    assert math.isnan(gap_closed(1.0, 1.0, 0.999))  # no gap worth the name


def test_sustained_is_the_highest_scale_within_the_slo_with_every_lower_one():
    assert sustained([(1, 0.2), (2, 0.4), (4, 0.9), (8, 3.0)], 1.0) == 4
    assert sustained([(1, 0.2), (2, 1.5), (4, 0.9)], 1.0) == 1  # a recovery above a failure is not trusted
    assert sustained([(1, 2.0)], 1.0) == 0.0


def test_the_sweep_command_writes_capacities(tmp_path, capsys):
    out = tmp_path / "cap"
    spec = "synthetic:shared_prefix:groups=4,users=2,system=1024,question=256,output=16,stages=4x10"
    assert main(["replay", spec, "--mixed", "2", "--cache-tokens", "200000", "--quiet", "--out", str(out),
                 "--policy", "round_robin", "ttft", "--sweep", "1,4,64", "--ttft-slo", "0.5"]) == 0
    result = json.loads((out / "capacity.json").read_text())
    assert set(result["capacity"]) == {"round_robin", "ttft"}
    assert result["best_baseline"] == "round_robin"
    for name, rows in result["p90"].items():
        cap = result["capacity"][name]
        assert all(float(p90) <= 0.5 for scale, p90 in rows.items() if float(scale) <= cap)
    assert "capacity" in (out / "capacity.md").read_text() and "| ttft |" in capsys.readouterr().out
    assert main(["replay", spec, "--sweep", "1,0"]) == 2


def test_the_bound_runs_at_the_engines_step_time_slowdown():
    trace = generate(WORKLOAD, 2)
    plain, _, _ = bound_ttfts(trace, ClusterSpec(mixed=2, cache_tokens=60_000))
    slow, _, _ = bound_ttfts(trace, ClusterSpec(mixed=2, cache_tokens=60_000, slowdown=2.0))
    assert slow == pytest.approx([2 * t for t in plain], rel=1e-9)


def _blocks(first: int, n: int) -> tuple[int, ...]:
    return tuple(range(first, first + n))


def test_lru_alone_is_the_bound_when_the_caches_hold_everything():
    trace = generate(WORKLOAD, 2)
    spec = ClusterSpec(mixed=2, cache_tokens=10_000_000)
    assert lru_ttfts(trace, spec) == bound_ttfts(trace, spec)


def test_lru_alone_loses_a_prefix_the_cluster_cache_evicted_and_keeps_one_touched_since():
    # one engine of 64 blocks of 16 tokens (1,024 tokens); two engines double it
    a, b, c = _blocks(1, 2), _blocks(10, 2), _blocks(20, 2)  # 1,024-token prompts: 64 blocks each
    reqs = (TraceRequest(0.0, 1024, 4, a), TraceRequest(10.0, 1024, 4, b), TraceRequest(20.0, 1024, 4, a),
            TraceRequest(30.0, 1024, 4, c), TraceRequest(40.0, 1024, 4, a), TraceRequest(50.0, 1024, 4, b))
    trace = Trace("t", 512, reqs)
    inf, _, _ = bound_ttfts(trace, ClusterSpec(mixed=2, cache_tokens=1024))
    two, _, _ = lru_ttfts(trace, ClusterSpec(mixed=2, cache_tokens=1024))  # room for two prompts
    one, cached, _ = lru_ttfts(trace, ClusterSpec(mixed=1, cache_tokens=1024))  # room for one
    cold = inf[0]
    assert inf[2] < cold / 5 and inf[5] < cold / 5  # the bound remembers everything
    # two prompts' room: a is touched again at 20 s, so c evicts b, not a
    assert two[2] == pytest.approx(inf[2]) and two[4] == pytest.approx(inf[4]) and two[5] == pytest.approx(cold)
    # one prompt's room: every return is cold
    assert one == pytest.approx([cold] * len(reqs)) and cached == 0


def test_the_lru_row_is_a_reference_not_a_baseline():
    trace = generate(WORKLOAD, 2)
    spec = ClusterSpec(mixed=2, cache_tokens=60_000)
    bound, lru = bound_summary(trace, spec, 1.0), lru_summary(trace, spec, 1.0)
    assert reference_summaries(trace, spec, 1.0) == (bound, lru)  # one pass, the same rows
    assert lru["policy"] == LRU_ALONE and lru["ttft_p90"] >= bound["ttft_p90"]
    slow = {"policy": "round_robin", "ttft_p90": 10.0}
    rows = [slow, lru]
    assert add_gap_closed(rows, bound) == "round_robin"  # the reference is never the best baseline
    assert lru["gap_closed"] == pytest.approx(gap_closed(float(lru["ttft_p90"]), 10.0, float(bound["ttft_p90"])))


def test_the_replay_command_prints_the_lru_row(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["replay", "synthetic:" + WORKLOAD, "--mixed", "2", "--cache-tokens", "60000", "--quiet",
                 "--out", str(out), "--policy", "round_robin"]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())}
    assert set(rows) == {"round_robin", "bound", LRU_ALONE}
    assert rows[LRU_ALONE]["gap_closed"] is not None and f"| {LRU_ALONE} |" in capsys.readouterr().out
