"""Engine-side request record and the events an engine step emits.

Kept apart from the scheduler so that both drivers (the asyncio HTTP driver
and a virtual-time replay) can build requests and read results without
touching scheduling code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from router.tools.emulator.perf import StepShape


class EventKind(IntEnum):
    FIRST_TOKEN = 0
    """Prefill finished; ``token_id`` is output position 0."""
    TOKEN = 1
    """A decode step produced the token at ``position``."""
    FINISHED = 2
    """No more tokens; ``position`` is the number of output tokens."""


class Event(NamedTuple):
    kind: EventKind
    request_id: str
    position: int
    token_id: int


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2
    HELD = 3
    """Finished, but its KV blocks stay pinned for a PD peer to pull."""


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One sequence: inputs set by the caller, progress set by the engine.

    Times are in the driver's clock (model seconds), whatever that clock is.
    """

    request_id: str
    prompt: list[int]
    max_tokens: int
    sample_key: int = 0
    """Seeds the deterministic output tokens."""
    kv_ready_tokens: int = 0
    """Leading prompt tokens whose KV arrives ready-made (PD decode side)."""
    hold_on_finish: bool = False
    """Keep the KV blocks pinned after finishing (PD prefill side)."""
    store_tokens: int = 0
    """Leading prompt tokens a shared KV store holds (looked up by the caller on arrival);
    at admission the engine loads those it lacks (kvstore.py)."""
    tag: str | None = None
    """Opaque caller label (the HTTP layer puts the client's request id here)."""

    status: RequestStatus = RequestStatus.WAITING
    hashes: list[int] | None = None
    block_ids: list[int] = field(default_factory=list)
    num_committed: int = 0
    reserved_blocks: int = 0
    num_computed: int = 0
    num_cached: int = 0
    """Prompt tokens served from the local prefix cache."""
    num_transferred: int = 0
    """Prompt tokens whose KV came from a PD peer."""
    num_loaded: int = 0
    """Prompt tokens whose KV is loaded from the shared store (decided at admission)."""
    loading: bool = False
    """The store load is still moving: the prompt's last token waits for it (the caller
    clears it with ``Engine.load_done``)."""
    num_output: int = 0
    arrival_time: float = 0.0
    schedule_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.schedule_time is None:
            return None
        return self.schedule_time - self.arrival_time


@dataclass(slots=True)
class StepOutput:
    """Result of one engine step: how long it took and what it produced."""

    duration: float
    events: list[Event]
    finished: list[EngineRequest]
    shape: StepShape
    loads: list[EngineRequest] = field(default_factory=list)
    """Requests admitted this step that must load ``num_loaded`` tokens from the store: the
    caller moves the bytes (from the step's start) and then calls ``Engine.load_done``."""

    @property
    def idle(self) -> bool:
        """True when nothing could be scheduled (no time passes)."""
        return self.shape.prefill_tokens == 0 and self.shape.decode_seqs == 0
