"""Shared KV links: concurrent transfers divide a link's bandwidth (fluid processor sharing).

Why: a router that divides bandwidth among the transfers it booked can only be measured in
a world that divides it too. Each transfer crosses a set of links (the sender's NIC, the
receiver's NIC and, across zones, both zone uplinks); at any instant it moves at
``min over its links of capacity / transfers on that link``. This is simpler than max-min
fairness (a transfer bottlenecked elsewhere leaves its share unused) and errs towards slower
transfers; it is exact when every transfer shares the same bottleneck.

A transfer may grow while in flight (SGLang streams each prefill chunk as it is computed)
and only finishes once it is ``sealed`` (the prefill is done) and every byte has moved.

Pure and clock-agnostic: the caller says what time it is. The replay drives it in virtual
time; ``AsyncLink`` below drives one NIC in wall time for the HTTP emulator.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

EPS_BYTES = 1.0
"""Less than a byte left counts as done (float time cannot resolve less at 100 GB/s)."""
SNAP_S = 1e-9
"""A transfer with less than this much time left at its rate is done (no events closer than float time allows)."""


@dataclass(slots=True, eq=False)
class Transfer:
    id: Hashable
    links: tuple[Hashable, ...]
    remaining: float = 0.0
    sealed: bool = False
    moved: float = 0.0

    @property
    def done(self) -> bool:
        return self.sealed and self.remaining <= EPS_BYTES


@dataclass
class Fabric:
    """Links (id -> bytes/s) and the transfers crossing them."""

    capacity: dict[Hashable, float]
    now: float = 0.0
    transfers: dict[Hashable, Transfer] = field(default_factory=dict)
    _users: dict[Hashable, int] = field(default_factory=dict)
    # what the links carried (loadtests/burst_objective.py's saturation measure): every byte moved, those moved
    # slower than their transfer would alone (a link on its path divided: demand above its capacity), and per
    # link the seconds it moved bytes
    moved_bytes: float = 0.0
    shared_bytes: float = 0.0
    busy_s: dict[Hashable, float] = field(default_factory=dict)

    def rate(self, t: Transfer) -> float:
        """Bytes/s transfer ``t`` moves at now (0 when it has nothing left to send)."""
        if t.remaining <= EPS_BYTES:
            return 0.0
        return min(self.capacity[link] / max(1, self._users.get(link, 0)) for link in t.links)

    def advance(self, now: float) -> None:
        """Move every transfer's bytes for the time since the last call."""
        dt = now - self.now
        if dt < -1e-12:
            raise ValueError(f"link time went backwards: {now} after {self.now}")
        if dt > 0 and self.transfers:
            rates = [(t, self.rate(t)) for t in self.transfers.values()]
            cap, busy = self.capacity, self.busy_s
            for link in self._users:
                busy[link] = busy.get(link, 0.0) + dt
            for t, r in rates:
                step = min(t.remaining, r * dt)
                t.remaining -= step
                if r > 0 and t.remaining < r * SNAP_S:
                    step += t.remaining
                    t.remaining = 0.0
                if step <= 0:
                    continue
                t.moved += step
                self.moved_bytes += step
                if r < min(cap[link] for link in t.links) * (1 - 1e-9):
                    self.shared_bytes += step
            self._recount()
        self.now = max(self.now, now)

    def start(self, tid: Hashable, links: Sequence[Hashable], nbytes: float = 0.0, sealed: bool = False) -> Transfer:
        for link in links:
            if link not in self.capacity:
                raise KeyError(f"unknown link {link!r}")
        t = Transfer(tid, tuple(links), float(nbytes), sealed)
        self.transfers[tid] = t
        self._recount()
        return t

    def grow(self, tid: Hashable, nbytes: float, seal: bool = False) -> None:
        t = self.transfers[tid]
        t.remaining += nbytes
        t.sealed = t.sealed or seal
        self._recount()

    def finish(self, tid: Hashable) -> Transfer:
        t = self.transfers.pop(tid)
        self._recount()
        return t

    def busy(self, link: Hashable) -> bool:
        """Some transfer is moving bytes over ``link`` now (what slows the engines there)."""
        return self._users.get(link, 0) > 0

    def next_done(self) -> tuple[float, Transfer] | None:
        """Earliest (time, transfer) to complete if nothing changes, or None."""
        best: tuple[float, Transfer] | None = None
        for t in self.transfers.values():
            if not t.sealed:
                continue
            r = self.rate(t)
            eta = self.now if t.remaining <= EPS_BYTES else (self.now + t.remaining / r if r > 0 else math.inf)
            if best is None or eta < best[0]:
                best = (eta, t)
        return best

    def _recount(self) -> None:
        users: dict[Hashable, int] = {}
        for t in self.transfers.values():
            if t.remaining > EPS_BYTES:
                for link in t.links:
                    users[link] = users.get(link, 0) + 1
        self._users = users


class AsyncLink:
    """One NIC in wall time: ``await send(nbytes)`` returns once the bytes have moved while
    sharing the NIC with every other transfer in flight on it. ``scale`` is wall seconds per
    model second (the emulator's time scale)."""

    def __init__(self, bytes_per_s: float, scale: float,
                 on_busy: Callable[[bool], None] | None = None) -> None:
        self._fabric = Fabric({"nic": bytes_per_s})
        self._scale = scale
        self._changed = asyncio.Event()
        self._seq = 0
        self._on_busy = on_busy

    @property
    def in_flight(self) -> int:
        return sum(1 for t in self._fabric.transfers.values() if t.remaining > EPS_BYTES)

    def _model_now(self) -> float:
        return asyncio.get_running_loop().time() / self._scale if self._scale > 0 else 0.0

    def _notify(self) -> None:
        if self._on_busy is not None:
            self._on_busy(self.in_flight > 0)
        self._changed.set()
        self._changed = asyncio.Event()

    async def send(self, nbytes: float) -> None:
        if nbytes <= 0:
            return
        if self._scale <= 0:  # time scale 0: transfers are instant
            return
        fabric = self._fabric
        fabric.advance(self._model_now())
        self._seq += 1
        tid = self._seq
        t = fabric.start(tid, ("nic",), nbytes, sealed=True)
        self._notify()
        try:
            while True:
                fabric.advance(self._model_now())
                if t.done:
                    return
                eta = t.remaining / fabric.rate(t) * self._scale
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), eta)
                except TimeoutError:
                    pass
        finally:
            fabric.advance(self._model_now())
            fabric.finish(tid)
            self._notify()
