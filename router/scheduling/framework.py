"""The contracts of routing plugins and of the decision they produce.

A policy is a pipeline (pipeline.py): a route generator lists the routes a request may
take, filters drop some, weighted scorers score the rest, a picker chooses. A route is a
``View`` of the instance that answers the client (colocated, mixed or decode), carrying
the view of its remote prefill instance when disaggregated; colocated routes are the
instance views themselves, so a colocated decision allocates nothing per route.
Plugins are registered by name (registry.py) and declared in config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from router.core.instances import Candidate
from router.core.frozen import quick_init
from router.state.base import Load, Snapshot
from router.state.displacement import FULL_ROOM
from router.state.store_tier import StoreHit


@quick_init
@dataclass(frozen=True)
class RouteRequest:
    """The routing-relevant facts of one request (no prompt text)."""

    id: str
    keys: tuple[int, ...]
    prompt_tokens: int
    max_tokens: int
    block_tokens: int
    # (requests in flight, instances) over every candidate, set when the candidates were
    # pruned (prune.py), so whole-pool filters (bounded_load) keep their whole-pool view
    population: tuple[int, int] | None = None
    # what a shared KV store holds of the prompt (kv_store; store_tier.py), None without one
    store: StoreHit | None = None
    # per instance, seconds from now when store loads booked there wait for their last token
    # (StoreTier.landings; priced by store_cost.landing_delay_s), None without a store tier
    landings: Mapping[str, tuple[float, ...]] | None = None

    def with_population(self, population: tuple[int, int]) -> RouteRequest:
        """This request with its pool's ``population`` (``dataclasses.replace`` costs 3x)."""
        return RouteRequest(self.id, self.keys, self.prompt_tokens, self.max_tokens, self.block_tokens, population,
                            self.store, self.landings)


@quick_init
@dataclass(frozen=True)
class RouteCost:
    """Every term of a priced route (pd_cost.route_cost), for scorers and /debug/route."""

    queue_s: float
    prefill_s: float
    transfer_s: float
    admission_s: float
    step_s: float
    prefill_tokens: int
    transfer_tokens: int
    transfer_bytes: int = 0  # what the handoff books on both NICs (link-aware booking)

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.transfer_s + self.admission_s + self.step_s

    def as_dict(self) -> dict[str, float]:
        return {
            "ttft_s": self.total_s,
            "queue_s": self.queue_s,
            "prefill_s": self.prefill_s,
            "transfer_s": self.transfer_s,
            "admission_s": self.admission_s,
            "decode_step_s": self.step_s,
            "prefill_tokens": float(self.prefill_tokens),
            "transfer_tokens": float(self.transfer_tokens),
            "transfer_bytes": float(self.transfer_bytes),
        }


class View(NamedTuple):
    """An instance as a policy sees it for one request, and a route: the answering
    instance plus, when disaggregated, its prefill instance. A tuple, built per candidate
    per decision, so it must be cheap."""

    candidate: Candidate
    matched_blocks: int
    load: Load
    prefill: View | None = None  # the remote prefill instance of a disaggregated route
    cost: RouteCost | None = None  # the route's price, when its generator priced it (pd_pairs)
    confidence: float = 1.0  # that the engine still holds the matched run (residency.py's LRU model)
    room: tuple[int, float, float] = FULL_ROOM  # (free blocks, re-prefills per displaced token there, in the pool)

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def key(self) -> str:
        """The route key: the answering instance, ``D<-P`` when disaggregated."""
        return self.candidate.id if self.prefill is None else f"{self.candidate.id}<-{self.prefill.candidate.id}"

    @property
    def prefilling(self) -> View:
        """The instance that computes the prompt: the prefill instance, else this one."""
        return self if self.prefill is None else self.prefill

    def cached_tokens(self, req: RouteRequest) -> int:
        return min(req.prompt_tokens, self.matched_blocks * req.block_tokens)

    def expected_cached_tokens(self, req: RouteRequest) -> float:
        """Cached tokens weighted by the confidence that the engine still holds them."""
        return self.cached_tokens(req) * self.confidence


def route_key(instance: str, prefill: str | None = None) -> str:
    """Names a route: the answering instance, with its prefill instance when disaggregated."""
    return instance if prefill is None else f"{instance}<-{prefill}"


