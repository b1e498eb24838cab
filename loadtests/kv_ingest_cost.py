"""CPU per applied KV event on each side of the sidecar channel, measured directly: no
requests, real sockets, a real sidecar process, the flood of ``kv_flood.py``.

This process plays the router: a ``SidecarIngest`` on its own event loop, whose CPU time is
all reading, framing and applying the sidecar's deltas; the sidecar's CPU comes from /proc.
Unlike the routing benchmark's per-request figures, which on 2 shared cores move by as
much between two identical cells as the flood adds, CPU seconds per event hardly depend on
who else runs, so two versions of the code can be compared run against run:

    python loadtests/kv_ingest_cost.py                      # this tree
    python loadtests/kv_ingest_cost.py --source /other/tree # another checkout, same flood
    python loadtests/kv_ingest_cost.py --no-sockets         # decode and apply in one process
    python loadtests/kv_ingest_cost.py --python-sets        # the loop on Python sets, not the C extension's
    python loadtests/kv_ingest_cost.py --python-tables      # the sidecar on Python tables, not the C extension's
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


async def measure(rate: int, seconds: float, native: bool = True, native_tables: bool = True) -> dict[str, float]:
    import httpx

    from loadtests.kv_events_bench import _cpu_s, _flood
    from router.config.model import load_config
    from router.core.instances import InstancePool
    from router.kvevents import precise_store
    from router.kvevents.sidecar import SidecarIngest
    from router.state.memory import MemoryStore
    from router.tools.process import free_port

    port = free_port()
    config = load_config(overrides={
        "instances": [{"url": "http://127.0.0.1:9", "name": "z0", "model": "zero-model"}],
        "hashing": {"mode": "tokens"},
        "kv_events": {"enabled": True, "discover": False, "sidecar": True, "sidecar_nice": 0,
                      **({} if native else {"native_key_sets": False}),  # a tree before the field has no such key
                      **({} if native_tables else {"native_tables": False}),
                      "sources": {"z0": {"endpoint": f"tcp://*:{port}", "topic": "kv"}}}})  # the engine binds
    _store, ingest = precise_store(config, InstancePool(config), MemoryStore({"z0": 8}))
    assert isinstance(ingest, SidecarIngest)

    def applied() -> int:
        return sum(s.writer.counters.events for s in ingest.sources)

    async with httpx.AsyncClient() as client:
        await ingest.start(client)
        try:
            await ingest.wait_subscribed()
            side = ingest.pid  # not children(): a test process has others (redis-server)
            assert side is not None
            flood = await asyncio.to_thread(_flood, port, rate, seconds)
            await asyncio.sleep(0.5)  # the SUB connects
            assert flood.stdin is not None
            flood.stdin.write("go\n")
            flood.stdin.flush()
            loop0, side0, t0 = time.process_time(), _cpu_s(side), time.perf_counter()
            await asyncio.to_thread(flood.wait)
            last, still = applied(), 0
            while still < 3:  # until the backlog is applied (STATS come every 0.25 s)
                await asyncio.sleep(0.3)
                now = applied()
                still = still + 1 if now == last else 0
                last = now
            wall = time.perf_counter() - t0 - 0.9
            loop_s, side_s = time.process_time() - loop0, _cpu_s(side) - side0
        finally:
            await ingest.close()
    events = float(last)
    return {"events": events, "events_per_s": events / wall, "sidecar_us": side_s / events * 1e6,
            "loop_us": loop_s / events * 1e6, "sidecar_core": side_s / wall}


def no_sockets(repeats: int = 5) -> dict[str, float]:
    """CPU µs per event of the flood's messages in this process, best of ``repeats``: the
    sidecar's path (decode, keys, its tables: C where built, a delta every 31 messages: 10 ms at
    100k/s) and the in-process one (``BlockTable``, no deltas)."""
    from loadtests.kv_flood import apply_cost, flood_payloads
    from router.state import precise_mirror
    from router.state.precise import BlockTable

    payloads = flood_payloads()
    out: dict[str, float] = {}
    try:  # the sidecar's own tables: in C where built (a tree before them: TrackedTable)
        from router.state.precise_native import tracked_table
        sidecar_table: Any = tracked_table()
    except ImportError:
        sidecar_table = precise_mirror.TrackedTable
    for name, factory in (("sidecar_path_us", sidecar_table), ("in_process_us", BlockTable)):
        out[name] = apply_cost(factory(1_000_000), payloads, payloads, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=100_000, help="events/s offered")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--source", type=Path, default=ROOT, help="the tree whose router (and sidecar) to measure")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-sockets", action="store_true",
                   help="decode and apply in one process instead (sidecar path and in-process path)")
    p.add_argument("--python-sets", action="store_true",
                   help="the loop's mirror tables on Python sets (kv_events.native_key_sets: false)")
    p.add_argument("--python-tables", action="store_true",
                   help="the sidecar's engine-block tables in Python (kv_events.native_tables: false)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:  # one run, in an interpreter whose path starts with the measured tree
        print(json.dumps(no_sockets() if args.no_sockets
                         else asyncio.run(measure(args.rate, args.seconds, not args.python_sets,
                                                  not args.python_tables))))
        return 0
    source = str(args.source.resolve())
    env = {**os.environ, "PYTHONPATH": source}  # the sidecar the child starts inherits it
    argv_child = [sys.executable, __file__, "--child", "--rate", str(args.rate), "--seconds", str(args.seconds),
                  *(["--no-sockets"] if args.no_sockets else []), *(["--python-sets"] if args.python_sets else []),
                  *(["--python-tables"] if args.python_tables else [])]
    runs = [json.loads(subprocess.run(argv_child, env=env, cwd=source, check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1]) for _ in range(args.runs)]
    if args.no_sockets:
        print(f"{source}: without sockets, best of 5 per run, load average {os.getloadavg()[0]:.1f}: sidecar path "
              f"{', '.join(format(r['sidecar_path_us'], '.2f') for r in runs)} µs of CPU per event; in-process "
              f"{', '.join(format(r['in_process_us'], '.2f') for r in runs)}")
        return 0
    sets = (" (Python sets)" if args.python_sets else "") + (" (Python tables)" if args.python_tables else "")
    print(f"{source}{sets}: {args.rate:,} events/s offered, {args.runs} runs of {args.seconds:g} s, load average "
          f"{os.getloadavg()[0]:.1f}: applied {', '.join(format(r['events_per_s'], ',.0f') for r in runs)} events/s; "
          f"sidecar {', '.join(format(r['sidecar_us'], '.2f') for r in runs)} µs of CPU per event "
          f"(at {', '.join(format(r['sidecar_core'], '.0%') for r in runs)} of a core); router loop "
          f"{', '.join(format(r['loop_us'], '.3f') for r in runs)} µs of CPU per event")
    return 0


if __name__ == "__main__":
    if "--child" not in sys.argv:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
