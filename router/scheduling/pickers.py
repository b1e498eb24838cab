"""Pickers turn per-route totals into one route (an index) and the acceptable near-ties."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from router.scheduling.framework import View
from router.scheduling.registry import BuildContext, NoParams, Params, plugin


class MaxScorePicker:
    """Highest total; totals within ``tolerance`` (relative) of the best are a tie broken at
    random, never by list order (list order herds: every replica agrees on index 0)."""

    name = "max_score"
    revisable = True

    def __init__(self, rng: random.Random, tolerance: float = 0.0) -> None:
        self._rng = rng
        self._tolerance = tolerance

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        best = max(totals)
        floor = best - abs(best) * self._tolerance - 1e-12
        ties = [i for i, t in enumerate(totals) if t >= floor]
        return self._rng.choice(ties), ties


class FirstMaxPicker:
    """Highest total, ties to the FIRST route in candidate order: sglang-router's index
    scan. Kept for its baseline, whose herding onto instance 0 the replay should show."""

    name = "first_max"
    revisable = True

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        index = totals.index(max(totals))
        return index, (index,)


class RandomPicker:
    name = "random"
    revisable = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        every = range(len(routes))
        return self._rng.choice(every), every


class RoundRobinPicker:
    """Cycles through routes in key order; the counter lives in the picker, not a global."""

    name = "round_robin"
    revisable = False

    def __init__(self) -> None:
        self._next = 0

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        order = sorted(range(len(routes)), key=lambda i: routes[i].key)
        chosen = order[self._next % len(order)]
        self._next += 1
        return chosen, order


class MaxScoreParams(Params):
    tolerance: float = Field(default=0.0, ge=0, lt=1, description="totals within this fraction of the best are a random tie")


@plugin("picker", "max_score", MaxScoreParams)
def max_score(params: MaxScoreParams, ctx: BuildContext) -> MaxScorePicker:
    """Highest total; near-ties within tolerance broken at random."""
    return MaxScorePicker(ctx.rng, params.tolerance)


@plugin("picker", "first_max")
def first_max(params: NoParams, ctx: BuildContext) -> FirstMaxPicker:
    """Highest total; ties to the first in candidate order (sglang-router)."""
    return FirstMaxPicker()


@plugin("picker", "random")
def random_(params: NoParams, ctx: BuildContext) -> RandomPicker:
    """Uniform over the routes, ignoring the scores."""
    return RandomPicker(ctx.rng)


@plugin("picker", "round_robin")
def round_robin(params: NoParams, ctx: BuildContext) -> RoundRobinPicker:
    """Cycle through the routes in key order, ignoring the scores."""
    return RoundRobinPicker()
