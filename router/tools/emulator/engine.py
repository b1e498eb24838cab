"""The emulated engine: a clock-agnostic scheduler state machine.

Why clock-agnostic: the same engine must run behind a real HTTP server (an
asyncio driver sleeps each step's duration, scaled) and inside an offline
discrete-event replay (virtual time). So the engine never reads a clock or
does I/O: callers pass ``now`` in, and ``step`` returns how long the step
took according to the performance model plus the events it produced.

Scheduling follows vLLM's V1 scheduler in spirit:

* FCFS waiting queue; the head blocks the queue when it cannot be admitted.
* Each step has a token budget (``max_batched_tokens``). Running requests go
  first in admission order: decoding ones take one token each, prefilling
  ones take a chunk of their remaining prompt (chunked prefill). Left-over
  budget admits waiting requests, also as chunks.
* Admission needs a free sequence slot and KV blocks for the whole prompt
  plus a reservation for its output, so admitted requests never need
  preemption. The prefix-cache hit is computed once, at admission.
* At least the last prompt block is always computed, so the first token
  comes from a real forward pass (as in vLLM).
* With a shared KV store (kvstore.py), the leading tokens the store holds
  beyond the local hit are loaded, not computed: admission reports them in
  ``StepOutput.loads``, the rest of the prompt computes meanwhile, and only
  its last token waits until the owner calls ``load_done``. (The loaded
  blocks are published at admission, so another request on the same engine
  may hit them before their bytes have arrived: a simplification.)

Per-token work is a few integer operations per running request, so one
process can emulate hundreds of concurrent streams.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.tools.emulator.kv_events import KVEventLog
from router.tools.emulator.kvcache import KVCache, block_hashes
from router.tools.emulator.perf import PerfProfile, StepShape, attention_pairs, step_time
from router.tools.emulator.request import (
    EngineRequest,
    Event,
    EventKind,
    RequestStatus,
    StepOutput,
)

TokenFn = Callable[[int, int], int]
"""(request sample key, output position) -> token id."""


def _zero_token(_key: int, _position: int) -> int:
    return 0


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler limits; ``build_engine`` derives them from EmulatorConfig."""

    num_blocks: int
    block_size: int = 16
    max_batched_tokens: int = 8192
    max_num_seqs: int = 256
    hash_salt: str = ""
    time_multiplier: float = 1.0
    """Scales every step duration (the ``slowdown`` fault)."""


@dataclass
class EngineCounters:
    """Monotonic totals, in requests or tokens."""

    requests_added: int = 0
    requests_scheduled: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    transferred_tokens: int = 0
    store_loaded_tokens: int = 0
    prefill_computed_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    busy_time: float = 0.0
    # inter-token latency: a decode step's duration once per sequence it advanced (model seconds)
    itl_tokens: int = 0
    itl_seconds: float = 0.0


