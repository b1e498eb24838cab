"""KV-event floods: vLLM-shaped messages from a publisher process, what decoding and
applying them costs without sockets, and the benchmark of routing latency while one
router process ingests them, in-process vs in its sidecar, side by side in one run:

    python loadtests/kv_flood.py --write
"""

from __future__ import annotations

import sys
import time
from typing import Any

PER_MESSAGE, BLOCKS_PER_EVENT, POOL, LAG = 32, 4, 4096, 512


def flood_payloads() -> list[bytes]:
    """``POOL`` distinct messages: half BlockStored of 4 fresh blocks, half BlockRemoved of
    blocks stored ``LAG`` messages before, so cycling through them keeps the table's size
    steady and every store is a new block."""
    import random

    import msgpack

    rng = random.Random(0)

    def hashes(i: int, j: int) -> list[int]:
        return [(i * PER_MESSAGE + j) * BLOCKS_PER_EVENT + k + 1 for k in range(BLOCKS_PER_EVENT)]

    def event(i: int, j: int) -> dict[str, Any]:
        if j % 2 == 0:
            return {"type": "BlockStored", "block_hashes": hashes(i, j), "parent_block_hash": None, "block_size": 16,
                    "token_ids": [rng.randrange(50_000) for _ in range(16 * BLOCKS_PER_EVENT)], "medium": "GPU"}
        return {"type": "BlockRemoved", "block_hashes": hashes((i - LAG) % POOL, j - 1), "medium": "GPU"}

    return [msgpack.packb([0.0, [event(i, j) for j in range(PER_MESSAGE)], 0]) for i in range(POOL)]


def flood_main(port: int, rate: float, seconds: float) -> None:
    """The publisher process: PUB on ``port``, ``rate`` events/s (0 = as fast as it can)."""
    import zmq

    payloads = flood_payloads()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 1_000_000)
    pub.setsockopt(zmq.LINGER, 0)  # what a slow subscriber did not take is dropped at exit
    pub.bind(f"tcp://127.0.0.1:{port}")
    print("READY", flush=True)
    sys.stdin.readline()
    seq, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        if rate > 0:
            delay = start + seq * PER_MESSAGE / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payloads[seq % POOL]])
        seq += 1
    print("SENT", seq * PER_MESSAGE, flush=True)
    ctx.destroy(linger=0)


def in_process_cost() -> float:
    """CPU microseconds per event of decoding and applying the flood's messages in this
    process (no sockets): the ingestion ceiling of one free core is 1e6 / this."""
    from router.kvevents.apply import TableWriter
    from router.kvevents.wire import decode_batch
    from router.state.precise import BlockTable

    payloads = flood_payloads()
    writer = TableWriter(BlockTable(1_000_000), "m", 16)
    for payload in payloads:  # warm: the table reaches its steady size
        writer.apply_raw(decode_batch(payload)[1])
    t0 = time.process_time()
    for _ in range(3):
        for payload in payloads:
            writer.apply_raw(decode_batch(payload)[1])
    return (time.process_time() - t0) / (3 * len(payloads) * PER_MESSAGE) * 1e6


# -- the benchmark: routing latency while flooded, in-process vs sidecar ingestion --------
SECTION = "KV-event ingest while routing"


