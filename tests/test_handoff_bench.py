"""Smoke tests of loadtests/handoff_bench.py: a clear message without the trace, a burst that bursts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # loadtests/ is not an installed package

from loadtests.handoff_bench import burst_trace  # noqa: E402


def test_a_missing_trace_is_reported_with_where_traces_live(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "loadtests" / "handoff_bench.py"), "estimate",
                          "--trace", str(tmp_path / "absent.jsonl")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "../shared/traces" in out.stderr


def test_the_burst_packs_its_long_prompts_into_half_a_second() -> None:
    trace = burst_trace(8, 20_000, 20, 0)
    long = [r for r in trace.requests if r.input_tokens == 20_000]
    assert len(long) == 8 and max(r.arrival_s for r in long) - min(r.arrival_s for r in long) <= 0.5
    assert len({r.blocks[0] for r in long}) == 8  # unique prompts: nothing to reuse, everything to move


def test_arrivals_are_spread_within_the_second_they_were_stamped() -> None:
    from loadtests.handoff_bench import draw_engines, spread_arrivals
    from router.tools.replay.trace import Trace, TraceRequest

    stamped = Trace("t", 16, tuple(TraceRequest(float(i // 4), 100, 10, (i,)) for i in range(40)))
    spread = spread_arrivals(stamped, 1.0, 3)
    assert len(spread.requests) == 40 and len({r.arrival_s for r in spread.requests}) == 40
    # within the stamped second (the trace is shifted to start at 0, by less than a second)
    assert all(abs(r.arrival_s - r.blocks[0] // 4) < 1.0 for r in spread.requests)
    assert [r.arrival_s for r in spread.requests] == sorted(r.arrival_s for r in spread.requests)
    assert spread_arrivals(stamped, 0.0, 3) is stamped
    assert draw_engines(4, (0.6, 1.2)) == draw_engines(4, (0.6, 1.2)) != draw_engines(5, (0.6, 1.2))


def test_the_grid_the_timestamps_were_rounded_to_is_read_from_the_trace() -> None:
    from loadtests.handoff_bench import stamp_resolution
    from router.tools.replay.trace import Trace, TraceRequest

    # ten requests every 3 s, one stamp a millisecond early (the conversation trace's :999)
    stamps = [3.0 * (i // 10) - (0.001 if i == 25 else 0.0) for i in range(60)]
    grid = Trace("t", 16, tuple(TraceRequest(t, 100, 10, (i,)) for i, t in enumerate(sorted(stamps))))
    assert stamp_resolution(grid) == 3.0
    assert stamp_resolution(Trace("t", 16, (TraceRequest(0.0, 100, 10, (1,)),))) == 0.0


def test_each_pd_request_is_measured_term_by_term_and_the_terms_add_up() -> None:
    import math

    import pytest

    from loadtests.estimate_terms import TERMS, by_term_rows, contributions, measured_terms
    from router.tools.replay.cluster import ClusterSpec
    from router.tools.replay.run import policy_for
    from router.tools.replay.sim import Simulation
    from router.tools.replay.trace import Trace, TraceRequest

    # three long prompts at once on a 1P + 1D cluster: they queue on P (or one goes to D alone)
    reqs = tuple(TraceRequest(0.0, 8000, 4, tuple(range(100 * k, 100 * k + 16))) for k in range(3))
    spec = ClusterSpec(prefill=1, decode=1, link_gbps=10.0, cache_tokens=400_000, prefill_chunk_tokens=8192)
    sim = Simulation(Trace("t", 512, reqs), spec, policy_for("ttft", spec, 0))
    rec = sim.run()
    pd = sorted(rec.milestones)
    assert pd and len(pd) == sum(1 for m in rec.mode if m == "disaggregated")
    for i in pd:
        m = measured_terms(rec, i)
        assert m is not None and min(m) >= 0
        assert sum(m) == pytest.approx(rec.first_token[i] - rec.arrival[i])
        assert m[2] == pytest.approx(rec.handoff[i])  # the transfer term is the handoff
    ends = [rec.milestones[i][1] for i in pd]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)  # FCFS on the one prefill engine
    rows = contributions(rec)
    assert len(rows) == len(rec.priced) == len(pd)
    for err, parts in rows:
        assert err == pytest.approx(sum(parts)) and not math.isnan(err)
    assert len(by_term_rows("vllm", rows)) == len(TERMS) + 1  # and P's queue + prefill together
