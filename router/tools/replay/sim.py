"""Discrete-event replay of a trace through the router's own policy and state store.

Each arrival is routed exactly as live: ``routing.decide`` asks the policy built by
``build_policy`` and books the choice in a ``MemoryStore`` whose clock is the virtual
clock; ``prefill_done`` runs at the client's first token and ``release`` at the end, so
booked load rises and falls as it does in the router. The engines are the emulator's own
``Engine`` objects stepping in virtual time, each independently: an engine with work
runs one step at a time and its next step starts when the previous one ends.

A disaggregated request mirrors the HTTP emulator's vLLM handoff: the prefill engine runs
it with ``max_tokens=1`` and keeps its KV pinned; at that first token the decode engine's
local prefix hit is measured and the KV it lacks (all prompt tokens but the last) crosses
the link in ``kv_transfer_time``; then the decode engine gets the request with
``kv_ready_tokens = prompt - 1`` and the prefill engine unpins. (The HTTP emulator unpins
at the start of the pull; here the source blocks stay pinned until the bytes have moved,
as a real NIXL read needs. Concurrent transfers do not share bandwidth, as there.)

Events are a heap of (time, seq, kind, payload) merged with the sorted arrivals; at equal
times arrivals come first, so requests arriving together can share an engine's next step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from router.config.model import HashingConfig, StateConfig
from router.tools.emulator.perf import kv_transfer_time
from router.tools.emulator.request import EngineRequest, EventKind, StepOutput
from router.scheduling.framework import Policy, RouteRequest
from router.tools.replay.cluster import ClusterSpec, Node, build_cluster
from router.tools.replay.precise import EngineFeeds, Residency, token_hashing
from router.tools.replay.prompts import PromptBuilder
from router.tools.replay.record import Recorder
from router.tools.replay.trace import Trace
from router.scheduling.decide import Routed, decide
from router.state.base import StateStore
from router.state.memory import MemoryStore

T = TypeVar("T")
_STEP_END, _TRANSFER_END, _KICK = 0, 1, 2
_FIRST, _TOKEN = EventKind.FIRST_TOKEN, EventKind.TOKEN


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (every MemoryStore method) without an event
    loop: a replay makes about three store calls per request, and a loop per call would
    cost more than the decision itself."""
    try:
        coro.send(None)
    except StopIteration as stop:
        value: T = stop.value
        return value
    coro.close()
    raise RuntimeError("the state store suspended; the replay needs one that never awaits (MemoryStore)")


@dataclass(slots=True, eq=False)
class Flight:
    """A request between its arrival and its last token."""

    index: int
    routed: Routed
    answer: Node  # the engine that streams to the client
    prefill: Node | None  # remote prefill engine, when disaggregated
    request: EngineRequest  # on the engine that currently has it
    max_tokens: int


