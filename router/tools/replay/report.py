"""Replay results on disk: summary.json (deterministic), summary.md, and PNG plots.

Plots need matplotlib (the ``bench`` extra); without it the Markdown says so in one line
and everything else is written as usual.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from router.tools.replay.summary import Curves

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("requests", "requests", "{}"),
    ("ttft_p50", "TTFT p50 s", "{:.3f}"),
    ("ttft_p90", "TTFT p90 s", "{:.3f}"),
    ("ttft_p99", "TTFT p99 s", "{:.3f}"),
    ("tbt_p90", "TBT p90 ms", "ms"),
    ("hit_ratio", "hit ratio", "{:.3f}"),
    ("predicted_hit_ratio", "predicted hit", "{:.3f}"),
    ("gap_closed", "gap closed", "{:.2f}"),
    ("max_mean_load", "max/mean load", "{:.2f}"),
    ("throughput_tok_s", "out tok/s", "{:.0f}"),
    ("slo_attainment", "TTFT<=SLO", "{:.3f}"),
)


def _cell(value: object, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "ms":
        return f"{float(value) * 1000:.1f}"  # type: ignore[arg-type]
    return fmt.format(value)


def markdown(summaries: Sequence[dict[str, object]]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " | modes |",
             "|" + "---|" * (len(COLUMNS) + 1)]
    for s in summaries:
        modes = ", ".join(f"{k} {v}" for k, v in s.get("decisions_by_mode", {}).items())  # type: ignore[attr-defined]
        lines.append("| " + " | ".join(_cell(s.get(key), fmt) for key, _, fmt in COLUMNS) + f" | {modes} |")
    return "\n".join(lines) + "\n"


def write(out: Path, summaries: Sequence[dict[str, object]], curves: Sequence[Curves]) -> list[Path]:
    """Write every output; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "summary.md"]
    written[0].write_text(json.dumps(list(summaries), indent=2) + "\n")
    head = summaries[0] if summaries else {}
    text = [f"# Replay of {head.get('trace', '?')} on {head.get('cluster', '?')}", "",
            f"TTFT SLO {head.get('slo_s', '?')} s. Definitions: router/replay/summary.py.", "", markdown(summaries)]
    plots = plot(out, curves)
    if plots is None:
        text.append("Plots skipped: matplotlib is not installed (pip install 'pd-router[bench]').\n")
    else:
        text.extend(f"![{p.stem}]({p.name})\n" for p in plots)
        written.extend(plots)
    written[1].write_text("\n".join(text))
    return written


def plot(out: Path, curves: Sequence[Curves]) -> list[Path] | None:
    """TTFT CDF per policy, prefill load per instance over time, hit ratio over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    paths = [out / "ttft_cdf.png", out / "load.png", out / "hit_ratio.png"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curves:
        if c.ttfts:
            n = len(c.ttfts)
            ax.plot(c.ttfts, [(i + 1) / n for i in range(n)], label=c.policy)
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="share of requests", title="TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    cols = min(3, max(1, len(curves)))
    rows = -(-len(curves) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3 * rows), sharey=True, squeeze=False)
    for ax, c in zip(axes.flat, curves):
        for node, series in c.load.items():
            ax.plot([i * c.bucket_s for i in range(len(series))], [v / c.bucket_s for v in series], lw=0.8, label=node)
        ax.set(title=c.policy, xlabel="time (s)", ylabel="prefill tok/s")
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    if curves and len(curves[0].load) <= 16:
        axes.flat[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curves:
        ax.plot([i * c.bucket_s for i in range(len(c.hit))], c.hit, label=c.policy)
    ax.set(xlabel="arrival time (s)", ylabel="prefix hit ratio", title="Cache hit ratio over time", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths
