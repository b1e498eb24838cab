"""Precise residency from the engines' KV events (vLLM's ZMQ publisher; SGLang's is the same).

``precise_store`` wraps the configured state store so that residency comes from what
the engines report, and returns the ingestion whose lifecycle the app runs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from router.config.model import RouterConfig
from router.core.instances import InstancePool
from router.kvevents.ingest import KVEventIngest
from router.kvevents.metrics import KVEventsCollector
from router.state.base import StateStore
from router.kvevents.sidecar import SidecarIngest, mirror_factory
from router.state.precise import EventResidency
from router.state.precise_native import engine_table
from router.state.precise_store import PreciseStore

__all__ = ["KVEventIngest", "precise_store", "uses_bind"]


def uses_bind(config: RouterConfig) -> bool:
    """Whether the configured sources need the router to bind a SUB (engines connect to it).

    Only one process can bind an address, so under ``serve --workers N`` (every worker
    ingests events itself) a bound socket would feed one worker and leave the others
    routing on approximate residency: ``serve`` refuses such a config, and a worker never
    binds for a source that discovery finds connecting (that instance stays approximate
    in every worker, with an error logged, rather than precise in one of them)."""
    kv = config.kv_events
    return kv.enabled and (kv.bind is not None or any(s.endpoint is None for s in kv.sources.values()))


def precise_store(config: RouterConfig, pool: InstancePool, store: StateStore,
                  registry: CollectorRegistry | None = None, *,
                  may_bind: bool = True) -> tuple[StateStore, KVEventIngest | None]:
    """``store`` with event residency over it, and the ingestion feeding it; unchanged
    (and None) when ``kv_events.enabled`` is off. ``may_bind`` is False in a
    ``serve --workers N`` process (see ``uses_bind``)."""
    kv = config.kv_events
    if not kv.enabled:
        return store, None
    residency = EventResidency(kv.max_blocks_per_instance, kv.cpu_weight,
                               factory=mirror_factory(kv) if kv.sidecar else engine_table(kv.native_tables))
    caps = {i.id: config.residency_cap(i.config) for i in pool}
    wrapped = PreciseStore(store, residency, caps, speculative_s=kv.speculative_s,
                           default_cap=max(caps.values(), default=8192))
    ingest = (SidecarIngest if kv.sidecar else KVEventIngest)(config, pool, residency, may_bind=may_bind)
    if registry is not None:
        registry.register(KVEventsCollector(ingest, wrapped))
    return wrapped, ingest
