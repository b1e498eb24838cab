"""The figures of one replay: latency percentiles, cache hits, load spread, SLO share.

Definitions (so tables from different runs compare):

* TTFT: client first token - arrival; for a disaggregated request the decode engine's
  first token, so prefill, queueing on both engines and the KV transfer are all in it.
* TBT: per-token gaps of every decoded token (see record.py), p50/p90/p99.
* hit_ratio: prompt tokens the prefilling engine served from its prefix cache or loaded from
  the shared KV store (local_hit_ratio and store_hit_ratio apart) / prompt
  tokens, over routed requests (the decode side of a handoff does not count).
* predicted_hit_ratio: the same with the tokens the router's residency said the
  prefilling instance held when it decided (approximate: routing history; precise: the
  engines' KV events); residency: which of the two the replay ran with.
* max_mean_load: max / mean of prefill tokens computed per instance, over the prefill
  pool when there is one, else over all instances (1.0 = perfectly even).
* throughput_tok_s: output tokens of finished requests / (last finish - first arrival).
* slo_attainment: share of all arrivals whose TTFT <= the SLO (rejected ones miss it).
* ttft_over_estimate_p50/p90: actual TTFT / the policy's predicted TTFT, for policies that
  predict one (ttft): how far the router's cost model is from the emulated engines.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from router.tools.replay.record import TBT_BIN_S
from router.tools.replay.sim import Simulation


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def hist_percentile(hist: Counter[int], q: float, bin_s: float) -> float:
    total = sum(hist.values())
    if not total:
        return math.nan
    target, seen = q / 100 * total, 0
    for key in sorted(hist):
        seen += hist[key]
        if seen >= target:
            return key * bin_s
    return max(hist) * bin_s


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


@dataclass(frozen=True)
class Curves:
    """What the plots need: sorted TTFTs and per-bucket series."""

    policy: str
    ttfts: list[float]
    bucket_s: float
    load: dict[str, list[int]]  # instance -> prefill tokens computed per bucket
    hit: list[float]  # hit ratio per arrival bucket (NaN when nothing arrived)


def ttfts(sim: Simulation) -> list[float]:
    rec = sim.record
    return [f - a for f, a in zip(rec.first_token, rec.arrival) if not math.isnan(f)]


def summarize(sim: Simulation, slo_s: float) -> dict[str, object]:
    rec = sim.record
    ttft = ttfts(sim)
    finished = [i for i in range(rec.n) if rec.finishes[i]]
    routed = [i for i in range(rec.n) if rec.mode[i]]
    rejected = set(rec.rejected)
    prompt = sum(rec.prompt[i] for i in routed if i not in rejected)
    local = sum(rec.cached[i] for i in routed if i not in rejected)
    loaded = sum(rec.loaded[i] for i in routed if i not in rejected)
    cached = local + loaded
    predicted = sum(rec.predicted[i] for i in routed if i not in rejected)
    pool = [n for n in sim.nodes if n.candidate.role == "prefill"] or sim.nodes
    computed = {n.id: n.engine.counters.prefill_computed_tokens for n in sim.nodes}
    pool_load = [computed[n.id] for n in pool]
    mean_load = sum(pool_load) / len(pool_load)
    start = min(rec.arrival) if rec.n else 0.0
    end = max((rec.finish[i] for i in finished), default=start)
    out_tokens = sum(rec.output[i] for i in finished)
    ratios = [(f - a) / e for f, a, e in zip(rec.first_token, rec.arrival, rec.estimate) if e > 0 and not math.isnan(f)]
    spec = sim.spec
    return {
        "policy": sim.policy.name,
        "trace": sim.trace.name,
        "cluster": f"{spec.prefill}P+{spec.decode}D+{spec.mixed}M {spec.profile}",
        "requests": rec.n,
        "finished": len(finished),
        "rejected": len(rejected),
        "ttft_p50": _round(percentile(ttft, 50)),
        "ttft_p90": _round(percentile(ttft, 90)),
        "ttft_p99": _round(percentile(ttft, 99)),
        "ttft_mean": _round(sum(ttft) / len(ttft) if ttft else math.nan),
        "tbt_p50": _round(hist_percentile(rec.tbt_hist, 50, TBT_BIN_S)),
        "tbt_p90": _round(hist_percentile(rec.tbt_hist, 90, TBT_BIN_S)),
        "tbt_p99": _round(hist_percentile(rec.tbt_hist, 99, TBT_BIN_S)),
        "hit_ratio": _round(cached / prompt if prompt else math.nan),
        "local_hit_ratio": _round(local / prompt if prompt else math.nan),
        "store_hit_ratio": _round(loaded / prompt if prompt else math.nan),
        "predicted_hit_ratio": _round(predicted / prompt if prompt else math.nan),
        "residency": sim.residency,
        "max_mean_load": _round(max(pool_load) / mean_load if mean_load else math.nan),
        "throughput_tok_s": _round(out_tokens / (end - start) if end > start else math.nan),
        "slo_s": slo_s,
        "slo_attainment": _round(sum(1 for t in ttft if t <= slo_s) / rec.n if rec.n else math.nan),
        "makespan_s": _round(end - start),
        "ttft_over_estimate_p50": _round(percentile(ratios, 50)),
        "ttft_over_estimate_p90": _round(percentile(ratios, 90)),
        "kv_moved_tokens": sum(rec.moved),
        "decisions_by_mode": dict(sorted(Counter(rec.mode[i] for i in routed).items())),
        "decisions_by_reason": dict(sorted(rec.reasons.items())),
        "prefill_tokens_by_instance": computed,
        "engine_steps": rec.steps,
        "trace_reordered_lines": sim.trace.reordered,
    }


def curves(sim: Simulation) -> Curves:
    rec = sim.record
    buckets = 1 + max([max(s, default=0) for s in rec.prefill_series] + [max(rec.hit_series, default=0)])
    load = {node: [series.get(b, 0) for b in range(buckets)] for node, series in zip(rec.node_ids, rec.prefill_series)}
    hit = []
    for b in range(buckets):
        c, p = rec.hit_series.get(b, (0, 0))
        hit.append(c / p if p else math.nan)
    return Curves(sim.policy.name, sorted(ttfts(sim)), rec.bucket_s, load, hit)
