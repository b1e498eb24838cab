"""The state store contract: residency ("who holds which leading blocks") and booked load.

A routing decision is ``decide(keys, instances, choose)``: the store hands ``choose`` a
snapshot, ``choose`` (the policy) returns a Booking, and the store books it, all as one
atomic step from the point of view of other decisions. Booking at decision time is what
keeps a burst of identical prefixes from seeing stale scores and herding.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from router.core.frozen import quick_init

if TYPE_CHECKING:
    from router.state.load_index import LoadIndex


@quick_init
@dataclass(frozen=True)
class Load:
    """Load booked on one instance by routers (never scraped, so never stale)."""

    requests: int = 0  # requests in flight
    prefill_tokens: int = 0  # queued prefill not yet done, in tokens (work-equivalent for ttft); released at first byte
    kv_tokens: int = 0  # KV of requests in flight: the union of their pinned blocks + what each holds alone (released at the end)
    transfers: int = 0  # KV transfers in flight into or out of the instance (released at first byte)
    transfer_bytes: int = 0  # KV bytes those transfers move over the instance's NIC (link-aware booking)
    # seconds the instance has been computing the head of its queued prefill: since that
    # work was booked onto an empty queue, or since the last prefill there finished (FCFS:
    # the next one starts then). Read only, set by stores that track it (memory), 0 otherwise;
    # not booked load, so not part of equality.
    prefill_started_s: float = field(default=0.0, compare=False)
    prefill_head_tokens: int = field(default=0, compare=False)  # that head's booked work: it cannot drain more

    @staticmethod
    def booked(requests: int, prefill_tokens: int, kv_tokens: int, transfers: int, transfer_bytes: int) -> "Load":
        """``Load(requests, ...)`` without the frozen ``__init__``'s ``object.__setattr__`` per
        field (0.4 vs 0.8 us): a store builds one on every booking change."""
        out = object.__new__(Load)
        out.__dict__.update(requests=requests, prefill_tokens=prefill_tokens, kv_tokens=kv_tokens, transfers=transfers,
                            transfer_bytes=transfer_bytes, prefill_started_s=0.0, prefill_head_tokens=0)
        return out

    def with_head(self, started_s: float, head_tokens: int) -> "Load":
        """This load with its queue head's progress: what a snapshot hands each candidate
        with queued prefill. A copy of the fields without the frozen ``__init__``'s one
        ``object.__setattr__`` per field (2.4 vs 0.9 us: a few dozen per decision)."""
        out = object.__new__(Load)
        fields = out.__dict__
        fields.update(self.__dict__)
        fields["prefill_started_s"] = started_s
        fields["prefill_head_tokens"] = head_tokens
        return out


@quick_init
@dataclass(frozen=True)
class Snapshot:
    """What a policy sees: leading cached blocks and booked load per candidate instance."""

    matched: dict[str, int]
    loads: dict[str, Load]
    # instance -> confidence (0..1) that the engine still holds its matched run (the LRU
    # position model of residency.py); an instance absent here is taken at 1.0
    confidence: dict[str, float] = field(default_factory=dict)
    # instance -> (free blocks, future re-prefills per token displaced there, and in the pool): the
    # LRU displacement model of residency.py, read by placement during the decision (a
    # live view); an instance absent here is taken as full, with no re-prefill known
    room: Mapping[str, tuple[int, float, float]] = field(default_factory=dict)


@quick_init
@dataclass(frozen=True)
class Leg:
    """One instance's share of a request: a colocated request has one leg, a
    disaggregated one a decode leg (first) and a prefill leg."""

    instance: str
    prefill_tokens: int = 0
    kv_tokens: int = 0
    transfers: int = 0
    transfer_bytes: int = 0
    transient: bool = False  # a remote prefill leg: wholly released at the first byte
    # tokens per block of the booking's keys, which this leg pins on its instance (a colocated
    # leg: pins.py): each block counted once there while any booking holding it is in flight,
    # on top of ``kv_tokens`` (what the request holds alone); 0 pins nothing
    block_tokens: int = 0


@quick_init
@dataclass(frozen=True)
class Booking:
    """A decision's footprint: load booked on each leg's instance and the prompt's prefix
    recorded on each of them (both P and D hold the KV after a handoff)."""

    id: str
    legs: tuple[Leg, ...]
    keys: tuple[int, ...] = ()

    @classmethod
    def single(cls, id: str, instance: str, prefill_tokens: int, kv_tokens: int, keys: Sequence[int] = (),
               block_tokens: int = 0) -> "Booking":
        """One leg: what every colocated decision books, so built without the frozen
        ``__init__``s' ``object.__setattr__`` per field (0.5 vs 1.3 us)."""
        leg = object.__new__(Leg)
        leg.__dict__.update(instance=instance, prefill_tokens=prefill_tokens, kv_tokens=kv_tokens, transfers=0,
                            transfer_bytes=0, transient=False, block_tokens=block_tokens)
        out = object.__new__(cls)
        out.__dict__.update(id=id, legs=(leg,), keys=tuple(keys))
        return out

    @property
    def instance(self) -> str:
        """The instance that answers the client (decode, or the only one)."""
        return self.legs[0].instance

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(leg.instance for leg in self.legs)

    @property
    def prefill_tokens(self) -> int:
        return sum(leg.prefill_tokens for leg in self.legs)


