"""The replay's lower bound, and how much of the gap to it a policy closes.

``bound``: each request alone on an idle engine, with every block any earlier request
carried already in its cache (an infinite, shared prefix cache and no queue). Its TTFT is
the emulator's own step times for the prompt's uncached tail, chunked as the engine
chunks a lone prefill, times the cluster's step-time ``slowdown`` as the engines apply it. No policy can beat it on any request: routing can only add a
queue, a smaller cache or a transfer. (A PD cluster's TTFT also includes the KV transfer,
which the bound leaves out, so it stays a bound there too.)

``lru_alone``: each request alone on an idle engine again, but with the prefix hits one LRU
cache of the cluster's whole KV capacity would give it (every earlier request's blocks
inserted, the least recently used evicted). Not a bound (a partitioned cache can beat one
global LRU, and no policy can keep the queue at zero), but the reach of routing on caches of
this size: where even it stays far from the bound, the distance is mostly cache capacity
(and the engines' eviction), which placement hardly recovers. Its ``gap_closed`` says how much of the target is within that reach.

``gap_closed`` = (best baseline - policy) / (best baseline - bound), on p90 TTFT: 1.0 is
as good as the bound, 0.0 no better than the best baseline, negative worse; none when
the best baseline is within 1% of the bound.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from router.config.model import HashingConfig
from router.tools.emulator.build import engine_config
from router.tools.emulator.kvcache import block_hashes
from router.tools.emulator.perf import StepShape, attention_pairs, step_time
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.prompts import PromptBuilder
from router.tools.replay.summary import percentile
from router.tools.replay.trace import Trace

BOUND = "bound"
LRU_ALONE = "lru_alone"
REFERENCES: tuple[str, ...] = (BOUND, LRU_ALONE)  # rows that are not policies
# Policies of ours, measured against the rest (the baselines)
OURS: tuple[str, ...] = ("ttft", "ttft_spread")


def bound_ttfts(trace: Trace, spec: ClusterSpec, hashing: HashingConfig | None = None) -> tuple[list[float], int, int]:
    """Per request, the bound's TTFT; and the cached and prompt tokens it saw in all."""
    return _alone_ttfts(trace, spec, (None,), hashing)[0]


def lru_ttfts(trace: Trace, spec: ClusterSpec, hashing: HashingConfig | None = None) -> tuple[list[float], int, int]:
    """Per request, its TTFT alone on an idle engine with the hits of one LRU cache as large as
    every engine's together (a PD decode instance holds the prompts it received, and prefills
    decode-only requests from them); and the cached and prompt tokens it saw in all."""
    return _alone_ttfts(trace, spec, (_cluster_blocks(spec),), hashing)[0]


def _cluster_blocks(spec: ClusterSpec) -> int:
    return (spec.prefill + spec.decode + spec.mixed) * engine_config(spec.emulator_config(), spec.perf()).num_blocks


