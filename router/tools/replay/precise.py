"""Precise residency in a replay: the router's event tables fed by the simulated engines.

Every emulated engine's prefix cache reports what it stores and evicts (``KVEventLog``);
after each engine step its events go through the very wire format a live engine sends
(encoded as vLLM 0.32 maps, decoded by the router's decoder) into the router's table for
that instance, so the policy sees the engines' actual cache contents, evictions
included. The router hashes in token mode with the engines' block size, as it must live
for request keys to meet event keys. Events arrive when the step that produced them is
scheduled: a live router sees them a network hop later, which the speculative window
(``kv_events.speculative_s``, virtual seconds here) covers in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from router.config.model import HashingConfig
from router.config.precise import KVEventsConfig, TokensConfig
from router.kvevents.apply import TableWriter
from router.kvevents.wire import decode_batch_raw
from router.state.base import StateStore
from router.state.precise import EventResidency
from router.state.precise_store import PreciseStore
from router.tools.emulator.engine import Engine
from router.tools.emulator.kv_events import KVEventLog, encode_batch

Residency = Literal["approximate", "precise"]
RESIDENCIES: tuple[str, ...] = ("approximate", "precise")


def token_hashing(block_size: int) -> HashingConfig:
    """Token-mode hashing over ``block_size``-token blocks (the engines' KV block size)."""
    return HashingConfig(mode="tokens", tokens=TokensConfig(block_size=block_size))


class EngineFeeds:
    """Per engine: its event log and the router-side writer of its table."""

    def __init__(self, engines: Mapping[str, Engine], model: str, hashing: HashingConfig,
                 config: KVEventsConfig | None = None) -> None:
        config = config or KVEventsConfig()
        self.config = config
        self.residency = EventResidency(config.max_blocks_per_instance, config.cpu_weight)
        self._feeds: dict[int, tuple[KVEventLog, TableWriter]] = {}
        for name, engine in engines.items():
            log = KVEventLog(engine.config.block_size)
            engine.kv.events = log
            table = self.residency.table(name)
            table.fresh = True  # the engine starts empty and every event reaches the router
            self._feeds[id(engine)] = (log, TableWriter(table, model, hashing.block_tokens, hashing.seed))
        self.events = 0

    def store(self, inner: StateStore, caps: Mapping[str, int], clock: Callable[[], float]) -> PreciseStore:
        return PreciseStore(inner, self.residency, caps, speculative_s=self.config.speculative_s,
                            default_cap=max(caps.values(), default=8192), clock=clock)

    def after_step(self, engine: Engine) -> None:
        """Deliver what the engine's cache did in its last step."""
        log, writer = self._feeds[id(engine)]
        raw = log.take()
        if raw:
            _ts, events, _rank = decode_batch_raw(encode_batch(raw, ts=0.0))
            writer.apply_raw(events)
            self.events += len(events)
