"""Route generators: the routes a request may take, before filters and scorers see them.

``instances`` — every candidate, as itself (colocated clusters, and each profile of a
two-profile policy).

``pd_pairs`` — for a cluster with a prefill pool: each compatible (P, D) pair among the
best ``max_pair_candidates`` prefill and decode instances (each ranked on its own terms,
so the work stays linear in the pool size), and prefill on a decode instance alone where
selective disaggregation allows it. Pairs are priced here (pd_cost.route_cost), because
eligibility depends on their price; pd_ttft reuses the price.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

from router.config.model import PDConfig, TTFTWeights
from router.scheduling.filters import BoundedLoadFilter, KVRoomFilter, TBTFilter
from router.core.errors import NoRoute
from router.scheduling.framework import Filter, RouteRequest, View
from router.scheduling.cost import prefill_seconds
from router.scheduling.pd_cost import admission_seconds, decode_step_seconds, route_cost, transfer_tokens
from router.scheduling.registry import BuildContext, NoParams, plugin
from router.scheduling.scorers import TTFTScorer
from router.scheduling.stall_budget import StallBudget
from router.scheduling.store_cost import computed_tokens

_new_view = tuple.__new__


def split_pools(views: Sequence[View]) -> tuple[list[View], list[View]]:
    prefills = [v for v in views if v.candidate.role == "prefill"]
    decodes = [v for v in views if v.candidate.role in ("decode", "mixed")]
    return prefills, decodes


def _mode(route: View) -> str:
    if route.prefill is not None:
        return "disaggregated"
    return "colocated" if route.candidate.role == "mixed" else "decode_only"


class InstanceRoutes:
    name = "instances"
    disaggregates = False

    def routes(self, req: RouteRequest, views: list[View]) -> list[View]:
        return views

    def settle(self, req: RouteRequest, routes: Sequence[View], index: int,
               ties: Sequence[int]) -> tuple[int, Sequence[int], str | None, str]:
        return index, ties, None, "colocated"


class PairRoutes:
    name = "pd_pairs"
    disaggregates = True

    def __init__(self, weights: TTFTWeights, pd: PDConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._w = weights
        self._pd = pd
        self._bounded = BoundedLoadFilter(weights.bounded_load_factor, weights.bounded_load_slack,
                                          weights.bounded_load_keep_tokens)
        self._decode_filters: tuple[Filter, ...] = (TBTFilter(pd), KVRoomFilter(), self._bounded)
        iso = pd.handoff.isolation
        self._isolation = ("budget" if pd.handoff.link_aware else "off") if iso == "auto" else iso
        self._ttft = TTFTScorer(weights)  # ranks prefill instances by their colocated estimate
        # isolation objective: the stall budget, and the stalls this decision priced (request id, D -> steps)
        self.stalls = StallBudget(pd.handoff.tbt_objective, weights, pd, clock) if self._isolation == "objective" else None
        self._priced: tuple[str, dict[str, float]] = ("", {})

    def routes(self, req: RouteRequest, views: list[View]) -> list[View]:
        """Every eligible route, pairs first. A mixed instance may always serve alone
        (colocated). A decode instance prefills alone only when selective disaggregation
        allows it: it lacks fewer than ``selective_threshold_tokens`` of the prompt (not
        counting what it would load from a shared KV store), there
        is no usable prefill instance, or the queue ahead on the best pair's prefill
        instance alone outlasts doing the whole request locally. Otherwise prefill stays
        off the decode instances, whose time between tokens is what PD protects. SGLang
        decode workers never serve alone (they only take requests paired through a
        bootstrap room). Decode instances must pass the TBT, KV-room and bounded-load
        filters, prefill instances the bounded-load one (each fail-open). A prompt whose chunk
        would stall the decodes running on D past the TBT target (``_stalls_decodes``) is
        offered there per ``pd.handoff.isolation``: never (strict), only while D has no such
        prefill queued already (budget, ``_stalling_queue``), only while the decode steps it
        would stall fit the window's allowance of the TBT objective and the TTFT it saves
        pays for them (objective, stall_budget.py), or as above (off)."""
        prefills, decodes = split_pools(views)
        if not decodes:
            raise NoRoute("no decode or mixed instance is available")
        pool = decodes  # every decode instance: the objective's denominator is the whole pool's steps
        priced: dict[str, float] = {}
        self._priced = (req.id, priced)
        allowance: float | None = None
        for flt in self._decode_filters:
            decodes = flt.keep(req, decodes)[0] or decodes
        w, pd = self._w, self._pd
        out: list[View] = []
        if prefills:
            k = pd.max_pair_candidates
            prefills = self._bounded.keep(req, prefills)[0] or prefills
            estimates = self._ttft.estimates(req, prefills)
            top_p = [prefills[i] for i in heapq.nsmallest(k, range(len(prefills)), key=estimates.__getitem__)]
            top_d = heapq.nsmallest(k, decodes, key=lambda d: admission_seconds(req, d, pd) + transfer_tokens(req, d))
            for d in top_d:
                for p in top_p:
                    if p.candidate.compat == d.candidate.compat:
                        out.append(_new_view(View, (d.candidate, d.matched_blocks, d.load, p, route_cost(req, d, p, w, pd), d.confidence, d.room)))
        best = min(out, key=lambda r: r.cost.total_s, default=None)  # type: ignore[union-attr]
        threshold = pd.selective_threshold_tokens
        best_queue = best.cost.queue_s if best is not None else 0.0  # type: ignore[union-attr]
        # A local route costs at least its colocated estimate (admission and step only add),
        # so that cheap estimate rules most decode instances out without pricing them.
        floors = self._ttft.estimates(req, decodes) if best is not None else None
        for i, d in enumerate(decodes):
            if not d.candidate.standalone:
                continue
            lacks = transfer_tokens(req, d) if req.store is None else computed_tokens(req, d)  # a store load is no prefill
            always = d.candidate.role == "mixed" or best is None or lacks < threshold
            if not always and best_queue < floors[i] - 1e-9:  # type: ignore[index]
                continue
            local = None
            if not always and self.stalls is not None:
                stall = self.stalls.price(req, d)
                if stall > 0:
                    if allowance is None:
                        allowance = self.stalls.allowance(pool)
                    local = route_cost(req, d, None, w, pd)
                    saved = best.cost.total_s - local.total_s  # type: ignore[union-attr]
                    if not self.stalls.worth(stall, allowance, saved):
                        continue
                    priced[d.candidate.id] = stall
            elif not always and self._isolation != "off" and self._stalls_decodes(req, d) and (
                    self._isolation == "strict" or self._stalling_queue(d)):
                continue
            if local is None:
                local = route_cost(req, d, None, w, pd)
            if always or best_queue > local.total_s:
                out.append(_new_view(View, (d.candidate, d.matched_blocks, d.load, None, local, d.confidence, d.room)))
        if not out:
            raise NoRoute("no compatible prefill instance for decode instances that cannot prefill alone")
        return out

    def _stalls_decodes(self, req: RouteRequest, d: View) -> bool:
        """Isolation (with link-aware booking): prefilling on D runs its chunks in the steps
        of the decodes running there, so each of those steps lasts a whole chunk. A chunk
        that would hold them past the TBT target does damage a pair does not, however
        long the prefill queues are: the route is not offered while D has decodes."""
        if d.load.requests <= 0:
            return False
        w, pd = self._w, self._pd
        rate = d.candidate.prefill_tokens_per_s or w.prefill_tokens_per_s
        chunk = min(req.prompt_tokens - d.cached_tokens(req), pd.handoff.overlap_chunk_tokens)
        return prefill_seconds(chunk, chunk, rate, w) + decode_step_seconds(d, pd, measured=False) > pd.tbt_target_s

    def _stalling_queue(self, d: View) -> bool:
        """Isolation by budget: D already has prefill work queued whose chunk stalls its decodes.
        Each decode running there then sees one stalled run at a time (one prompt's chunks), not
        the chunks of every prompt a long prefill queue would send there; the burst's long
        prompts share the decode pool one per instance instead of none (strict) or as many as
        the prefill queues favour (off)."""
        queued = min(d.load.prefill_tokens, self._pd.handoff.overlap_chunk_tokens)
        if queued <= 0:
            return False
        rate = d.candidate.prefill_tokens_per_s or self._w.prefill_tokens_per_s
        return (prefill_seconds(queued, queued, rate, self._w)
                + decode_step_seconds(d, self._pd, measured=False) > self._pd.tbt_target_s)

    def settle(self, req: RouteRequest, routes: Sequence[View], index: int,
               ties: Sequence[int]) -> tuple[int, Sequence[int], str | None, str]:
        """Selective disaggregation after the pick: a pair whose decode instance lacks
        fewer than the threshold runs there alone (moving KV is not worth a hop). With the
        TBT objective, the chosen route's priced stall is booked in its window (a decision
        for the same request again replaces it)."""
        route = routes[index]
        if self.stalls is not None:
            rid, priced = self._priced
            stall = priced.get(route.candidate.id, 0.0) if route.prefill is None and rid == req.id else 0.0
            self.stalls.ledger.book(req.id, stall)
        if route.prefill is None:
            return index, ties, "colocated" if route.candidate.role == "mixed" else "decode_only_faster", _mode(route)
        if transfer_tokens(req, route) < self._pd.selective_threshold_tokens:
            d = route.candidate.id
            for i, alt in enumerate(routes):
                if alt.prefill is None and alt.candidate.id == d:
                    return i, (i,), "decode_only_threshold", _mode(alt)
        return index, ties, "pair", "disaggregated"


@plugin("routes", "instances")
def instances(params: NoParams, ctx: BuildContext) -> InstanceRoutes:
    """Every candidate instance as a route of its own."""
    return InstanceRoutes()


@plugin("routes", "pd_pairs")
def pd_pairs(params: NoParams, ctx: BuildContext) -> PairRoutes:
    """Compatible (P, D) pairs of the top pd.max_pair_candidates, plus decode-alone routes (pd.*)."""
    return PairRoutes(ctx.policy.ttft, ctx.require_pd("pd_pairs"), ctx.clock)
