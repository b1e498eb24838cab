"""What ingestion knows about each KV-event source, for ``GET /debug/kv_events``.

An operator (or a test) asks: is this engine's residency from its events, how far has
the router read its stream, and what did its events do. ``last_sequence`` compared with
the publisher's own sequence says whether the router has caught up; with the sidecar,
``key_sets`` says whether the loop's mirror tables use the C extension ("native") or
Python sets ("python"), ``tables`` the same of the engine-block tables (in-process or the
sidecar's), and
``mirror`` whether the loop reads them in shared memory ("shared", each instance's
``shared_bytes`` the size of its segments) or applies deltas.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from router.kvevents.ingest import KVEventIngest
from router.kvevents.sidecar import SidecarIngest
from router.state.shared_mirror import segment_bytes


def describe(ingest: KVEventIngest) -> dict[str, Any]:
    residency = ingest.residency
    return {
        "receive_errors": ingest.receive_errors,
        "key_sets": ingest.key_sets if isinstance(ingest, SidecarIngest) else None,
        "tables": ingest.tables,
        "mirror": ingest.mirror if isinstance(ingest, SidecarIngest) else None,
        "sources": [
            {"instance": s.spec.instance, "dp_rank": s.spec.dp_rank, "endpoint": s.spec.endpoint, "bind": s.spec.bind,
             "topic": s.spec.topic, "replay_endpoint": s.spec.replay_endpoint, "synced": s.synced,
             "fresh": s.table.fresh, "last_sequence": s.last, "blocks": len(s.table),
             "stream": dataclasses.asdict(s.counters), "applied": dataclasses.asdict(s.writer.counters)}
            for s in ingest.sources
        ],
        "instances": {inst: {"fresh": residency.is_fresh(inst),
                             "blocks": sum(len(t) for t in residency.tables(inst).values()),
                             "shared_bytes": segment_bytes(residency.tables(inst).values())}
                      for inst in residency.instances()},
    }
