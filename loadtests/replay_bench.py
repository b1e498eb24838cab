"""Replay the Mooncake conversation trace on a colocated and a disaggregated cluster, every
policy, and record both tables (and wall time per policy) in docs/benchmarks.md.

    python loadtests/replay_bench.py [--trace ../shared/traces/conversation_trace.jsonl] [--write]

Each run is ``pd-router replay`` (see README, "Offline trace replay"); the tables are its
summary.md, the targets are the ones the project goes after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
RUNS = {
    "colocated, 8 mixed engines, arrivals x2": ["--mixed", "8", "--rate-scale", "2"],
    "disaggregated, 4 prefill + 4 decode, arrivals x1.5": ["--prefill", "4", "--decode", "4", "--rate-scale", "1.5"],
}


def targets(summary: list[dict]) -> str:
    rows = {r["policy"]: r for r in summary}
    ours = rows.get("ttft")
    baselines = [r for name, r in rows.items() if name not in ("ttft", "ttft_spread", "bound")]
    if ours is None or not baselines:
        return ""
    best = min(baselines, key=lambda r: r["ttft_p90"])
    greedy = max(baselines, key=lambda r: r["hit_ratio"])
    p90 = ours["ttft_p90"] / best["ttft_p90"]
    hit = ours["hit_ratio"] / greedy["hit_ratio"] if greedy["hit_ratio"] else float("nan")
    return (
        f"- `ttft` p90 TTFT {ours['ttft_p90']:.3f} s vs best baseline `{best['policy']}` {best['ttft_p90']:.3f} s: "
        f"{p90:.2f}× (target ≤ 0.5×: {'met' if p90 <= 0.5 else 'not met'})\n"
        f"- `ttft` hit ratio {ours['hit_ratio']:.3f} vs most cache-greedy `{greedy['policy']}` {greedy['hit_ratio']:.3f}: "
        f"{hit:.0%} (target ≥ 90%: {'met' if hit >= 0.9 else 'not met'}); max/mean load {ours['max_mean_load']:.2f} "
        f"(target ≤ 1.3: {'met' if ours['max_mean_load'] <= 1.3 else 'not met'})\n"
        + (f"- `ttft` gap closed to the bound: {ours['gap_closed']:.2f} (target ≥ 0.5: "
           f"{'met' if ours['gap_closed'] >= 0.5 else 'not met'})\n" if ours.get("gap_closed") is not None else "")
    )


def main(args: argparse.Namespace) -> int:
    trace = Path(args.trace)
    if not trace.exists():
        print(f"trace not found: {trace} (the public traces live in ../shared/traces; see its README.md)", file=sys.stderr)
        return 2
    for title, extra in RUNS.items():
        with tempfile.TemporaryDirectory(prefix="pdr-replay-") as out:
            cmd = ["pd-router", "replay", str(trace), *extra, "--out", out, "--quiet"]
            print("$", " ".join(cmd), flush=True)
            subprocess.run([sys.executable, "-m", "router", *cmd[1:]], check=True)
            table = (Path(out) / "summary.md").read_text()
            table = "\n".join(line for line in table.splitlines() if line.startswith("|"))
            summary = json.loads((Path(out) / "summary.json").read_text())
            timing = json.loads((Path(out) / "timing.json").read_text())
        walls = ", ".join(f"{k} {v:.0f} s" for k, v in (timing.get("wall_s") or timing).items() if isinstance(v, (int, float)))
        body = (f"Trace: Mooncake `conversation_trace.jsonl` (12,031 requests), llama3-8b-h100 engines, TTFT SLO 30 s.\n\n"
                f"{table}\n\n{targets(summary)}\nWall time per policy (one core): {walls}.")
        print(body, flush=True)
        if args.write:
            shown = " ".join(["pd-router", "replay", "../shared/traces/conversation_trace.jsonl", *extra])
            write_section(f"Trace replay: {title}", shown, body)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(DEFAULT_TRACE))
    p.add_argument("--write", action="store_true")
    raise SystemExit(main(p.parse_args()))