class Simulation:
    def __init__(self, trace: Trace, spec: ClusterSpec, policy: Policy, *, hashing: HashingConfig | None = None,
                 residency_ttl_s: float | None = None, bucket_s: float | None = None,
                 on_progress: Callable[[int, int], None] | None = None, residency: Residency = "approximate") -> None:
        self.trace = trace
        self.spec = spec
        self.policy = policy
        self.now = 0.0
        self.nodes = build_cluster(spec)
        model = spec.emulator_config().served_model
        self.residency = residency
        if hashing is None:  # precise residency needs keys over the engines' own token blocks
            hashing = token_hashing(self.nodes[0].engine.config.block_size) if residency == "precise" else HashingConfig()
        self._by_id = {n.id: n for n in self.nodes}
        self._candidates = [n.candidate for n in self.nodes]
        ttl = residency_ttl_s if residency_ttl_s is not None else StateConfig().residency_ttl_s
        caps = {n.id: max(1, n.candidate.cache_tokens // hashing.block_tokens) for n in self.nodes}
        self.store: StateStore = MemoryStore(caps, ttl, clock=self._clock)
        self.feeds: EngineFeeds | None = None
        if residency == "precise":
            self.feeds = EngineFeeds({n.id: n.engine for n in self.nodes}, model, hashing)
            self.store = self.feeds.store(self.store, caps, self._clock)
        self._prompts = PromptBuilder(trace.block_tokens, hashing, model)
        self._profile = spec.perf()
        self._link_gbps = spec.link()
        span = trace.requests[-1].arrival_s if trace.requests else 0.0
        self.record = Recorder(len(trace.requests), [n.id for n in self.nodes], bucket_s or max(1.0, span / 100))
        self._flights: dict[str, Flight] = {}
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._on_progress = on_progress

    def _clock(self) -> float:
        return self.now

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> Recorder:
        """Replay every arrival to completion; returns what was observed."""
        arrivals = self.trace.requests
        total, i, heap = len(arrivals), 0, self._heap
        tick = max(1, total // 100)
        while i < total or heap:
            if i < total and (not heap or arrivals[i].arrival_s <= heap[0][0]):
                self._advance(arrivals[i].arrival_s)
                self._arrive(i)
                i += 1
                if self._on_progress is not None and (i % tick == 0 or i == total):
                    self._on_progress(i, total)
                continue
            t, _, kind, payload = heapq.heappop(heap)
            self._advance(t)
            if kind == _STEP_END:
                self._step_end(*payload)
            elif kind == _TRANSFER_END:
                self._transfer_end(payload)
            else:
                payload.kick_pending = False
                self._step(payload)
        if self._flights:
            raise AssertionError(f"{len(self._flights)} requests still in flight after the last event")
        self.record.check_conservation()
        return self.record

    def _advance(self, t: float) -> None:
        if t < self.now:
            raise AssertionError(f"virtual time went backwards: {t} after {self.now}")
        self.now = t

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    # -- engines -------------------------------------------------------------------------
    def _kick(self, node: Node) -> None:
        """Let an idle engine look at new work once everything due now has happened."""
        if not node.busy and not node.kick_pending:
            node.kick_pending = True
            self._push(self.now, _KICK, node)

    def _step(self, node: Node) -> None:
        if node.busy or not node.engine.has_work():
            return
        out = node.engine.step(self.now)
        if self.feeds is not None:
            self.feeds.after_step(node.engine)
        if out.idle:  # the queue head waits for KV room; a release will kick the engine
            return
        node.busy = True
        self.record.step(node.index, self.now, out.duration, out.shape)
        self._push(self.now + out.duration, _STEP_END, (node, out))

    def _step_end(self, node: Node, out: StepOutput) -> None:
        node.busy = False
        if out.shape.prefill_tokens:  # first tokens come only from prefill chunks, listed first
            for ev in out.events:
                if ev.kind is _TOKEN:
                    break
                if ev.kind is _FIRST:
                    self._first_token(node, ev.request_id)
        for request in out.finished:
            self._finished(node, request)
        self._step(node)

    # -- a request's life ----------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        tr = self.trace.requests[i]
        tokens = self._prompts.tokens(tr)
        req = RouteRequest(f"r{i}", self._prompts.keys(tr, tokens), tr.input_tokens, tr.output_tokens,
                           self._prompts.router_block_tokens)
        routed = run_sync(decide(self.store, self.policy, req, self._candidates))
        d = routed.decision
        answer = self._by_id[d.instance]
        prefill = self._by_id[d.prefill] if d.prefill is not None else None
        believed = routed.snapshot.matched.get(d.prefill or d.instance, 0) * req.block_tokens
        self.record.routed(i, self.now, tr.input_tokens, tr.output_tokens, d, min(tr.input_tokens, believed))
        if not answer.engine.can_ever_fit(tr.input_tokens, tr.output_tokens) or (
            prefill is not None and not prefill.engine.can_ever_fit(tr.input_tokens, 1)
        ):
            # The engine would answer 400; the router abandons the booking, as live.
            run_sync(self.store.abandon(routed.booking, routed.snapshot.matched))
            self.record.rejected.append(i)
            return
        if prefill is None:
            er = EngineRequest(req.id, tokens, tr.output_tokens)
            target = answer
        else:
            er = EngineRequest(req.id, tokens, 1, hold_on_finish=True)
            target = prefill
        self._flights[req.id] = Flight(i, routed, answer, prefill, er, tr.output_tokens)
        target.engine.add_request(er, self.now)
        self._kick(target)

    def _first_token(self, node: Node, rid: str) -> None:
        flight = self._flights[rid]
        if node is flight.prefill:
            return  # the prefill leg's token never reaches the client; its finish hands off
        if flight.prefill is None:
            self.record.prefilled(flight.index, flight.request.num_cached)
        self.record.first_token[flight.index] = self.now
        run_sync(self.store.prefill_done(flight.routed.booking))

    def _finished(self, node: Node, request: EngineRequest) -> None:
        flight = self._flights[request.request_id]
        if node is flight.prefill:
            self._start_transfer(flight, request)
            return
        del self._flights[request.request_id]
        self.record.finish[flight.index] = self.now
        self.record.finishes[flight.index] += 1
        run_sync(self.store.release(flight.routed.booking))

    def _start_transfer(self, flight: Flight, prefilled: EngineRequest) -> None:
        self.record.prefilled(flight.index, prefilled.num_cached)
        decode = EngineRequest(prefilled.request_id, prefilled.prompt, flight.max_tokens)
        decode.hashes = prefilled.hashes  # same block size and salt on every engine: same hashes
        ready = prefilled.prompt_len - 1
        moved = max(0, ready - flight.answer.engine.local_hit_tokens(decode))
        self.record.moved[flight.index] = moved
        decode.kv_ready_tokens = ready
        flight.request = decode
        seconds = kv_transfer_time(self._profile, moved, self._link_gbps, self.spec.transfer_latency_s)
        self._push(self.now + seconds, _TRANSFER_END, flight)

    def _transfer_end(self, flight: Flight) -> None:
        assert flight.prefill is not None
        flight.prefill.engine.release_held(flight.request.request_id)
        self._kick(flight.prefill)
        flight.answer.engine.add_request(flight.request, self.now)
        self._kick(flight.answer)