class BlockLRU:
    """One LRU cache of blocks: how long a leading run of a request's blocks it holds, then
    the request's blocks touched in order and the least recently used evicted past ``capacity``
    (None: never evicts). What engines evicting LRU keep if no block is held twice."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def leading(self, blocks: Sequence[int], limit: int | None = None) -> int:
        """Blocks of ``blocks`` held from the first on (at most ``limit``)."""
        end = len(blocks) if limit is None else min(limit, len(blocks))
        run, held = 0, self._blocks
        while run < end and blocks[run] in held:
            run += 1
        return run

    def touch(self, blocks: Sequence[int]) -> None:
        held = self._blocks
        if self.capacity is None:
            held.update(dict.fromkeys(blocks))
            return
        for b in blocks:
            held[b] = None
            held.move_to_end(b)
        while len(held) > self.capacity:
            held.popitem(last=False)


def _alone_ttfts(trace: Trace, spec: ClusterSpec, capacities: tuple[int | None, ...],
                 hashing: HashingConfig | None) -> list[tuple[list[float], int, int]]:
    """Each request alone on an idle engine, its leading blocks cached when an earlier request
    carried them, once per capacity: in an infinite cache (None) or in one LRU of that many
    blocks (a request's blocks are touched in order, then the least recently used evicted).
    One pass for all: building the prompts' tokens and block hashes is most of the cost."""
    emu = spec.emulator_config()
    profile = spec.perf()
    config = engine_config(emu, profile)
    bs, budget = config.block_size, config.max_batched_tokens
    prompts = PromptBuilder(trace.block_tokens, hashing or HashingConfig(), emu.served_model)
    caches = [BlockLRU(cap) for cap in capacities]
    outs: list[tuple[list[float], list[int]]] = [([], [0, 0]) for _ in capacities]
    for tr in trace.requests:
        tokens = prompts.tokens(tr)
        hashes = block_hashes(tokens, bs, config.hash_salt)
        limit = (len(tokens) - 1) // bs  # the last prompt token is always computed, as the engine does
        for cache, (out, totals) in zip(caches, outs):
            hit = cache.leading(hashes, limit)
            cache.touch(hashes)
            computed = hit * bs
            totals[0] += computed
            totals[1] += len(tokens)
            seconds = 0.0
            while computed < len(tokens):
                n = min(len(tokens) - computed, budget)
                seconds += step_time(profile, StepShape(n, attention_pairs(n, computed), computed)) * spec.slowdown
                computed += n
            out.append(seconds)
    return [(out, cached, prompt) for out, (cached, prompt) in outs]


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def bound_summary(trace: Trace, spec: ClusterSpec, slo_s: float) -> dict[str, object]:
    """The ``bound`` row, with the keys of a policy's summary that it can fill."""
    return _reference_summary(BOUND, *bound_ttfts(trace, spec), trace, spec, slo_s)


def lru_summary(trace: Trace, spec: ClusterSpec, slo_s: float) -> dict[str, object]:
    """The ``lru_alone`` row, as ``bound_summary``."""
    return _reference_summary(LRU_ALONE, *lru_ttfts(trace, spec), trace, spec, slo_s)


def reference_summaries(trace: Trace, spec: ClusterSpec, slo_s: float) -> tuple[dict[str, object], dict[str, object]]:
    """The ``bound`` and ``lru_alone`` rows, from one pass over the trace."""
    bound, lru = _alone_ttfts(trace, spec, (None, _cluster_blocks(spec)), None)
    return _reference_summary(BOUND, *bound, trace, spec, slo_s), _reference_summary(LRU_ALONE, *lru, trace, spec, slo_s)


def _reference_summary(name: str, ttft: list[float], cached: int, prompt: int, trace: Trace, spec: ClusterSpec,
                       slo_s: float) -> dict[str, object]:
    return {
        "policy": name,
        "trace": trace.name,
        "cluster": f"{spec.prefill}P+{spec.decode}D+{spec.mixed}M {spec.profile}",
        "requests": len(ttft),
        "ttft_p50": _r(percentile(ttft, 50)),
        "ttft_p90": _r(percentile(ttft, 90)),
        "ttft_p99": _r(percentile(ttft, 99)),
        "ttft_mean": _r(sum(ttft) / len(ttft) if ttft else math.nan),
        "hit_ratio": _r(cached / prompt if prompt else math.nan),
        "slo_s": slo_s,
        "slo_attainment": _r(sum(1 for t in ttft if t <= slo_s) / len(ttft) if ttft else math.nan),
        "decisions_by_mode": {},
    }


def gap_closed(policy_p90: float, best_baseline_p90: float, bound_p90: float) -> float:
    """(best baseline - policy) / (best baseline - bound); NaN when there is no gap worth
    the name (under 1% of the best baseline: the ratio would only amplify noise)."""
    gap = best_baseline_p90 - bound_p90
    return (best_baseline_p90 - policy_p90) / gap if gap > 0.01 * best_baseline_p90 else math.nan


def add_gap_closed(summaries: Sequence[dict[str, object]], bound: dict[str, object]) -> str | None:
    """Set ``gap_closed`` on every policy's summary; returns the best baseline's name."""
    baselines = [s for s in summaries if s["policy"] not in OURS and s["policy"] not in REFERENCES
                 and s.get("ttft_p90") is not None]
    if not baselines or bound.get("ttft_p90") is None:
        return None
    best = min(baselines, key=lambda s: float(s["ttft_p90"]))  # type: ignore[arg-type]
    for s in summaries:
        if s.get("ttft_p90") is not None:
            s["gap_closed"] = _r(gap_closed(float(s["ttft_p90"]), float(best["ttft_p90"]), float(bound["ttft_p90"])))  # type: ignore[arg-type]
    return str(best["policy"])
