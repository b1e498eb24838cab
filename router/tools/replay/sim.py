"""Discrete-event replay of a trace through the router's own policy and state store.

Each arrival is routed exactly as live: ``routing.decide`` asks the policy built by
``build_policy`` and books the choice in a ``MemoryStore`` whose clock is the virtual
clock; ``prefill_leg_done`` runs when a remote prefill finishes, ``prefill_done`` at the
client's first token and ``release`` at the end, so
booked load rises and falls as it does in the router. The engines are the emulator's own
``Engine`` objects stepping in virtual time, each independently: an engine with work
runs one step at a time and its next step starts when the previous one ends.

A disaggregated request mirrors the HTTP emulator's handoff: the prefill engine runs it
with ``max_tokens=1`` and keeps its KV pinned; the KV the decode engine lacks (all prompt
tokens but the last, less its local prefix hit) crosses the sender's NIC and the
receiver's (and both zone uplinks across zones), shared with every other transfer on them
(router.tools.emulator.links); then the decode engine gets the request with
``kv_ready_tokens = prompt - 1`` and the prefill engine unpins. vLLM sends everything once
the prefill finished; SGLang streams each chunk as soon as a prefill step computed it, so
the transfer overlaps the prefill. While a NIC moves KV, its engine's steps slow by
``transfer_interference`` (isolation). (The source blocks stay pinned until the bytes
have moved, as a real NIXL read needs.)

With a shared KV store (``ClusterSpec.store_tokens``), the engine that computes a prompt
writes its blocks there at the first token; an arriving request looks up what the store
holds, and once admitted loads what its engine lacks over the store's bandwidth and the
engine's NIC (shared with every other load and transfer) while the engine computes the rest;
its last prompt token waits for the load (router.tools.emulator.kvstore). The router, when
told (``store_aware``), keeps the store tier and prices loads (router.scheduling.store_cost).

Events are a heap of (time, seq, kind, payload) merged with the sorted arrivals; at equal
times arrivals come first, so requests arriving together can share an engine's next step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from router.config.model import HashingConfig, StateConfig, TTFTWeights
from router.tools.emulator.kvstore import KVStore
from router.tools.emulator.links import Fabric
from router.tools.emulator.request import EngineRequest, EventKind, StepOutput
from router.scheduling.framework import Policy, RouteRequest
from router.tools.replay.calibrate import ReplayCalibration, ReplayDecodeSteps
from router.tools.replay.cluster import ClusterSpec, Node, build_cluster
from router.tools.replay.precise import EngineFeeds, Residency, token_hashing
from router.tools.replay.prompts import PromptBuilder
from router.tools.replay.record import Recorder
from router.tools.replay.trace import Trace
from router.scheduling.calibration import queued_share
from router.scheduling.decide import Routed, decide
from router.state.base import StateStore
from router.state.memory import MemoryStore
from router.state.store_tier import build_store_tier

T = TypeVar("T")
_STORE_LINK = ("store",)
_STEP_END, _TRANSFER_END, _KICK, _LINK, _LOAD_END = 0, 1, 2, 3, 4
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


class VirtualClock:
    """The replay's time, readable by a policy built before its Simulation (policy_for)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True, eq=False)
class Flight:
    """A request between its arrival and its last token."""

    index: int
    routed: Routed
    answer: Node  # the engine that streams to the client
    prefill: Node | None  # remote prefill engine, when disaggregated
    request: EngineRequest  # on the engine that currently has it
    max_tokens: int
    sent: int = -1  # prompt tokens handed to the link so far; -1 = transfer not started
    source: EngineRequest | None = None  # the prefill engine's request, while it prefills
    prefilled_at: float = 0.0


