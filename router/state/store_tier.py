"""The store tier of residency: what the router believes a shared KV store holds.

Why: with a store behind the engines (Mooncake Store, LMCache remote), what was computed
anywhere can be loaded anywhere, so every prefix the router sent to an engine is, as far as
it knows, in the store too. The belief is a residency index with one holder, bounded like
an instance's: at most ``capacity`` block keys (the store's capacity over the router's block
size, and never more than ``max_entries``), least recently used first out, each entry
expiring after ``ttl_s``; its LRU position gives a confidence, as for instances. It lives in
each router process (replicas each learn from their own traffic; a prefix another replica
stored is priced as a recompute until this one routes it).

Loads share the store's bandwidth: every request routed to load from it books its load here
until it is expected done (``book_load``), so the next one is priced behind what is still
moving (store_cost.load_seconds). A booking expires by itself at its expected end: no release
to lose, at the price of trusting the estimate (at most ``max_loads`` are kept, the one ending
soonest out; router/state/store_loads.py keeps them so a decision reads sums, not a scan).

Loads that start after a load also share its bandwidth while it moves: what is moving now
is not all it will share. The tier keeps the store's utilization ``rho`` (seconds of
bandwidth the loads booked in the last ``window_s`` asked for, per second), and a load is
stretched by 1 / (1 - rho), the expected stay in a processor-sharing queue at that load.
Without it the replay's loads took 1.2x (median) to 2.7x (p90) their price, and 1.3x / 2.9x
the fair share of the loads moving at their start even when those were known exactly
(docs/benchmarks.md, store replay).

A load also ends somewhere: each booking names its instance and when the request is expected
ready for its last prompt token (``ready_s``, the decision's TTFT estimate). That token needs
one more engine step, and when another prefill is computing there the step in progress and
the next are that prefill's chunks (chunked prefill): the loader's first token comes up to a
step and a half later. The tier lists these landings per instance (``landings``) so a later
decision can price the delay it would cause by computing there (store_cost.landing_delay_s).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.config.kvstore import KVStoreConfig
from router.state.residency import ResidencyIndex
from router.state.store_loads import LandingBook, LoadBook

_STORE = "kv_store"


@dataclass(frozen=True, slots=True)
class StoreHit:
    """The leading blocks of one request the store holds, and what loading them costs."""

    blocks: int
    confidence: float
    bytes_per_s: float
    bytes_per_token: int  # the store's default; an instance's own kv_bytes_per_token wins
    setup_s: float
    loads: int = 0  # loads booked and still moving
    backlog_s: float = 0.0  # what they still move, in seconds of the store's bandwidth
    utilization: float = 0.0  # of the store's bandwidth by the loads booked lately (StoreTier.utilization)


class StoreTier:
    max_loads = 4096
    max_utilization = 0.9  # beyond it the price stops growing: the bookings outrun the bandwidth (10x stretch)

    def __init__(self, capacity: int, bytes_per_s: float, bytes_per_token: int, setup_s: float = 0.0,
                 ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic, window_s: float = 30.0) -> None:
        if capacity < 1 or bytes_per_s <= 0 or bytes_per_token < 1 or window_s <= 0:
            raise ValueError("a store tier needs a capacity, a bandwidth, bytes per token and a window")
        self.capacity = capacity
        self._index = ResidencyIndex(ttl_s)
        self._bytes_per_s, self._bytes_per_token, self._setup_s = bytes_per_s, bytes_per_token, setup_s
        self._clock = clock
        self._loads = LoadBook(self.max_loads)
        self._window_s = window_s
        self._started: deque[tuple[float, float]] = deque(maxlen=self.max_loads)  # (start, seconds alone), last window
        self._asked_s = 0.0  # sum of the seconds alone in _started
        self._landings = LandingBook(self.max_loads)

    def hit(self, keys: Sequence[int]) -> StoreHit | None:
        """What the store holds of ``keys``, or None when nothing (the request prices as without a store)."""
        blocks = self._index.matched(keys, (_STORE,), self._clock())[_STORE]
        if not blocks:
            return None
        confidence = self._index.confidence(_STORE, keys[blocks - 1])
        now = self._clock()
        loads, backlog = self._in_flight(now)
        return StoreHit(blocks, confidence, self._bytes_per_s, self._bytes_per_token, self._setup_s, loads, backlog,
                        self.utilization(now))

    def utilization(self, now: float) -> float:
        """Share of the store's bandwidth the loads booked in the last ``window_s`` asked for
        (at most ``max_utilization``); loads older than the window are dropped."""
        started = self._started
        while started and started[0][0] <= now - self._window_s:
            self._asked_s -= started.popleft()[1]
        if not started:
            self._asked_s = 0.0  # no float drift survives an empty window
        return min(self.max_utilization, max(0.0, self._asked_s) / self._window_s)

    def _in_flight(self, now: float) -> tuple[int, float]:
        """Loads still moving, and the seconds of bytes they have left (each drains evenly
        over its expected duration); ended ones are dropped."""
        return self._loads.in_flight(now)

    def landings(self) -> Mapping[str, tuple[float, ...]]:
        """Per instance, in seconds from now, when the loads booked there are expected to be
        ready for their last token (past ones are dropped); empty when none is pending."""
        return self._landings.pending(self._clock())

    def book_load(self, tokens: float, bytes_per_token: int, instance: str | None = None,
                  ready_s: float | None = None) -> None:
        """A request was routed to load ``tokens`` of KV from the store: book its bytes until
        it is expected done, sharing the bandwidth with what is already moving; with its
        ``instance``, book where and when (``ready_s`` from now, else the load's end) it will
        wait for its last token."""
        if tokens <= 0:
            return
        now = self._clock()
        loads, backlog = self._in_flight(now)
        alone = tokens * bytes_per_token / self._bytes_per_s
        stretch = 1.0 / (1.0 - self.utilization(now))
        end = now + self._setup_s + (alone + min(loads * alone, backlog)) * stretch
        self._loads.add(now, end, alone)
        if instance is not None:
            self._landings.add(now + ready_s if ready_s is not None else end, instance)
        if len(self._started) == self._started.maxlen:
            self._asked_s -= self._started[0][1]
        self._started.append((now, alone))
        self._asked_s += alone

    def record(self, keys: Sequence[int]) -> None:
        """``keys`` were computed (or loaded) somewhere: the engine writes them to the store."""
        if keys:
            self._index.record(_STORE, keys, self.capacity, self._clock())

    def __len__(self) -> int:
        return int(round(self._index.fill(_STORE) * self.capacity))


def build_store_tier(kv_store: KVStoreConfig, pd_bytes_per_token: int, block_tokens: int,
                     clock: Callable[[], float] = time.monotonic) -> StoreTier | None:
    """The tier ``kv_store`` describes, or None when the engines share no store."""
    if not kv_store.enabled:
        return None
    capacity = max(1, min(kv_store.max_entries, kv_store.capacity_tokens // max(1, block_tokens)))
    return StoreTier(capacity, kv_store.bandwidth_gbps * 1e9 / 8, kv_store.token_bytes(pd_bytes_per_token),
                     kv_store.setup_s, kv_store.ttl_s, clock)
