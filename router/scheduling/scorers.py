"""Scorers: pure functions of (request, routes) -> one score per route, higher better.

Scores lie in [0, 1]. They are absolute where a natural scale exists (prefix match ratio)
and relative to the best route otherwise; only ``queue`` (llm-d's) is min-max normalised,
which turns a 1-block difference on a cold cluster into a full 0..1 swing.

On a disaggregated route, cache and prefill scores look at the prefilling instance (P),
load and KV scores at the answering one (D).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

from router.config.model import TTFTWeights
from router.scheduling.cost import colocated_ttft, prefill_work
from router.scheduling.framework import RouteRequest, View
from router.scheduling.registry import BuildContext, NoParams, plugin


class PrefixScorer:
    """Share of the prompt's blocks the prefilling instance already holds (matched / total)."""

    name = "prefix"

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        total = len(req.keys)
        if total == 0:
            return [0.0] * len(routes)
        return [(v.prefill or v).matched_blocks / total for v in routes]


class LeastRequestsScorer:
    """Fewer requests in flight scores higher: 1 / (1 + requests)."""

    name = "requests"

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        return [1.0 / (1 + v.load.requests) for v in routes]


class KVUtilisationScorer:
    """Free KV share: 1 - booked KV tokens / cache capacity."""

    name = "kv"

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        return [max(0.0, 1.0 - v.load.kv_tokens / v.candidate.cache_tokens) for v in routes]


class QueueScorer:
    """llm-d ``queue-scorer``: (max q - q) / (max q - min q) over the routes, 1.0 for all
    when equal. The queue signal is the booked prefill tokens (uncached prompt tokens of
    requests that have not produced their first token): the router's closest analogue of
    the waiting queue llm-d scrapes, and weighted by size rather than by request count."""

    name = "queue"

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        queues = [(v.prefill or v).load.prefill_tokens for v in routes]
        lo, hi = min(queues), max(queues)
        if hi == lo:
            return [1.0] * len(routes)
        return [(hi - q) / (hi - lo) for q in queues]


