"""A policy as a pipeline of plugins: routes -> filters -> weighted scorers -> picker.

The same object serves the live router, the emulator benchmarks and the offline replay.
Everything only /debug/route and the tests read (totals by route key, per-scorer scores,
cost terms, what each filter dropped) is built lazily from the lists the decision already
made, so a decision over a thousand instances builds no per-route dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.core.instances import Candidate
from router.core.errors import NoRoute
from router.scheduling.framework import (
    Decision,
    Estimator,
    Filter,
    LazyMap,
    Picker,
    RouteGenerator,
    RouteRequest,
    Scorer,
    View,
    build_views,
    new_decision,
)
from router.state.base import Snapshot


class Pipeline:
    def __init__(
        self,
        name: str,
        routes: RouteGenerator,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        spec: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.spec = spec  # the declaration it was built from (plugin names, weights, params), for describe()
        self.revisable = picker.revisable
        self.routes = routes
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        # Found once here, not per decision: the first scorer that predicts TTFT gives the
        # decision its estimate and the prefill work to book; scorers that price routes
        # give /debug/route and calibration their cost terms.
        self._estimator: Estimator | None = next(
            (s for s, _ in self.scorers if callable(getattr(s, "estimate", None)) and callable(getattr(s, "prefill_work", None))),
            None,
        )  # type: ignore[assignment]
        self._pricers = [s for s, _ in self.scorers if callable(getattr(s, "terms", None))]
        # A picker that needs the request (rendezvous hashes its first block) offers pick_for.
        self._pick_for = getattr(picker, "pick_for", None)

    def describe(self) -> dict[str, Any]:
        """The plugins, in order, with weights and parameters (when built from a declaration)."""
        if self.spec is not None:
            return self.spec
        return {"routes": {"name": self.routes.name}, "filters": [{"name": f.name} for f in self.filters],
                "scorers": [{"name": s.name, "weight": w} for s, w in self.scorers], "picker": {"name": self.picker.name}}

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        if not candidates:
            raise ValueError("no candidates")
        routes = self.routes.routes(req, build_views(candidates, snap))
        if not routes:
            raise NoRoute(f"{self.routes.name}: no route for this request")
        dropped: list[tuple[str, list[View]]] = []  # (filter, routes it received), when it dropped some
        reason = "score"
        for flt in self.filters:
            kept, why = flt.keep(req, routes)
            if not kept:
                continue  # fail-open
            if len(kept) < len(routes):
                dropped.append((flt.name, routes))
                routes, reason = kept, why or f"score after {flt.name}"
            elif why is not None:
                reason = why
        per_scorer: list[tuple[str, list[float]]] = []
        totals: list[float] | None = None
        for scorer, weight in self.scorers:
            values = scorer.score(req, routes)
            per_scorer.append((scorer.name, values))
            if totals is None:
                totals = values if weight == 1.0 else [weight * v for v in values]
            else:
                totals = [t + weight * v for t, v in zip(totals, values)]
        if totals is None:
            totals = [0.0] * len(routes)
        if self._pick_for is not None:
            index, ties = self._pick_for(req, routes, totals)
        else:
            index, ties = self.picker.pick(routes, totals)
        index, ties, why, mode = self.routes.settle(req, routes, index, ties)
        chosen = routes[index]
        estimate = work = None
        if self._estimator is not None:
            estimate = self._estimator.estimate(req, chosen)
            work = self._estimator.prefill_work(req, chosen)
        final, scored = routes, totals
        pricers = self._pricers
        return new_decision(
            instance=chosen.candidate.id,
            acceptable=frozenset(routes[i].key for i in ties),
            reason=why or reason,
            scores=LazyMap(lambda: {r.key: t for r, t in zip(final, scored)}),
            terms=LazyMap(lambda: {r.key: {k: v for p in pricers for k, v in p.terms(req, r).items()} for r in final}),  # type: ignore[attr-defined]
            prefill=chosen.prefill.candidate.id if chosen.prefill is not None else None,
            mode=mode,
            estimate_s=estimate,
            prefill_work=work,
            plugin_scores=LazyMap(lambda: {r.key: {n: vals[k] for n, vals in per_scorer} for k, r in enumerate(final)}),
            filtered=LazyMap(lambda: _filtered(dropped, final)),
            profiles={},
        )


def _filtered(dropped: list[tuple[str, list[View]]], final: list[View]) -> dict[str, str]:
    """Route key -> the filter that dropped it: each filter dropped what it received and
    did not pass on to the next stage."""
    out: dict[str, str] = {}
    stages = [received for _, received in dropped[1:]] + [final]
    for (name, received), after in zip(dropped, stages):
        kept = {r.key for r in after}
        out.update((r.key, name) for r in received if r.key not in kept)
    return out
