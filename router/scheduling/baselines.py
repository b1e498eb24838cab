"""The peers' routing policies, re-implemented from their documented behaviour.

They exist so that replays and benchmarks compare ``ttft`` with what sglang-router, llm-d
and Dynamo actually do, not with strawmen. Each reads the same snapshot as our own
policies (router-side residency and booked load), which is also what the originals see
in their approximate modes: a prefix index fed by routing history, never by the engine.

* ``sglang_cache_aware`` — sglang-router 0.3.x ``cache_aware`` (CLI defaults 0.3 / 64 /
  1.5): least loaded when loads are imbalanced, else the instance with the deepest cached
  prefix when its match ratio exceeds the threshold, else least loaded. Ties go to the
  FIRST candidate in list order, as the original's index scan does; that is what makes
  it herd onto instance 0 on a cold cluster, and the replay should show it.
* ``llmd_weighted`` — the llm-d scheduler's weighted profile: prefix-cache scorer x3,
  queue scorer x2 (min-max over candidates), kv-cache-utilisation scorer x2, max-score
  picker with a random tie-break.
* ``dynamo_cost`` — Dynamo's KV router cost (classic form, temperature 0):
  ``overlap_weight * prefill_blocks + decode_blocks``, argmin, ties at random.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.config.model import CacheAwareWeights, PolicyConfig
from router.core.instances import Candidate
from router.scheduling.framework import Decision, Pipeline, Policy, RouteRequest, View, build_views
from router.scheduling.pickers import MaxScorePicker
from router.scheduling.scorers import KVUtilisationScorer, PrefixScorer
from router.state.base import Snapshot

BASELINE_NAMES: tuple[str, ...] = ("sglang_cache_aware", "llmd_weighted", "dynamo_cost")


class SGLangCacheAwarePolicy:
    """sglang-router ``cache_aware`` on our residency: match ratio = matched blocks / prompt
    blocks (the original counts characters of a radix tree), load = requests in flight
    booked by the router (the original's per-worker in-flight counter)."""

    name = "sglang_cache_aware"
    revisable = True

    def __init__(self, weights: CacheAwareWeights) -> None:
        self._w = weights

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        if not candidates:
            raise ValueError("no candidates")
        views = build_views(candidates, snap)
        loads = [v.load.requests for v in views]
        lo, hi = min(loads), max(loads)
        total = len(req.keys)
        rates = [v.matched_blocks / total if total else 0.0 for v in views]
        terms = {v.id: {"load": float(load), "match_ratio": rate} for v, load, rate in zip(views, loads, rates)}
        if hi - lo > self._w.balance_abs_threshold and hi > lo * self._w.balance_rel_threshold:
            index, reason = loads.index(lo), "load_imbalance"
        elif max(rates) > self._w.cache_threshold:  # strict, as in the original
            index, reason = rates.index(max(rates)), "prefix_hit"
        else:
            index, reason = loads.index(lo), "prefix_miss"
        chosen = views[index].id
        return Decision(chosen, frozenset({chosen}), reason, terms=terms)


class QueueScorer:
    """llm-d ``queue-scorer``: (max q - q) / (max q - min q) over the candidates, 1.0 for all
    when equal. The queue signal is the booked prefill tokens (uncached prompt tokens of
    requests that have not produced their first token): the router's closest analogue of
    the waiting queue llm-d scrapes, and weighted by size rather than by request count."""

    name = "queue"

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]:
        queues = [v.load.prefill_tokens for v in views]
        lo, hi = min(queues), max(queues)
        if hi == lo:
            return [1.0] * len(views)
        return [(hi - q) / (hi - lo) for q in queues]


def llmd_weighted(rng: random.Random) -> Pipeline:
    """llm-d's weighted scheduling profile: prefix x3 + queue x2 + kv x2, max score."""
    return Pipeline(
        "llmd_weighted",
        [(PrefixScorer(), 3.0), (QueueScorer(), 2.0), (KVUtilisationScorer(), 2.0)],
        MaxScorePicker(rng),
    )


class DynamoCostPolicy:
    """Dynamo KV router, classic cost, temperature 0 (argmin, ties at random):

        prefill_blocks = (booked prefill tokens + max(prompt - cached, 0)) / block
        decode_blocks  = (booked KV tokens + prompt + max_tokens) / block
        logit          = overlap_weight * prefill_blocks + decode_blocks

    The original deduplicates the new request's blocks against the worker's active ones;
    here the whole sequence counts, a small overestimate on instances already serving the
    same prefix."""

    name = "dynamo_cost"
    revisable = True

    def __init__(self, rng: random.Random, overlap_weight: float = 1.0) -> None:
        self._rng = rng
        self._overlap_weight = overlap_weight

    def logits(self, req: RouteRequest, views: Sequence[View]) -> list[tuple[float, float]]:
        """(prefill_blocks, decode_blocks) per view."""
        block = req.block_tokens
        out = []
        for v in views:
            uncached = max(req.prompt_tokens - v.cached_tokens(req), 0)
            prefill = (v.load.prefill_tokens + uncached) / block
            decode = (v.load.kv_tokens + req.prompt_tokens + req.max_tokens) / block
            out.append((prefill, decode))
        return out

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        if not candidates:
            raise ValueError("no candidates")
        views = build_views(candidates, snap)
        parts = self.logits(req, views)
        costs = [self._overlap_weight * p + d for p, d in parts]
        best = min(costs)
        ties = [v.id for v, c in zip(views, costs) if c <= best + 1e-9]
        return Decision(
            self._rng.choice(ties),
            frozenset(ties),
            "min_cost",
            scores={v.id: -c for v, c in zip(views, costs)},
            terms={v.id: {"prefill_blocks": p, "decode_blocks": d} for v, (p, d) in zip(views, parts)},
        )


def build_baseline(config: PolicyConfig, rng: random.Random) -> Policy:
    """The colocated form of the baseline named in ``config``."""
    if config.name == "sglang_cache_aware":
        return SGLangCacheAwarePolicy(config.cache_aware)
    if config.name == "llmd_weighted":
        return llmd_weighted(rng)
    if config.name == "dynamo_cost":
        return DynamoCostPolicy(rng)
    raise ValueError(f"unknown baseline policy {config.name!r}; known: {', '.join(BASELINE_NAMES)}")