def _children_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s direct children (the ingestion sidecar), from /proc."""
    from pathlib import Path

    from loadtests.kv_events_bench import _cpu_s

    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += _cpu_s(int(child))
            except OSError:  # it ended meanwhile
                pass
    return total


def _drain(url: str, timeout_s: float = 120.0) -> float:
    """Wait until the router has applied what its sockets still hold (a flood it could not
    keep up with leaves a backlog up to the high-water mark), so the next cell starts
    clean; returns how long that took."""
    from loadtests.kv_events_bench import _events_applied

    t0 = time.perf_counter()
    last, still = _events_applied(url), 0
    while still < 2 and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.3)
        now = _events_applied(url)
        still = still + 1 if now == last else 0
        last = now
    return time.perf_counter() - t0 - 0.6


def measure(modes: list[str], rates: list[int], request_rate: float, duration: float, rounds: int) -> str:
    """One router per mode, each cell (events/s) run ``rounds`` times interleaved."""
    import statistics

    from loadtests.kv_events_bench import _events_applied, _flood, _load, _router_metric
    from loadtests.overhead import request_bodies, zero_backend
    from loadtests.report import table
    from router.tools.localrun import router_process
    from router.tools.process import free_port

    bodies = request_bodies()
    rows = []
    with zero_backend(2) as (backends, _pid):
        for mode in modes:
            port = free_port()
            config = {"instances": [{"url": u, "name": f"z{i}", "model": "zero-model"} for i, u in enumerate(backends)],
                      "hashing": {"mode": "tokens"},
                      "kv_events": {"enabled": True, "discover": False, "sidecar": mode == "sidecar",
                                    "sources": {"z0": {"endpoint": f"tcp://*:{port}", "topic": "kv"}}}}
            cells: dict[int, list[dict[str, float]]] = {r: [] for r in rates}
            with router_process(config) as router:
                pid = router.process.pid
                _load(router.url, bodies, request_rate, 1.0)  # warm-up: connections, tokenizer caches
                for _round in range(rounds):
                    for rate in rates:
                        flood = _flood(port, rate, duration + 1.5) if rate else None
                        try:
                            if flood is not None:
                                time.sleep(0.5)  # the SUB connects
                                assert flood.stdin is not None
                                flood.stdin.write("go\n")
                                flood.stdin.flush()
                            before, t0 = _events_applied(router.url), time.perf_counter()
                            from loadtests.kv_events_bench import _cpu_s

                            cpu0, side0 = _cpu_s(pid), _children_cpu_s(pid)
                            res = _load(router.url, bodies, request_rate, duration)
                            wall = time.perf_counter() - t0
                            cells[rate].append({
                                "p50": res.percentile(0.5) * 1e3, "p99": res.percentile(0.99) * 1e3,
                                "applied": (_events_applied(router.url) - before) / wall,
                                "cpu": (_cpu_s(pid) - cpu0) / wall, "side": (_children_cpu_s(pid) - side0) / wall,
                                "errors": res.errors, "rps": res.rps})
                            if flood is not None and flood.stdout is not None:
                                cells[rate][-1]["sent"] = int(flood.stdout.readline().split()[1]) / (duration + 1.5)
                        finally:
                            if flood is not None:
                                flood.wait(timeout=30)
                        if flood is not None:
                            cells[rate][-1]["backlog_s"] = _drain(router.url)
                        print(f"  {mode} {rate}/s round {_round}: {cells[rate][-1]}", file=sys.stderr)
                gaps = _router_metric(router.url, 'pd_router_kv_event_stream_total{engine="z0",kind="gaps"}')
            base = statistics.median(c["p50"] for c in cells[rates[0]])
            base99 = statistics.median(c["p99"] for c in cells[rates[0]])
            base_cpu = statistics.median(c["cpu"] for c in cells[rates[0]])
            for rate in rates:
                cs = cells[rate]

                def med(k: str) -> float:
                    return statistics.median(c.get(k, 0.0) for c in cs)

                p50s = ", ".join(f"{c['p50']:.2f}" for c in cs)
                rows.append([mode, f"{rate:,}/s" if rate else "none", f"{med('sent'):,.0f}" if rate else "—",
                             f"{med('applied'):,.0f}" if rate else "—", p50s, f"{med('p99'):.2f}",
                             f"{med('p50') - base:+.2f}" if rate else "—", f"{med('p99') - base99:+.2f}" if rate else "—",
                             f"{med('cpu'):.0%}", f"{med('cpu') - base_cpu:+.0%}" if rate else "—",
                             f"{(med('cpu') - base_cpu) / med('applied') * 1e6:.2f}" if rate and med('applied') else "—",
                             f"{med('side'):.0%}" if mode == "sidecar" else "—",
                             f"{med('backlog_s'):.1f}" if rate else "—",
                             f"{sum(c['errors'] for c in cs):.0f}", f"{gaps:.0f}" if rate == rates[-1] else ""])
    head = (f"One `pd-router serve` process (uvloop) routing {request_rate:g} non-streaming completions/s (open loop, "
            "8 keep-alive connections; token mode through the backend's /tokenize) to a zero-work backend while a "
            "publisher process sends it KV events over loopback ZMQ: 32 events per message, half BlockStored of 4 "
            "blocks (64 token ids), half BlockRemoved of 4 (blocks stored 512 messages before). `in-process`: "
            "decoding and tables on the router's event loop (`kv_events.sidecar: false`, the default); `sidecar`: "
            "in the router's child process, the loop applying only changed key sets. Each cell ran "
            f"{rounds} times, interleaved with the others of its router ({duration:g} s each); p50 lists every round, "
            "the other columns are medians; added = against the same router's rounds without events. Publisher, "
            "router, sidecar, backend and load generator share the machine's 2 cores. Router CPU = the serving "
            "process (its event loop), sidecar CPU = its child, each as a share of one core. Events the router "
            "could not apply during a cell stay queued in its sockets (up to `kv_events.hwm` messages); the next cell "
            "starts once they are applied (backlog column). Events applied come from the router's /metrics (a "
            "sidecar's counters reach it every 0.25 s). Sequence gaps: the router's count after its last cell.\n\n")
    cost = in_process_cost()
    tail = (f"\n\nDecoding and applying the same messages in one process, without sockets: {cost:.2f} µs of CPU per "
            f"event (`loadtests.kv_flood.in_process_cost`), a ceiling of {1e6 / cost:,.0f} events/s on a core of its own.")
    return head + table(["ingestion", "event flood", "events/s sent", "events/s applied", "routing p50 ms (rounds)",
                         "routing p99 ms", "added p50 ms", "added p99 ms", "router CPU", "added router CPU",
                         "added router CPU µs per applied event",
                         "sidecar CPU",
                         "backlog drained after s", "request errors", "sequence gaps"], rows) + tail


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    from loadtests.machine import busy_processes, contention_note
    from loadtests.report import write_section

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--modes", nargs="+", default=["in-process", "sidecar"], choices=["in-process", "sidecar"])
    p.add_argument("--events-per-s", type=int, nargs="+", default=[0, 50_000, 100_000])
    p.add_argument("--request-rate", type=float, default=200.0)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    p.add_argument("--rounds", type=int, default=3, help="times each cell runs, interleaved")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    load = os.getloadavg()
    out = (f"{contention_note(busy_processes())} Load average at the start: {load[0]:.1f} on {os.cpu_count()} cores.\n\n"
           + measure(args.modes, args.events_per_s, args.request_rate, args.duration, args.rounds))
    out += f"\n\nLoad average at the end: {os.getloadavg()[0]:.1f}."
    print(out)
    if args.write:
        write_section(SECTION, "python loadtests/kv_flood.py --write", out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    sys.exit(main())
