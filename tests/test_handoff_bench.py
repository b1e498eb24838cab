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