_IDLE = Load()
_new_view = tuple.__new__  # NamedTuple's own __new__ costs a Python call per candidate


def build_views(candidates: Sequence[Candidate], snap: Snapshot) -> list[View]:
    matched, loads, conf, room = snap.matched, snap.loads, snap.confidence, snap.room
    return [_new_view(View, (c, matched.get(c.id, 0), loads.get(c.id, _IDLE), None, None, conf.get(c.id, 1.0),
                             room.get(c.id, FULL_ROOM))) for c in candidates]


class LazyMap(Mapping[str, Any]):
    """A mapping built only when read (by /debug/route, calibration or tests): building
    hundreds of small dicts on every decision would dominate its cost."""

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = build
        self._data: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._data is None:
            self._data = self._build()
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@quick_init
@dataclass(frozen=True)
class Decision:
    instance: str  # answers the client: the colocated or decode instance
    acceptable: frozenset[str]  # route keys of the near-ties the picker chose among
    reason: str  # which rule decided, for metrics and /debug/route
    scores: Mapping[str, float] = field(default_factory=dict)  # route key -> total, for routes that were scored
    terms: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # route key -> cost terms
    prefill: str | None = None  # remote prefill instance, when disaggregated
    mode: str = "colocated"  # colocated | disaggregated | decode_only
    estimate_s: float | None = None  # predicted TTFT of the chosen route, when the policy has one
    prefill_work: int | None = None  # what to book as its queued prefill (tokens at its rate), if priced
    plugin_scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # route key -> scorer -> score
    filtered: Mapping[str, str] = field(default_factory=dict)  # route key -> the filter that dropped it
    profiles: Mapping[str, Decision] = field(default_factory=dict)  # per profile, for multi-profile policies

    @property
    def key(self) -> str:
        return route_key(self.instance, self.prefill)


_DECISION_FIELDS = frozenset(Decision.__dataclass_fields__)


def new_decision(**fields: Any) -> Decision:
    """``Decision(**fields)`` without the frozen ``__init__``'s ``object.__setattr__`` per
    field (0.5 vs 2.3 us: one per decision); every field must be given (a TypeError names
    the missing or unknown ones, as ``__init__`` would)."""
    if fields.keys() != _DECISION_FIELDS:
        raise TypeError(f"new_decision: missing {sorted(_DECISION_FIELDS - fields.keys())}, "
                        f"unknown {sorted(fields.keys() - _DECISION_FIELDS)}")
    out: Decision = object.__new__(Decision)
    out.__dict__.update(fields)
    return out


class RouteGenerator(Protocol):
    """Lists the routes of a request, and settles the picked one (e.g. selective
    disaggregation: a pair whose decode instance lacks little runs there alone)."""

    name: str
    disaggregates: bool  # produces (P, D) routes: the generator for a cluster with a prefill pool

    def routes(self, req: RouteRequest, views: list[View]) -> list[View]: ...

    def settle(self, req: RouteRequest, routes: Sequence[View], index: int,
               ties: Sequence[int]) -> tuple[int, Sequence[int], str | None, str]:
        """(index, acceptable indices, reason or None to keep the pipeline's, mode)."""
        ...


class Filter(Protocol):
    name: str

    def keep(self, req: RouteRequest, routes: Sequence[View]) -> tuple[list[View], str | None]:
        """The routes kept, in order, and the reason to report (None: "score after <name>"
        when it dropped any)."""
        ...


class Scorer(Protocol):
    name: str

    def score(self, req: RouteRequest, routes: Sequence[View]) -> list[float]: ...


class Estimator(Protocol):
    """A scorer that also predicts the chosen route's TTFT (seconds) and the prefill work
    the request will queue on its prefilling instance (tokens at that instance's rate)."""

    def estimate(self, req: RouteRequest, route: View) -> float: ...

    def prefill_work(self, req: RouteRequest, route: View) -> int: ...


class Picker(Protocol):
    name: str
    revisable: bool  # False for load-blind pickers: re-picking on a fresher view only advances their state

    def pick(self, routes: Sequence[View], totals: Sequence[float]) -> tuple[int, Sequence[int]]:
        """The chosen index and the indices of the acceptable near-ties (chosen included)."""
        ...


class Policy(Protocol):
    name: str
    revisable: bool

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate], snap: Snapshot) -> Decision: ...
