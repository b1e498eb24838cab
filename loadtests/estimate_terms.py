"""The PD TTFT estimate's error by term, per request (handoff_bench.py estimate --by-term).

A disaggregated route is priced as queue(P) + prefill(P) + transfer + admission(D) + step(D)
(router/scheduling/pd_cost.py); the replay records when P schedules the request, when its
prefill ends, when the KV is on D, when D schedules it and the first token
(router/tools/replay/record.py), which measure the same five terms. A term's contribution to
a request's error is (measured - priced) / priced total, so the five add up to the request's
signed error measured / estimated - 1: the table says which term makes the tail, and in
which direction, instead of only how large the total is. P's queue and prefill are also shown
together: an engine admits a prompt into a step that still computes the one ahead of it
(chunked prefill), so "P schedules it" comes before the work ahead is done.
"""

from __future__ import annotations

import math
from collections import Counter

from router.tools.replay.record import Recorder
from router.tools.replay.summary import percentile

TERMS = ("queue", "prefill", "transfer", "admission", "step")


def measured_terms(rec: Recorder, i: int) -> tuple[float, ...] | None:
    """The five measured terms of PD request ``i`` (None when a milestone is missing)."""
    m = rec.milestones.get(i)
    if m is None or any(math.isnan(x) for x in m) or math.isnan(rec.first_token[i]):
        return None
    p_sched, p_done, on_d, d_sched = m
    return (p_sched - rec.arrival[i], p_done - p_sched, on_d - p_done, d_sched - on_d, rec.first_token[i] - d_sched)


def contributions(rec: Recorder) -> list[tuple[float, tuple[float, ...]]]:
    """(signed total error, per-term contributions) of every instrumented PD request."""
    out = []
    for i, priced in rec.priced.items():
        total = sum(priced)
        measured = measured_terms(rec, i)
        if measured is None or total <= 0:
            continue
        parts = tuple((m - p) / total for m, p in zip(measured, priced))
        out.append((sum(measured) / total - 1, parts))
    return out


def by_term_rows(label: str, rows: list[tuple[float, tuple[float, ...]]], tail: float = 0.2) -> list[str]:
    """Markdown rows: per term, the p10/p50/p90 of its contribution and, among the requests
    off by more than ``tail``, how often it is the largest contribution (and its sign)."""
    worst: Counter[str] = Counter()
    off = [(err, parts) for err, parts in rows if abs(err) > tail]
    for _, parts in off:
        k = max(range(len(TERMS)), key=lambda j: abs(parts[j]))
        worst[f"{TERMS[k]}{'+' if parts[k] > 0 else '-'}"] += 1
    out = []
    for j, term in enumerate(TERMS):
        c = [parts[j] for _, parts in rows]
        if not c:
            continue
        out.append(f"| {label} | {term} | {percentile(c, 10):+.3f} | {percentile(c, 50):+.3f} | "
                   f"{percentile(c, 90):+.3f} | {worst[term + '+']} | {worst[term + '-']} |")
    if rows:  # the engine admits a prompt into a step still computing the one ahead: the split is loose
        c = [parts[0] + parts[1] for _, parts in rows]
        out.append(f"| {label} | P: queue + prefill | {percentile(c, 10):+.3f} | {percentile(c, 50):+.3f} | "
                   f"{percentile(c, 90):+.3f} | - | - |")
    return out


HEADER = ["| flavour | term | contribution p10 | p50 | p90 | worst term of the |error| > 0.2 (over) | (under) |",
          "|---|---|---|---|---|---|---|"]
