"""Scorers: pure functions of (request, views) -> one score per view in [0, 1], higher better.

Scores are absolute where a natural scale exists (prefix match ratio) and relative to the
best candidate otherwise, never min-max normalised: min-max turns a 1-block difference
on a cold cluster into a full 0..1 swing.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.config.model import TTFTWeights
from router.scheduling.framework import RouteRequest, View
from router.scheduling.cost import colocated_ttft, prefill_work


class PrefixScorer:
    """Share of the prompt's blocks the instance already holds (matched / total)."""

    name = "prefix"

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        total = len(req.keys)
        if total == 0:
            return [0.0] * len(views)
        return [v.matched_blocks / total for v in views]


class LeastRequestsScorer:
    """Fewer requests in flight scores higher: 1 / (1 + requests)."""

    name = "requests"

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        return [1.0 / (1 + v.load.requests) for v in views]


class KVUtilisationScorer:
    """Free KV share: 1 - booked KV tokens / cache capacity."""

    name = "kv"

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        return [max(0.0, 1.0 - v.load.kv_tokens / v.candidate.cache_tokens) for v in views]


class TTFTScorer:
    """best estimated TTFT / this instance's estimate: 1 for the fastest, in (0, 1].

    The estimate is cost.colocated_ttft, inlined here because it runs for every
    candidate of every decision."""

    name = "ttft"

    def __init__(self, weights: TTFTWeights) -> None:
        self._weights = weights

    def estimate(self, req: RouteRequest, view: View) -> float:
        return colocated_ttft(req, view, self._weights).total_s

    def prefill_work(self, req: RouteRequest, view: View) -> int:
        return prefill_work(req, view, self._weights)

    def estimates(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        w = self._weights
        default_rate, overhead = w.prefill_tokens_per_s, w.request_overhead_s
        attention, interference = w.attention_s_per_token2, w.decode_interference_s
        prompt, block = req.prompt_tokens, req.block_tokens
        full = attention * prompt * prompt / 2
        out = []
        for cand, matched, load in views:
            rate = cand.prefill_tokens_per_s or default_rate
            cached = matched * block
            if cached > prompt:
                cached = prompt
            out.append(
                (load.prefill_tokens + prompt - cached) / rate
                + overhead
                + full - attention * cached * cached / 2
                + interference * load.requests
            )
        return out

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        est = self.estimates(req, views)
        best = min(est)
        return [best / e if e > 0 else 1.0 for e in est]