class Chooser(Protocol):
    """The policy side of a decision, bound to one request."""

    def __call__(self, snap: Snapshot) -> Booking:
        """Pick on ``snap`` and describe the booking."""
        ...

    def revise(self, snap: Snapshot, booking: Booking) -> Booking | None:
        """Given a fresher ``snap``, return a better booking, or None to keep ``booking``."""
        ...


class StateStore(abc.ABC):
    """Residency and load, in memory or shared through Redis; both pass tests/state/."""

    async def start(self) -> None:
        """Connect and start background work (lease refresh)."""

    async def close(self) -> None:
        """Stop background work and disconnect."""

    @abc.abstractmethod
    async def snapshot(self, keys: Sequence[int], instances: Sequence[str]) -> Snapshot:
        """Read-only view for ``keys`` over ``instances`` (used by /debug and tests)."""

    @abc.abstractmethod
    async def decide(self, keys: Sequence[int], instances: Sequence[str], choose: Chooser) -> tuple[Snapshot, Booking]:
        """Look up, let ``choose`` pick, book the pick and record its prefix; return both."""

    @abc.abstractmethod
    async def prefill_done(self, booking: Booking) -> None:
        """The first byte arrived: the booked prefill tokens no longer queue. Idempotent."""

    async def prefill_leg_done(self, booking: Booking) -> None:
        """A remote prefill instance finished computing the prompt (its leg answered) while
        the KV is still on its way to D: the leg's queued prefill work stops queueing there,
        the transfer and the rest stay booked until the first byte. Without it, requests
        behind would see finished work ahead of them for a whole transfer. Idempotent; a
        no-op for a booking without a remote prefill leg."""

    @abc.abstractmethod
    async def release(self, booking: Booking) -> None:
        """The request ended (any way): drop all its load. Idempotent."""

    @abc.abstractmethod
    async def abandon(self, booking: Booking, held: dict[str, int]) -> None:
        """The request never reached an engine (failed before its first byte): release it
        and take back the prefix it recorded beyond what each instance ``held`` before."""

    @abc.abstractmethod
    async def forget_instance(self, instance: str) -> None:
        """Drop an instance's residency (it restarted or left): its cache is gone."""

    def load_index(self) -> LoadIndex | None:
        """Loaded instances in load-key order, for candidate pruning; None when this store
        keeps none (pruning then stays off and every candidate is scored)."""
        return None

    def first_block_holders(self, key: int) -> Collection[str]:
        """Instances holding block ``key`` now (only they can match a prompt that starts with it)."""
        return ()

    def set_capacity(self, instance: str, cap: int) -> None:
        """Keep at most ``cap`` residency entries for ``instance`` from now on: one that joined
        after start (discovery, admin), or whose engine reported its real capacity."""

    async def drop_instance(self, instance: str) -> None:
        """An instance left for good: drop its residency and its booked load (requests still
        in flight to it release into nothing)."""
        await self.forget_instance(instance)

    @property
    def round_trips(self) -> int:
        """Network round trips made so far (0 for in-process stores)."""
        return 0