class Engine:
    """Scheduler + KV cache + performance model; see the module docstring."""

    def __init__(self, config: EngineConfig, profile: PerfProfile,
                 token_fn: TokenFn = _zero_token) -> None:
        self.config = config
        self.profile = profile
        self.kv = KVCache(config.num_blocks, config.block_size)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.held: dict[str, EngineRequest] = {}
        self.counters = EngineCounters()
        self.time_multiplier = config.time_multiplier
        self.transfer_slowdown = 1.0
        """Set by the KV link owner: > 1 while a transfer is in flight on this engine's NIC."""
        self._token = token_fn
        self._requests: dict[str, EngineRequest] = {}
        self._loads: list[EngineRequest] = []

    # -- intake ----------------------------------------------------------------

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        """KV blocks a request pins at its peak (last sampled token not fed)."""
        bs = self.config.block_size
        return -(-(prompt_len + max_tokens - 1) // bs)

    def can_ever_fit(self, prompt_len: int, max_tokens: int) -> bool:
        return self.blocks_needed(prompt_len, max_tokens) <= self.kv.num_blocks

    def prepare(self, request: EngineRequest) -> None:
        """Compute the prompt's block hashes (idempotent; may run early)."""
        if request.hashes is None:
            request.hashes = block_hashes(request.prompt, self.config.block_size,
                                          self.config.hash_salt)

    def local_hit_tokens(self, request: EngineRequest) -> int:
        """Prompt tokens the local cache would serve if scheduled right now."""
        self.prepare(request)
        assert request.hashes is not None
        limit = (request.prompt_len - 1) // self.config.block_size
        return self.kv.match(request.hashes[:limit]) * self.config.block_size

    def add_request(self, request: EngineRequest, now: float) -> None:
        """Queue a request (FCFS). Raises ValueError if it can never run."""
        if request.prompt_len < 1 or request.max_tokens < 1:
            raise ValueError("need a non-empty prompt and max_tokens >= 1")
        if not self.can_ever_fit(request.prompt_len, request.max_tokens):
            raise ValueError(
                f"request needs {self.blocks_needed(request.prompt_len, request.max_tokens)}"
                f" KV blocks but the cache has {self.kv.num_blocks}")
        if request.request_id in self._requests or request.request_id in self.held:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.prepare(request)
        request.arrival_time = now
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self._requests[request.request_id] = request
        self.counters.requests_added += 1

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its KV. False if unknown."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
            self.kv.unreserve(request.reserved_blocks)
            request.reserved_blocks = 0
            self.kv.release(request.block_ids)
        request.status = RequestStatus.FINISHED
        request.finish_reason = "abort"
        self.counters.requests_aborted += 1
        return True

    def release_held(self, request_id: str) -> EngineRequest | None:
        """Unpin a finished PD-prefill request's blocks (after pull or expiry)."""
        request = self.held.pop(request_id, None)
        if request is not None:
            self.kv.release(request.block_ids)
            request.status = RequestStatus.FINISHED
        return request

    def reset_prefix_cache(self) -> int:
        return self.kv.reset_prefix_cache()

    def load_done(self, request_id: str) -> bool:
        """The store load of a request finished: its last prompt token may run. False if unknown."""
        request = self._requests.get(request_id)
        if request is None or not request.loading:
            return False
        request.loading = False
        return True

    # -- state -------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def waiting_tokens(self) -> int:
        return sum(r.prompt_len for r in self.waiting)

    # -- the step ----------------------------------------------------------------

    def step(self, now: float) -> StepOutput:
        """Schedule one batch, advance it, and report duration + events."""
        budget = self.config.max_batched_tokens
        decodes: list[EngineRequest] = []
        prefills: list[tuple[EngineRequest, int]] = []
        decode_ctx = 0
        for r in self.running:
            if r.num_computed >= r.prompt_len:
                if budget > 0:
                    decodes.append(r)
                    decode_ctx += r.prompt_len + r.num_output
                    budget -= 1
            elif budget > 0:
                n = self._chunk(r, budget)
                if n > 0:
                    prefills.append((r, n))
                    budget -= n
                    self._commit_full_blocks(r, r.num_computed + n)
        while (self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            r = self.waiting[0]
            if not self._admit(r, now):
                break
            self.waiting.popleft()
            self.running.append(r)
            n = self._chunk(r, budget)
            if n > 0:
                prefills.append((r, n))
                budget -= n
                self._commit_full_blocks(r, r.num_computed + n)
        loads, self._loads = self._loads, []

        shape = StepShape(
            prefill_tokens=sum(n for _, n in prefills),
            prefill_pairs=sum(attention_pairs(n, r.num_computed) for r, n in prefills),
            prefill_context=sum(r.num_computed for r, _ in prefills),
            decode_seqs=len(decodes),
            decode_context=decode_ctx,
        )
        duration = step_time(self.profile, shape) * self.time_multiplier * self.transfer_slowdown
        end = now + duration
        events: list[Event] = []
        finished: list[EngineRequest] = []
        for r, n in prefills:
            self._advance_prefill(r, n, end, events, finished)
        self._advance_decodes(decodes, end, events, finished)
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        counters = self.counters
        if shape.prefill_tokens or shape.decode_seqs:
            counters.steps += 1
            counters.busy_time += duration
        if shape.decode_seqs:
            counters.itl_tokens += shape.decode_seqs
            counters.itl_seconds += duration * shape.decode_seqs
        counters.prefill_computed_tokens += shape.prefill_tokens
        return StepOutput(duration=duration, events=events, finished=finished, shape=shape, loads=loads)

    @staticmethod
    def _chunk(r: EngineRequest, budget: int) -> int:
        """Prompt tokens of ``r`` to compute this step: while its store load moves, all but
        the last (computing the rest overlaps the load; the first token needs all the KV)."""
        left = r.prompt_len - r.num_computed
        if r.loading:
            left -= 1
        return min(left, budget)

    def _admit(self, r: EngineRequest, now: float) -> bool:
        """Match the prefix cache and claim KV; False if it does not fit yet."""
        kv = self.kv
        bs = self.config.block_size
        hashes = r.hashes
        assert hashes is not None
        hit = kv.match(hashes[: (r.prompt_len - 1) // bs])
        hit_hashes = hashes[:hit]
        prompt_blocks = -(-r.prompt_len // bs)
        future = self.blocks_needed(r.prompt_len, r.max_tokens) - prompt_blocks
        if kv.available - kv.count_evictable(hit_hashes) < prompt_blocks - hit + future:
            return False
        r.block_ids = kv.acquire(hit_hashes) + kv.allocate(prompt_blocks - hit)
        kv.reserve(future)
        r.reserved_blocks = future
        cached = hit * bs
        ready = min(r.kv_ready_tokens, r.prompt_len - 1)
        r.num_cached = cached
        r.num_transferred = max(0, ready - cached)
        present = cached + r.num_transferred
        stored = min(r.store_tokens, r.prompt_len - 1)  # the last token is always computed
        r.num_loaded = max(0, stored - present)
        if r.num_loaded:
            r.loading = True
            self._loads.append(r)
        r.num_computed = present + r.num_loaded
        r.num_committed = hit
        self._commit_full_blocks(r)
        r.status = RequestStatus.RUNNING
        r.schedule_time = now
        c = self.counters
        c.requests_scheduled += 1
        c.prompt_tokens += r.prompt_len
        c.cached_tokens += cached
        c.transferred_tokens += r.num_transferred
        c.store_loaded_tokens += r.num_loaded
        return True

    def _commit_full_blocks(self, r: EngineRequest, tokens: int | None = None) -> None:
        """Publish ``r``'s full blocks up to ``tokens`` (default: those computed) in the prefix cache.

        The step publishes the blocks a prefill chunk will compute when it schedules the chunk,
        as vLLM's ``allocate_slots`` caches them: a request admitted later in the same step hits
        them instead of computing the same prefix again in the same batch (the forward pass
        writes a layer's KV before its attention reads it). SGLang reaches the same end by
        holding such a request back one batch (in-batch prefix caching), a step later."""
        hashes = r.hashes
        assert hashes is not None
        computed = r.num_computed if tokens is None else tokens
        full = min(computed // self.config.block_size, len(hashes))
        if full <= r.num_committed:
            return
        events = self.kv.events
        if events is None:
            for i in range(r.num_committed, full):
                self.kv.commit(r.block_ids[i], hashes[i])
        else:
            self._commit_and_tell(r, hashes, full, events)
        r.num_committed = max(r.num_committed, full)

    def _commit_and_tell(self, r: EngineRequest, hashes: list[int], full: int, events: KVEventLog) -> None:
        """Commit, and report each run of newly published blocks as one BlockStored."""
        bs = self.config.block_size
        run_start = -1
        for i in range(r.num_committed, full + 1):
            published = i < full and self.kv.commit(r.block_ids[i], hashes[i])
            if published and run_start < 0:
                run_start = i
            elif not published and run_start >= 0:
                events.stored(hashes[run_start:i], hashes[run_start - 1] if run_start else None,
                              list(r.prompt[run_start * bs:i * bs]))
                run_start = -1

    def _advance_prefill(self, r: EngineRequest, n: int, end: float,
                         events: list[Event], finished: list[EngineRequest]) -> None:
        r.num_computed += n  # its blocks were published when the step scheduled the chunk
        if r.num_computed < r.prompt_len:
            return
        token = self._token(r.sample_key, 0)
        r.num_output = 1
        r.first_token_time = end
        self.counters.generated_tokens += 1
        events.append(Event(EventKind.FIRST_TOKEN, r.request_id, 0, token))
        if r.max_tokens <= 1:
            self._finish(r, end, events, finished)

    def _advance_decodes(self, decodes: list[EngineRequest], end: float,
                         events: list[Event], finished: list[EngineRequest]) -> None:
        bs = self.config.block_size
        token_fn = self._token
        kv = self.kv
        append = events.append
        kind = EventKind.TOKEN
        for r in decodes:
            fed = r.prompt_len + r.num_output - 1  # index of the token fed now
            if fed % bs == 0 and fed // bs >= len(r.block_ids):
                r.block_ids.append(kv.allocate_reserved())
                r.reserved_blocks -= 1
            position = r.num_output
            append(Event(kind, r.request_id, position, token_fn(r.sample_key, position)))
            r.num_output = position + 1
            if r.num_output >= r.max_tokens:
                self._finish(r, end, events, finished)
        self.counters.generated_tokens += len(decodes)

    def _finish(self, r: EngineRequest, end: float, events: list[Event],
                finished: list[EngineRequest]) -> None:
        r.finish_time = end
        r.finish_reason = "length"
        self.kv.unreserve(r.reserved_blocks)
        r.reserved_blocks = 0
        del self._requests[r.request_id]
        if r.hold_on_finish:
            r.status = RequestStatus.HELD
            self.held[r.request_id] = r
        else:
            r.status = RequestStatus.FINISHED
            self.kv.release(r.block_ids)
        self.counters.requests_finished += 1
        events.append(Event(EventKind.FINISHED, r.request_id, r.num_output, -1))
        finished.append(r)
