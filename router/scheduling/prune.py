"""Candidate pruning: the step before scoring that keeps a decision from growing with the cluster.

Only instances holding the prompt's first block can have any of it cached; every other
instance prices the whole prompt, so among them the ttft estimate is ordered by booked
work alone (router/state/load_index.py). A decision therefore scores:

- every holder of the first block (the store's residency index, not a scan), and
- ``k`` non-holders of least load key: idle ones first (a seeded sample, so replicas and
  bursts do not herd on list order), then the loaded ones in ascending key order.

Equivalence with scoring everyone (tests/scheduling/test_prune.py replays a synthetic
trace both ways): the chosen route is always one full scoring would have accepted, i.e. in
its near-tie set (estimate within ``tie_tolerance`` of the best), because the best route is
a holder or the least-key non-holder, and both are kept. The bounded-load filter still sees
the whole pool's mean load (``RouteRequest.population``). Exact for instances of one prefill
rate; with mixed rates the k least-loaded are a heuristic, hence k of a few dozen.
Only colocated pipelines (route generator ``instances``) are pruned; (P, D) pairing is not.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from router.core.instances import Candidate
from router.scheduling.framework import RouteRequest
from router.state.base import StateStore


@dataclass(frozen=True)
class Pruned:
    candidates: Sequence[Candidate]
    request: RouteRequest


class Pruner:
    def __init__(self, k: int, rng: random.Random) -> None:
        self.k = k
        self._rng = rng

    def prune(self, store: StateStore, req: RouteRequest, candidates: Sequence[Candidate]) -> Pruned | None:
        """The candidates worth scoring, or None to score them all (small pool, no index)."""
        k = self.k
        if k <= 0 or len(candidates) <= 2 * k:
            return None
        index = store.load_index()
        if index is None:
            return None
        ids = [c.id for c in candidates]
        by_id = dict(zip(ids, candidates))
        chosen: dict[str, None] = {}
        if req.keys:
            for inst in store.first_block_holders(req.keys[0]):
                if inst in by_id:
                    chosen[inst] = None
        loaded = index.loaded
        idle = [i for i in ids if i not in loaded and i not in chosen]
        take = self._rng.sample(idle, k) if len(idle) > k else idle
        chosen.update(dict.fromkeys(take))
        if len(take) < k:
            need = k - len(take)
            for inst in index.ascending():
                if inst in by_id and inst not in chosen:
                    chosen[inst] = None
                    need -= 1
                    if not need:
                        break
        total = index.total_requests - sum(index.requests(i) for i in loaded.keys() - by_id.keys())
        return Pruned([by_id[i] for i in chosen], replace(req, population=(total, len(candidates))))
