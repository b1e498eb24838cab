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

Load the engines report beyond the router's bookings (router/engines/external.py) is not in
the index. Those instances are kept, but not counted among the ``k``: the least booked
instances without external load are then still ``k``, and an instance left out has booked
load (hence true load, booked + external) at least theirs, so the least-loaded non-holder
by the load the scorers see is always scored. When every instance reports external load
this scores them all, as without pruning.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.core.instances import Candidate
from router.scheduling.framework import RouteRequest
from router.state.base import Load, StateStore


@dataclass(frozen=True)
class Pruned:
    candidates: Sequence[Candidate]
    request: RouteRequest


class Pruner:
    def __init__(self, k: int, rng: random.Random) -> None:
        self.k = k
        self._rng = rng
        # The last pool pruned, and what was derived from it: consecutive decisions mostly see
        # the same pool (the same Candidate objects), and rebuilding these was most of
        # pruning's cost at a thousand instances.
        self._pool: list[Candidate] = []
        self._ids: list[str] = []
        self._by_id: dict[str, Candidate] = {}
        # (load index, its membership count) when every loaded instance was last found in the
        # pool: the subset test is a pass over the loaded instances, and membership changes
        # far less often than decisions are made on a busy pool.
        self._inside: tuple[object, int] | None = None

    def _index_pool(self, candidates: Sequence[Candidate]) -> tuple[list[str], dict[str, Candidate]]:
        pool = candidates if isinstance(candidates, list) else list(candidates)
        if pool != self._pool:  # identical objects compare in C without calling __eq__
            self._pool = list(pool)
            self._inside = None
            self._ids = [c.id for c in pool]
            self._by_id = dict(zip(self._ids, pool))
        return self._ids, self._by_id

    def prune(self, store: StateStore, req: RouteRequest, candidates: Sequence[Candidate],
              elsewhere: Mapping[str, Load] | None = None) -> Pruned | None:
        """The candidates worth scoring, or None to score them all (small pool, no index).
        ``elsewhere``: external load per instance (the engines' own reports), kept but not
        counted among the least loaded."""
        k = self.k
        if k <= 0 or len(candidates) <= 2 * k:
            return None
        index = store.load_index()
        if index is None:
            return None
        ids, by_id = self._index_pool(candidates)
        chosen: dict[str, None] = {}
        if req.keys:
            for inst in store.first_block_holders(req.keys[0]):
                if inst in by_id:
                    chosen[inst] = None
        loaded = index.loaded
        # Idle non-holders, in pool order (the seeded sample depends on it). When every loaded
        # instance is in the pool (no retry exclusions: the usual case) their number is a
        # subtraction, so a busy pool costs no pass over it beyond one C-level subset test.
        seen = (index, index.membership)
        inside = self._inside == seen or loaded.keys() <= by_id.keys()
        self._inside = seen if inside else None
        unloaded = by_id.keys() - loaded.keys() - chosen.keys() if not inside or len(by_id) > len(loaded) else ()
        idle = [i for i in ids if i in unloaded] if unloaded else []
        busy_idle: list[str] = []  # idle by booking, loaded by the engine's own report
        if elsewhere:
            busy_idle = [i for i in idle if i in elsewhere]
            if busy_idle:
                idle = [i for i in idle if i not in elsewhere]
        take = self._rng.sample(idle, k) if len(idle) > k else idle
        chosen.update(dict.fromkeys(take))
        if len(take) < k:
            chosen.update(dict.fromkeys(busy_idle))
            need = k - len(take)
            for inst in index.ascending():
                if inst in by_id and inst not in chosen:
                    chosen[inst] = None
                    if elsewhere and inst in elsewhere:
                        continue
                    need -= 1
                    if not need:
                        break
        total = index.total_requests
        if not inside:
            total -= sum(index.requests(i) for i in loaded.keys() - by_id.keys())
        if elsewhere:  # the bounded-load filter's mean, as the scorers' snapshot counts it
            total += sum(load.requests for i, load in elsewhere.items() if i in by_id)
        return Pruned([by_id[i] for i in chosen], req.with_population((total, len(candidates))))