class TTFTScorer:
    """best estimated TTFT / this route's estimate: 1 for the fastest, in (0, 1]. The
    estimate is the colocated one (cost.py) on the prefilling instance; pd_ttft prices
    whole pairs. With a shared store's landings, a route's estimate (``estimates``) is its
    cost: the TTFT plus the delays it causes to loads landing there (``TTFTTerms.cost_s``);
    ``estimate`` stays the request's own TTFT (the decision's ``estimate_s``).

    ``estimates`` inlines cost.colocated_ttft because it runs for every candidate of
    every decision (tests/scheduling check that the two give the same floats), and keeps the last call's
    figures: the cache-room filter prices the routes first, then this scorer the ones it
    kept (the same view objects of the same request), so each candidate is priced once."""

    name = "ttft"

    def __init__(self, weights: TTFTWeights) -> None:
        self._weights = weights
        # (request, id(view) -> estimate, the views): holding the views keeps their ids unique
        self._last: tuple[RouteRequest, dict[int, float], Sequence[View]] | None = None

    def estimate(self, req: RouteRequest, route: View) -> float:
        """The route's TTFT: the figure ``estimates`` just gave it for this request when it
        priced it (without a shared store its estimate is the TTFT itself, computed as
        colocated_ttft does: the same float), else colocated_ttft's."""
        last = self._last
        if last is not None and last[0] is req and req.store is None and not req.landings:
            known = last[1].get(id(route))
            if known is not None:
                return known
        return colocated_ttft(req, route.prefilling, self._weights).total_s

    def prefill_work(self, req: RouteRequest, route: View) -> int:
        return prefill_work(req, route.prefilling, self._weights)

    def terms(self, req: RouteRequest, route: View) -> dict[str, float]:
        t = colocated_ttft(req, route.prefilling, self._weights)
        return {"ttft_s": t.total_s, "queue_s": t.queue_s, "prefill_s": t.prefill_s,
                "interference_s": t.interference_s, "admission_s": t.admission_s, "delays_s": t.delays_s,
                "uncached_tokens": float(t.uncached_tokens)}

    def estimates(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        last = self._last
        if last is not None and last[0] is req:
            known = last[1]
            again = [known.get(id(r)) for r in routes]
            if None not in again:
                return again  # type: ignore[return-value]
        out = self._estimates(req, routes)
        self._last = (req, dict(zip(map(id, routes), out)), tuple(routes))
        return out

    def _estimates(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        w = self._weights
        if req.store is not None or req.landings:  # a load from the shared store competes with the compute,
            # and a prefill delays the loads landing where it computes (store_cost.py)
            return [colocated_ttft(req, r.prefilling, w).cost_s for r in routes]
        default_rate, overhead = w.prefill_tokens_per_s, w.request_overhead_s
        attention, interference = w.attention_s_per_token2, w.decode_interference_s
        chunk = w.prefill_chunk_tokens
        prompt, block, output = req.prompt_tokens, req.block_tokens, req.max_tokens
        steps = max(1.0, float(output))  # an output's decode steps
        out = []
        # Each figure is computed as colocated_ttft computes it, operation for operation (the
        # same floats, not only close ones), so ``estimate`` can hand the chosen route's back.
        for cand, matched, load, prefill, _, conf, _ in routes:
            if prefill is not None:
                cand, matched, load, conf = prefill[0], prefill[1], prefill[2], prefill[5]
            rate = cand.prefill_tokens_per_s or default_rate
            held = matched * block
            uncached = prompt - (prompt if held > prompt else held) * conf
            cached = prompt - uncached  # as prefill_seconds recomputes it
            queued = load.prefill_tokens / rate
            if cand.role == "prefill":  # cost.queued_seconds, inlined: the head's progress, prefill-only engines
                started, head = load.prefill_started_s, load.prefill_head_tokens / rate
                queued -= head if head < started else started
            if queued > 0.0:
                if chunk > 0:  # cost.shared_step_tokens, inlined
                    ahead = queued * rate
                    if ahead > 0:
                        room = -(ahead + uncached) % chunk
                        queued = queued + (room if room < ahead else ahead) / rate
            else:
                queued = 0.0
            est = (queued
                   + (overhead + uncached / rate + attention * (prompt * prompt - cached * cached) / 2)
                   + interference * load.requests)
            kv = load.kv_tokens
            if kv > 0:  # cost.admission_wait, inlined: whole requests end
                deficit = kv + (uncached + output) - cand.cache_tokens
                if deficit > 0:
                    k = load.requests if load.requests > 0 else 1
                    ending = ceil(deficit * k / kv)
                    step = cand.decode_step_s
                    if step is None:
                        step = w.decode_step_s + interference * load.requests
                    est += (ending if ending < k else k) / (k + 1) * steps * step
            out.append(est)
        return out

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]:
        est = self.estimates(req, routes)
        best = min(est)
        return [best / e if e > 0 else 1.0 for e in est]


@plugin("scorer", "prefix")
def prefix(params: NoParams, ctx: BuildContext) -> PrefixScorer:
    """Share of the prompt's blocks cached on the prefilling instance."""
    return PrefixScorer()


@plugin("scorer", "requests")
def requests(params: NoParams, ctx: BuildContext) -> LeastRequestsScorer:
    """1 / (1 + requests in flight)."""
    return LeastRequestsScorer()


@plugin("scorer", "kv")
def kv(params: NoParams, ctx: BuildContext) -> KVUtilisationScorer:
    """Free share of the KV cache."""
    return KVUtilisationScorer()


@plugin("scorer", "queue")
def queue(params: NoParams, ctx: BuildContext) -> QueueScorer:
    """Booked prefill tokens, min-max normalised over the routes (llm-d's queue scorer)."""
    return QueueScorer()


def shared_ttft(ctx: BuildContext) -> TTFTScorer:
    """The policy's one TTFT estimator (its plugins price a route once per decision)."""
    scorer = ctx.shared.get("ttft")
    if not isinstance(scorer, TTFTScorer):
        scorer = ctx.shared["ttft"] = TTFTScorer(ctx.policy.ttft)
    return scorer


@plugin("scorer", "ttft")
def ttft(params: NoParams, ctx: BuildContext) -> TTFTScorer:
    """best / estimated colocated TTFT, with the rates and costs of policy.ttft."""
    return shared_ttft(ctx)
