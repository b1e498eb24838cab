"""What the router currently knows about each engine, in memory, read without I/O.

The poller writes it; the request path (admission: 404/400), the policy (external load)
and /metrics read it. Bounded: one entry per instance the pool holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from router.engines.facts import EngineFacts
from router.engines.prefill_rate import PrefillSample
from router.engines.readings import EngineReading
from router.state.base import Load

_IDLE = Load()


@dataclass
class EngineEntry:
    facts: EngineFacts = field(default_factory=EngineFacts)
    reading: EngineReading | None = None
    read_at: float | None = None  # clock() of the last good scrape
    external: Load = _IDLE
    scrape_errors: int = 0
    facts_errors: int = 0
    # Prefix-cache counters summed over positive deltas between scrapes since the router
    # first read the engine: an engine restart resets its counters, which must not read as
    # negative traffic, and what the engine did before the router watched does not count.
    hit_tokens_seen: float = 0.0
    queried_tokens_seen: float = 0.0
    prefill: PrefillSample | None = None  # the engine's own last measured prefill window
    decode_step_s: float | None = None  # the believed decode step, from its inter-token latency (decode_step.py)

    @property
    def hit_ratio(self) -> float | None:
        """The engine's own prefix-cache hit ratio over the tokens it looked up while watched."""
        return self.hit_tokens_seen / self.queried_tokens_seen if self.queried_tokens_seen > 0 else None

    def count_hits(self, old: EngineReading | None, new: EngineReading) -> None:
        if old is None or new.hit_tokens is None or old.hit_tokens is None:
            return
        queried_new = new.queried_tokens if new.queried_tokens is not None else new.prompt_tokens
        queried_old = old.queried_tokens if old.queried_tokens is not None else old.prompt_tokens
        if queried_new is None or queried_old is None:
            return
        hits, queried = new.hit_tokens - old.hit_tokens, queried_new - queried_old
        if hits < 0 or queried < 0 or hits > queried:  # a restart (or an inconsistent pair): skip this interval
            return
        self.hit_tokens_seen += hits
        self.queried_tokens_seen += queried


class EngineBook:
    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._entries: dict[str, EngineEntry] = {}
        self._external: dict[str, tuple[Load, float]] = {}  # only non-idle, for the hot path
        self.generation = 0  # bumped whenever any instance's facts change (readers memoise on it)

    def entry(self, instance: str) -> EngineEntry:
        found = self._entries.get(instance)
        if found is None:
            found = self._entries[instance] = EngineEntry()
        return found

    def facts(self, instance: str) -> EngineFacts | None:
        found = self._entries.get(instance)
        return found.facts if found is not None else None

    def set_facts(self, instance: str, facts: EngineFacts) -> None:
        entry = self.entry(instance)
        if entry.facts != facts:
            entry.facts = facts
            self.generation += 1

    def record_reading(self, instance: str, reading: EngineReading, external: Load) -> None:
        entry = self.entry(instance)
        now = self._clock()
        entry.count_hits(entry.reading, reading)
        entry.reading, entry.read_at, entry.external = reading, now, external
        if external == _IDLE:
            self._external.pop(instance, None)
        else:
            self._external[instance] = (external, now)

    def record_prefill(self, instance: str, sample: PrefillSample) -> None:
        self.entry(instance).prefill = sample

    def scrape_failed(self, instance: str) -> None:
        """An engine whose /metrics fails has no external load (rather than a stale one)."""
        entry = self.entry(instance)
        entry.scrape_errors += 1
        entry.external = _IDLE
        self._external.pop(instance, None)

    def external_loads(self) -> dict[str, Load]:
        """Fresh external load per instance that has any (usually none: one dict check)."""
        if not self._external:
            return {}
        cutoff = self._clock() - self._stale_after_s
        return {i: load for i, (load, at) in self._external.items() if at >= cutoff}

    def retain(self, instances: Iterable[str]) -> None:
        """Forget instances that left the pool (memory stays bounded by the pool)."""
        keep = set(instances)
        for instance in [i for i in self._entries if i not in keep]:
            del self._entries[instance]
            self._external.pop(instance, None)
            self.generation += 1

    def items(self) -> list[tuple[str, EngineEntry]]:
        return list(self._entries.items())

    def describe(self, instance: str) -> dict[str, Any]:
        """A JSON-able view for /debug."""
        entry = self._entries.get(instance) or EngineEntry()
        facts = entry.facts
        return {
            "models": dict(facts.models) if facts.models is not None else None,
            "block_size": facts.block_size,
            "capacity_tokens": facts.capacity_tokens,
            "kv_dtype": facts.kv_dtype,
            "reading": asdict(entry.reading) if entry.reading is not None else None,
            "external_load": asdict(entry.external),
            "prefix_cache_hit_ratio": entry.hit_ratio,
            "prefill": ({**asdict(entry.prefill), "tokens_per_s": entry.prefill.tokens_per_s}
                        if entry.prefill is not None else None),
            "decode_step_s": entry.decode_step_s,
            "scrape_errors": entry.scrape_errors,
            "facts_errors": entry.facts_errors,
        }
