"""The named policies of ``policy.name`` and the factory that builds them from config."""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.config.model import CacheAwareWeights, PDConfig, PolicyConfig
from router.core.instances import Candidate
from router.scheduling.framework import Decision, Pipeline, Policy, RouteRequest, build_views
from router.scheduling.baselines import BASELINE_NAMES, build_baseline
from router.scheduling.filters import BoundedLoadFilter
from router.scheduling.pd import IndependentPDPolicy, PairTTFTPolicy
from router.scheduling.pickers import MaxScorePicker, RandomPicker, RoundRobinPicker
from router.scheduling.scorers import LeastRequestsScorer, PrefixScorer, TTFTScorer
from router.state.base import Snapshot


class CacheAwarePolicy:
    """Baseline in the style of sglang-router's cache_aware: the instance with the longest
    cached prefix when its match ratio exceeds ``cache_threshold``, least loaded otherwise,
    and least loaded whenever loads are imbalanced (max - min > abs and max > rel * min).
    Unlike the original, ties are broken at random rather than by list order."""

    name = "cache_aware"
    revisable = True

    def __init__(self, weights: CacheAwareWeights, rng: random.Random) -> None:
        self._w = weights
        self._rng = rng
        self._prefix = PrefixScorer()

    def _least_loaded(self, ids_loads: list[tuple[str, int]], reason: str) -> Decision:
        low = min(load for _, load in ids_loads)
        ties = [i for i, load in ids_loads if load == low]
        return Decision(self._rng.choice(ties), frozenset(ties), reason)

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        views = build_views(candidates, snap)
        loads = [(v.id, v.load.requests) for v in views]
        lo, hi = min(x for _, x in loads), max(x for _, x in loads)
        if hi - lo > self._w.balance_abs_threshold and hi > lo * self._w.balance_rel_threshold:
            return self._least_loaded(loads, "load_imbalance")
        rates = self._prefix.score(req, views)
        best = max(rates)
        if best > self._w.cache_threshold:
            holders = [(v.id, v.load.requests) for v, r in zip(views, rates) if r == best]
            return self._least_loaded(holders, "prefix_hit")
        return self._least_loaded(loads, "prefix_miss")


def build_policy(config: PolicyConfig, pd: PDConfig | None = None, rng: random.Random | None = None) -> Policy:
    """The policy named in ``config``; with ``pd`` (the cluster has a prefill pool) its
    disaggregated form: pair scoring for ``ttft``, independent P and D choice otherwise."""
    rng = rng or random.Random(config.seed)
    if pd is not None:
        if config.name == "ttft":
            return PairTTFTPolicy(config.ttft, pd, rng)
        # P by the named policy; D by load (round robin and random: the same rule, own state)
        decode_name = config.name if config.name in ("round_robin", "random") else "least_loaded"
        decode = _colocated(config.model_copy(update={"name": decode_name}), rng)
        return IndependentPDPolicy(config.name, _colocated(config, rng), decode)
    return _colocated(config, rng)


def _colocated(config: PolicyConfig, rng: random.Random) -> Policy:
    name = config.name
    if name == "ttft":
        w = config.ttft
        return Pipeline(
            "ttft",
            [(TTFTScorer(w), 1.0)],
            MaxScorePicker(rng, w.tie_tolerance),
            [BoundedLoadFilter(w.bounded_load_factor, w.bounded_load_slack)],
        )
    if name == "round_robin":
        return Pipeline("round_robin", [], RoundRobinPicker(), revisable=False)
    if name == "random":
        return Pipeline("random", [], RandomPicker(rng), revisable=False)
    if name == "least_loaded":
        return Pipeline("least_loaded", [(LeastRequestsScorer(), 1.0)], MaxScorePicker(rng))
    if name == "cache_aware":
        return CacheAwarePolicy(config.cache_aware, rng)
    if name in BASELINE_NAMES:
        return build_baseline(config, rng)
    raise ValueError(f"unknown policy {name!r}")
