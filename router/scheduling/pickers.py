"""Pickers turn per-candidate totals into one instance (and the set of near-ties)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.scheduling.framework import View


class MaxScorePicker:
    """Highest total; totals within ``tolerance`` (relative) of the best are a tie broken at
    random, never by list order (list order herds: every replica agrees on index 0)."""

    def __init__(self, rng: random.Random, tolerance: float = 0.0) -> None:
        self._rng = rng
        self._tolerance = tolerance

    def pick(self, views: Sequence[View], totals: Sequence[float]) -> tuple[str, frozenset[str]]:
        best = max(totals)
        floor = best - abs(best) * self._tolerance - 1e-12
        ties = [v.id for v, t in zip(views, totals) if t >= floor]
        return self._rng.choice(ties), frozenset(ties)


class RandomPicker:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, views: Sequence[View], totals: Sequence[float]) -> tuple[str, frozenset[str]]:
        ids = [v.id for v in views]
        return self._rng.choice(ids), frozenset(ids)


class RoundRobinPicker:
    """Cycles through candidates in order; the counter lives in the picker, not a global."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, views: Sequence[View], totals: Sequence[float]) -> tuple[str, frozenset[str]]:
        ids = sorted(v.id for v in views)
        chosen = ids[self._next % len(ids)]
        self._next += 1
        return chosen, frozenset(ids)
