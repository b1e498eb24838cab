"""Routing as a pipeline of small plugins: filters, weighted scorers, a picker.

Each scorer is a pure function of (request, candidate views) -> one score per candidate,
higher is better, in [0, 1]. A policy sums them with the weights from config and hands
the totals to a picker. The live router, the emulator benchmarks and the offline replay
all call the same ``Policy.choose``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from router.core.instances import Candidate
from router.state.base import Load, Snapshot


@dataclass(frozen=True)
class RouteRequest:
    """The routing-relevant facts of one request (no prompt text)."""

    id: str
    keys: tuple[int, ...]
    prompt_tokens: int
    max_tokens: int
    block_tokens: int


class View(NamedTuple):
    """A candidate as a policy sees it for one request (a tuple: built per candidate per
    decision, so it must be cheap)."""

    candidate: Candidate
    matched_blocks: int
    load: Load

    @property
    def id(self) -> str:
        return self.candidate.id

    def cached_tokens(self, req: RouteRequest) -> int:
        return min(req.prompt_tokens, self.matched_blocks * req.block_tokens)


def route_key(instance: str, prefill: str | None = None) -> str:
    """Names a route: the answering instance, with its prefill instance when disaggregated."""
    return instance if prefill is None else f"{instance}<-{prefill}"


@dataclass(frozen=True)
class Decision:
    instance: str  # answers the client: the colocated or decode instance
    acceptable: frozenset[str]  # route keys of the near-ties the picker chose among
    reason: str  # which rule decided, for metrics and /debug/route
    scores: Mapping[str, float] = field(default_factory=dict)  # per route key
    terms: Mapping[str, dict[str, float]] = field(default_factory=dict)  # per route key: cost terms
    prefill: str | None = None  # remote prefill instance, when disaggregated
    mode: str = "colocated"  # colocated | disaggregated | decode_only
    estimate_s: float | None = None  # predicted TTFT of the chosen route, when the policy has one
    prefill_tokens: int | None = None  # uncached tokens the prefilling instance computes
    prefill_work: int | None = None  # what to book as its queued prefill (tokens at its rate), if priced

    @property
    def key(self) -> str:
        return route_key(self.instance, self.prefill)


class Filter(Protocol):
    name: str

    def keep(self, req: RouteRequest, views: Sequence[View]) -> list[View]: ...


class Scorer(Protocol):
    name: str

    def score(self, req: RouteRequest, views: Sequence[View]) -> list[float]: ...


class Picker(Protocol):
    def pick(self, views: Sequence[View], totals: Sequence[float]) -> tuple[str, frozenset[str]]: ...


class Policy(Protocol):
    name: str
    revisable: bool

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision: ...


_IDLE = Load()


def build_views(candidates: Sequence[Candidate], snap: Snapshot) -> list[View]:
    matched, loads = snap.matched, snap.loads
    return [View(c, matched.get(c.id, 0), loads.get(c.id, _IDLE)) for c in candidates]


class LazyTerms(Mapping[str, dict[str, float]]):
    """Per-route cost terms, built only when read (by /debug/route or calibration):
    building hundreds of small dicts on every decision would dominate its cost."""

    def __init__(self, build: Callable[[], dict[str, dict[str, float]]]) -> None:
        self._build = build
        self._data: dict[str, dict[str, float]] | None = None

    def _get(self) -> dict[str, dict[str, float]]:
        if self._data is None:
            self._data = self._build()
        return self._data

    def __getitem__(self, key: str) -> dict[str, float]:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class Pipeline:
    """Filters, then the weighted sum of scorers, then the picker."""

    def __init__(
        self,
        name: str,
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        filters: Sequence[Filter] = (),
        *,
        revisable: bool = True,
    ) -> None:
        self.name = name
        # False for load-blind policies (round robin, random): re-running them on a fresher
        # view would only advance their counters.
        self.revisable = revisable
        self._scorers = list(scorers)
        self._picker = picker
        self._filters = list(filters)

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision:
        if not candidates:
            raise ValueError("no candidates")
        views = build_views(candidates, snap)
        reason = "score"
        for flt in self._filters:
            kept = flt.keep(req, views)
            if kept and len(kept) < len(views):
                views, reason = kept, f"score after {flt.name}"
        per_scorer: dict[str, list[float]] = {}
        totals: list[float] = [0.0] * len(views)
        for scorer, weight in self._scorers:
            values = scorer.score(req, views)
            per_scorer[scorer.name] = values
            if len(self._scorers) == 1 and weight == 1.0:
                totals = values
            else:
                totals = [t + weight * v for t, v in zip(totals, values)]
        chosen, acceptable = self._picker.pick(views, totals)
        ids = [v.id for v in views]

        def terms() -> dict[str, dict[str, float]]:
            return {i: {name: vals[k] for name, vals in per_scorer.items()} for k, i in enumerate(ids)}

        estimate = work = None
        chosen_view = views[ids.index(chosen)]
        for scorer, _ in self._scorers:
            if isinstance(scorer, Estimator):
                estimate = scorer.estimate(req, chosen_view)
                work = scorer.prefill_work(req, chosen_view)
        return Decision(chosen, acceptable, reason, dict(zip(ids, totals)), LazyTerms(terms), estimate_s=estimate,
                        prefill_work=work)


@runtime_checkable
class Estimator(Protocol):
    """A scorer that also predicts the chosen instance's TTFT (seconds) and the prefill
    work the request will queue there (tokens at the instance's rate)."""

    def estimate(self, req: RouteRequest, view: View) -> float: ...

    def prefill_work(self, req: RouteRequest, view: View) -> int: ...
