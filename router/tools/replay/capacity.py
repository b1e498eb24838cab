"""SLO goodput capacity: the highest arrival rate a policy sustains within a TTFT SLO.

The trace is replayed at each ``--rate-scale`` of a sweep (timestamps / scale); a policy
sustains a scale when its p90 TTFT is within the SLO there and at every smaller scale of
the sweep (a policy that recovers at a higher rate after failing a lower one is not
trusted with it). Capacity is reported as that scale, and relative to the best baseline's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from router.tools.replay.bound import OURS


def sustained(p90_by_scale: Sequence[tuple[float, float | None]], slo_s: float) -> float:
    """Highest scale whose p90 and every lower scale's are within ``slo_s`` (0 if none)."""
    best = 0.0
    for scale, p90 in sorted(p90_by_scale):
        if p90 is None or p90 > slo_s:
            break
        best = scale
    return best


def sweep(policies: Sequence[str], scales: Sequence[float], slo_s: float,
          run: Callable[[str, float], dict[str, object]]) -> dict[str, object]:
    """Run every (policy, scale) with ``run`` and compute each policy's capacity."""
    table: dict[str, list[tuple[float, float | None]]] = {}
    for name in policies:
        rows = table.setdefault(name, [])
        for scale in sorted(scales):
            p90 = run(name, scale).get("ttft_p90")
            rows.append((scale, None if p90 is None else float(p90)))  # type: ignore[arg-type]
            if p90 is None or float(p90) > 4 * slo_s:  # type: ignore[arg-type]
                break  # far past the SLO: higher rates only take longer to replay
    capacity = {name: sustained(rows, slo_s) for name, rows in table.items()}
    baselines = {n: c for n, c in capacity.items() if n not in OURS}
    best = max(baselines.values(), default=0.0)
    relative = {n: (round(c / best, 3) if best > 0 else None) for n, c in capacity.items()}
    return {"slo_s": slo_s, "scales": sorted(scales), "p90": {n: dict(rows) for n, rows in table.items()},
            "capacity": capacity, "vs_best_baseline": relative,
            "best_baseline": max(baselines, key=baselines.__getitem__) if baselines else None}


def markdown(result: dict[str, object]) -> str:
    scales: list[float] = result["scales"]  # type: ignore[assignment]
    p90: dict[str, dict[float, float | None]] = result["p90"]  # type: ignore[assignment]
    capacity: dict[str, float] = result["capacity"]  # type: ignore[assignment]
    relative: dict[str, float | None] = result["vs_best_baseline"]  # type: ignore[assignment]
    lines = [f"p90 TTFT (s) by --rate-scale; capacity = highest scale sustained with p90 <= {result['slo_s']} s",
             "", "| policy | " + " | ".join(f"x{s:g}" for s in scales) + " | capacity | vs best baseline |",
             "|" + "---|" * (len(scales) + 3)]
    for name, rows in p90.items():
        cells = [("-" if rows.get(s) is None else f"{rows[s]:.3f}") if s in rows else "(skipped)" for s in scales]
        rel = relative.get(name)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | x{capacity[name]:g} | {'-' if rel is None else f'{rel:.2f}x'} |")
    return "\n".join(lines) + "\n"