class Simulation:
    def __init__(self, trace: Trace, spec: ClusterSpec, policy: Policy, *, hashing: HashingConfig | None = None,
                 residency_ttl_s: float | None = None, bucket_s: float | None = None,
                 on_progress: Callable[[int, int], None] | None = None, residency: Residency = "approximate",
                 clock: VirtualClock | None = None) -> None:
        self.trace = trace
        self.clock = clock if clock is not None else VirtualClock()  # advanced with self.now
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
        self.calibration: ReplayCalibration | None = None
        if not spec.disaggregated:  # calibrate.py: as the live router's calibration hook
            default_rate = spec.ttft_weights().get("prefill_tokens_per_s", TTFTWeights().prefill_tokens_per_s)
            self.calibration = ReplayCalibration(self._candidates, model, default_rate, self._clock)
        self.decode_steps: ReplayDecodeSteps | None = None  # as the live router's engine poller measures them
        if spec.decode_step_measured:
            self.decode_steps = ReplayDecodeSteps(self._candidates, [n.engine for n in self.nodes], self._clock)
        ttl = residency_ttl_s if residency_ttl_s is not None else StateConfig().residency_ttl_s
        caps = {n.id: max(1, n.candidate.cache_tokens // hashing.block_tokens) for n in self.nodes}
        self.store: StateStore = MemoryStore(caps, ttl, clock=self._clock)
        self.feeds: EngineFeeds | None = None
        if residency == "precise":
            self.feeds = EngineFeeds({n.id: n.engine for n in self.nodes}, model, hashing)
            self.store = self.feeds.store(self.store, caps, self._clock)
        self._prompts = PromptBuilder(trace.block_tokens, hashing, model)
        self._kv_bytes = spec.kv_bytes_per_token()
        self._profile = spec.perf()
        self._streams = spec.flavor == "sglang"
        self._slowdown = 1.0 + spec.transfer_interference
        nic, uplink = spec.link() * 1e9 / 8, spec.uplink() * 1e9 / 8
        capacity: dict[Any, float] = {("nic", n.id): nic for n in self.nodes}
        capacity.update({("uplink", n.candidate.zone): uplink for n in self.nodes})
        self.kvstore: KVStore | None = None
        if spec.store_tokens is not None:
            self.kvstore = KVStore(spec.store_tokens, self.nodes[0].engine.config.block_size)
            capacity[_STORE_LINK] = spec.store_gbps * 1e9 / 8
        self.tier = build_store_tier(spec.kv_store_config(), self._kv_bytes, hashing.block_tokens, self._clock)
        self._loading: dict[str, tuple[Node, EngineRequest]] = {}
        self.fabric = Fabric(capacity)
        self._link_version = 0
        self._streaming: dict[int, list[Flight]] = {}  # prefill node -> its PD flights
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
            elif kind == _LINK:
                if payload == self._link_version:
                    self._links_due()
            elif kind == _LOAD_END:
                self._load_end(payload)
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
        self.clock.now = t
        self.fabric.advance(t)

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
        node.engine.transfer_slowdown = self._slowdown if self.fabric.busy(("nic", node.id)) else 1.0
        out = node.engine.step(self.now)
        if self.feeds is not None:
            self.feeds.after_step(node.engine)
        for request in out.loads:
            self._start_load(node, request)
        if out.idle:  # the queue head waits for KV room; a release will kick the engine
            return
        node.busy = True
        self.record.step(node.index, self.now, out.duration, out.shape)
        self._push(self.now + out.duration, _STEP_END, (node, out))

    def _step_end(self, node: Node, out: StepOutput) -> None:
        node.busy = False
        if self._streams and out.shape.prefill_tokens:
            for flight in self._streaming.get(node.index, ()):
                assert flight.source is not None
                self._stream(flight, flight.source, seal=False)
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
        if self.decode_steps is not None:
            self.decode_steps.poll()
        tr = self.trace.requests[i]
        tokens = self._prompts.tokens(tr)
        req = RouteRequest(f"r{i}", self._prompts.keys(tr, tokens), tr.input_tokens, tr.output_tokens,
                           self._prompts.router_block_tokens)
        routed = run_sync(decide(self.store, self.policy, req, self._candidates, tier=self.tier))
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
        flight = Flight(i, routed, answer, prefill, er, tr.output_tokens, source=er if prefill is not None else None)
        self._flights[req.id] = flight
        if prefill is not None:
            self._streaming.setdefault(prefill.index, []).append(flight)
        if self.kvstore is not None:
            target.engine.prepare(er)
            assert er.hashes is not None
            bs = self.kvstore.block_size
            er.store_tokens = self.kvstore.lookup(er.hashes[: (er.prompt_len - 1) // bs]) * bs
        target.engine.add_request(er, self.now)
        self._kick(target)

    def _first_token(self, node: Node, rid: str) -> None:
        flight = self._flights[rid]
        if self.kvstore is not None:  # the engine that computed the prompt writes it to the store
            computed = flight.source if node is flight.prefill else flight.request
            if computed is not None and computed.hashes:
                self.kvstore.put(computed.hashes)
        if node is flight.prefill:
            return  # the prefill leg's token never reaches the client; its finish hands off
        if flight.prefill is not None and flight.request.schedule_time is not None:
            self.record.milestone(flight.index, 3, flight.request.schedule_time)
        if flight.prefill is None:
            self.record.prefilled(flight.index, flight.request.num_cached, flight.request.num_loaded)
            if self.calibration is not None:
                arrived = self.trace.requests[flight.index].arrival_s
                routed = flight.routed
                self.calibration.observe(node.id, routed.decision.estimate_s, self.now - arrived,
                                         queued_share(routed.snapshot, routed.booking, node.id), routed.prefill_rate)
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
        """The prefill finished: whatever of the KV has not left yet goes now."""
        assert flight.prefill is not None
        self.record.prefilled(flight.index, prefilled.num_cached, prefilled.num_loaded)
        flight.prefilled_at = self.now
        if prefilled.schedule_time is not None:
            self.record.milestone(flight.index, 0, prefilled.schedule_time)
        self.record.milestone(flight.index, 1, self.now)
        run_sync(self.store.prefill_leg_done(flight.routed.booking))  # as live, when the prefill leg answers
        self._streaming[flight.prefill.index].remove(flight)
        self._stream(flight, prefilled, seal=True)
        flight.source = None

    def _stream(self, flight: Flight, prefilled: EngineRequest, seal: bool) -> None:
        """Hand the link the prompt tokens computed so far that D lacks (all of them at
        ``seal``); the first call measures D's local hit and opens the transfer."""
        assert flight.prefill is not None
        ready = prefilled.prompt_len - 1
        rid = prefilled.request_id
        if flight.sent < 0:
            if not seal and prefilled.num_computed <= 0:
                return
            decode = EngineRequest(rid, prefilled.prompt, flight.max_tokens)
            decode.hashes = prefilled.hashes  # same block size and salt on every engine: same hashes
            decode.kv_ready_tokens = ready
            flight.sent = min(ready, flight.answer.engine.local_hit_tokens(decode))
            self.record.moved[flight.index] = ready - flight.sent
            src, dst = flight.prefill.candidate, flight.answer.candidate
            links: list[Any] = [("nic", src.id), ("nic", dst.id)]
            if src.zone != dst.zone:
                links += [("uplink", src.zone), ("uplink", dst.zone)]
            self.fabric.start(rid, links)
            flight.request = decode  # the prefill engine keeps its own request object
        upto = ready if seal else min(ready, prefilled.num_computed)
        grow = max(0, upto - flight.sent)
        flight.sent = max(flight.sent, upto)
        if grow or seal:
            self.fabric.grow(rid, grow * self._kv_bytes, seal=seal)
            self._reschedule_links()

    def _reschedule_links(self) -> None:
        self._link_version += 1
        nxt = self.fabric.next_done()
        if nxt is not None:
            self._push(max(self.now, nxt[0]), _LINK, self._link_version)

    def _links_due(self) -> None:
        """Finish every transfer whose last byte moved (the setup latency still to pay)."""
        for t in [t for t in self.fabric.transfers.values() if t.done]:
            self.fabric.finish(t.id)
            if isinstance(t.id, tuple):  # a store load
                self._push(self.now + self.spec.transfer_latency_s, _LOAD_END, t.id[1])
                continue
            self._push(self.now + self.spec.transfer_latency_s, _TRANSFER_END, self._flights[str(t.id)])
        self._reschedule_links()

    def _transfer_end(self, flight: Flight) -> None:
        assert flight.prefill is not None
        self.record.handoff[flight.index] = self.now - flight.prefilled_at
        self.record.milestone(flight.index, 2, self.now)
        flight.prefill.engine.release_held(flight.request.request_id)
        self._kick(flight.prefill)
        flight.answer.engine.add_request(flight.request, self.now)
        self._kick(flight.answer)

    # -- the shared KV store -------------------------------------------------------------
    def _start_load(self, node: Node, request: EngineRequest) -> None:
        """The engine admitted ``request`` with KV to load from the store: move it over the
        store's bandwidth and the engine's NIC."""
        self._loading[request.request_id] = (node, request)
        self.fabric.start(("load", request.request_id), [_STORE_LINK, ("nic", node.id)],
                          request.num_loaded * self._kv_bytes, sealed=True)
        self._reschedule_links()

    def _load_end(self, rid: str) -> None:
        node, request = self._loading.pop(rid)
        if self.kvstore is not None:
            self.kvstore.loaded(request.num_loaded // self.kvstore.block_size, request.num_loaded * self._kv_bytes)
        node.engine.load_done(rid)
        self._kick(node)
