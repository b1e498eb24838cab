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
MAX_MEASURED = 1024  # messages sidecar_cost measures after its warm-up, for callgrind


def flood_payloads(count: int = POOL) -> list[bytes]:
    """``POOL`` distinct messages: half BlockStored of 4 fresh blocks, half BlockRemoved of
    blocks stored ``LAG`` messages before, so cycling through them keeps the table's size
    steady and every store is a new block (the first ``count`` of them)."""
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

    return [msgpack.packb([0.0, [event(i, j) for j in range(PER_MESSAGE)], 0]) for i in range(count)]


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


def in_process_cost(native_tables: bool = True) -> float:
    """CPU microseconds per event of decoding and applying the flood's messages in this
    process (no sockets), on the in-process table ``kv_events.native_tables`` picks (the C
    table without change notes, or ``BlockTable``): the ingestion ceiling of one free core
    is 1e6 / this."""
    from router.kvevents.apply import TableWriter
    from router.kvevents.wire import decode_batch
    from router.state.precise_native import engine_table

    payloads = flood_payloads()
    writer = TableWriter(engine_table(native_tables)(1_000_000), "m", 16)
    for payload in payloads:  # warm: the table reaches its steady size
        writer.apply_raw(decode_batch(payload)[1])
    t0 = time.process_time()
    for _ in range(3):
        for payload in payloads:
            writer.apply_raw(decode_batch(payload)[1])
    return (time.process_time() - t0) / (3 * len(payloads) * PER_MESSAGE) * 1e6


def sidecar_cost(native_tables: bool = True, repeats: int = 3, messages: int | None = None) -> float:
    """CPU microseconds per event of everything the sidecar does with the flood's messages
    but sockets and sequence checks: decode, router keys, the tracked table (in C if
    ``native_tables`` and built, else ``TrackedTable``), a delta taken and encoded every 31
    messages (10 ms at 100k events/s); best of ``repeats`` passes over all of them after a
    pass that warms the table, or (for callgrind) one pass over ``messages`` of them after
    ``2 * LAG`` (at most ``MAX_MEASURED``). 1e6 / this is the sidecar's ceiling on a core of its own."""
    if messages is not None and not 0 <= messages <= MAX_MEASURED:
        raise ValueError(f"messages must be in [0, {MAX_MEASURED}]")
    from router.state.precise_mirror import TrackedTable

    try:
        from router.state.precise_native import tracked_table
        factory: Any = tracked_table(native_tables)
    except ImportError:  # a tree before the C tables (loadtests/kv_sidecar_instructions.py --baseline)
        factory = TrackedTable
    # with ``messages``, as many generated whatever it is (callgrind subtracts a run applying none)
    pool = flood_payloads() if messages is None else flood_payloads(2 * LAG + MAX_MEASURED)
    # warm: the table reaches its steady size (after LAG messages removals find their blocks)
    warm, payloads = (pool, pool) if messages is None else (pool[:2 * LAG], pool[2 * LAG:2 * LAG + messages])
    return apply_cost(factory(1_000_000), warm, payloads, repeats)


def apply_cost(table: Any, warm: list[bytes], payloads: list[bytes], repeats: int) -> float:
    """CPU microseconds per event of decoding ``payloads`` and applying them to ``table``
    (after one pass over ``warm``), best of ``repeats``; a table that ships deltas
    (``take_delta``) has one taken and encoded every 31 messages, as the sidecar does."""
    from router.kvevents.apply import TableWriter
    from router.kvevents.sidecar_wire import encode_delta
    from router.kvevents.wire import decode_batch

    writer = TableWriter(table, "m", 16)
    take = getattr(table, "take_delta", None)
    for payload in warm:
        writer.apply_raw(decode_batch(payload)[1])
    if take is not None:
        take()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for i, payload in enumerate(payloads):
            writer.apply_raw(decode_batch(payload)[1])
            table.fresh = True
            if take is not None and i % 31 == 30:
                encode_delta("z0", 0, take(), 1)
        best = min(best, time.process_time() - t0)
    return best / (len(payloads) * PER_MESSAGE) * 1e6 if payloads else 0.0


def loop_apply_cost(per_delta: int = 31, native: bool = True) -> float:
    """CPU microseconds per event the router's loop spends on the flood with the sidecar:
    framing, decoding and applying (in ``SLICE_KEYS`` slices) the deltas a ``TrackedTable``
    ships for ``per_delta`` messages (10 ms at 100k events/s), no sockets; to the C
    extension's key sets if ``native`` (and built), else to Python sets."""
    from router.kvevents.apply import TableWriter
    from router.kvevents.sidecar import SLICE_KEYS
    from router.kvevents.sidecar_wire import FrameReader, decode_delta, encode_delta
    from router.kvevents.wire import decode_batch
    from router.state.precise_mirror import MirrorTable, TrackedTable, delta_changes

    payloads = flood_payloads()
    table = TrackedTable(1_000_000)
    writer = TableWriter(table, "m", 16)
    for payload in payloads:  # warm: the table reaches its steady size
        writer.apply_raw(decode_batch(payload)[1])
    table.fresh = True
    table.take_delta()
    stream = []
    for i in range(0, 2 * len(payloads), per_delta):
        for j in range(per_delta):
            writer.apply_raw(decode_batch(payloads[(i + j) % len(payloads)])[1])
        table.fresh = True
        delta = table.take_delta()
        assert delta is not None
        stream.append(encode_delta("z0", 0, delta, 1))
    best = float("inf")
    for _ in range(3):
        mirror, reader = MirrorTable(1_000_000, native=native), FrameReader()
        t0 = time.process_time()
        for data in stream:
            for _kind, body in reader.feed(data):
                shipped = decode_delta(body).delta
                done, total = 0, delta_changes(shipped)
                while True:
                    done = mirror.apply_part(shipped, done, SLICE_KEYS)
                    if done >= total:
                        break
        best = min(best, time.process_time() - t0)
    return best / (len(stream) * per_delta * PER_MESSAGE) * 1e6


# -- the benchmark: routing latency while flooded, in-process vs sidecar ingestion --------
SECTION = "KV-event ingest while routing"


def describe(request_rate: float, rounds: int, duration: float) -> str:
    return (f"One `pd-router serve` process (uvloop) routing {request_rate:g} non-streaming completions/s (open loop, "
            "8 keep-alive connections; token mode through the backend's /tokenize) to a zero-work backend while a "
            "publisher process sends it KV events over loopback ZMQ: 32 events per message, half BlockStored of 4 "
            "blocks (64 token ids), half BlockRemoved of 4 (blocks stored 512 messages before). `in-process`: "
            "decoding and tables on the router's event loop (`kv_events.sidecar: false`, the default); `sidecar`: "
            "in the router's child process, on its engine-block tables in C (`router/state/_tracked.c`: blocks, key "
            "refcounts and netted key changes, one call per event), which writes the held keys into shared memory "
            "the loop reads in place (`router/state/_keyset_shared.h`, the default where it is possible); "
            "`sidecar-deltas`: the sidecar ships the changed key sets instead and the loop applies them, in "
            "slices of 2,048 key changes per callback, to the C extension's uint64 sets (`router/state/_keyset.c`; "
            "`kv_events.shared_tables: false`); "
            "`sidecar-python-sets`: deltas applied to Python sets on the loop (`kv_events.native_key_sets: false`); "
            "`sidecar-python-tables`: Python tables in the sidecar (`kv_events.native_tables: false`). The layouts "
            "(`taskset`, every thread of a process) are listed below the table; other tenants of the machine still run on both cores. Each round runs, per router: none, 50k/s, "
            "none (A/A), 100k/s; "
            f"{rounds} rounds of {duration:g} s cells. p50 lists every round, other columns are medians over rounds; "
            "added = per round against the mean of that round's two no-event cells (for the A/A row: the second "
            "minus the first), median over rounds; the A/A band = the largest |A/A difference| of any round, and a "
            "flood cell is within noise when its added value is inside it. Router CPU = the serving process only "
            "(its event loop; the sidecar's is its own column), as a share of one core and per request. Events the "
            "router could not apply during a cell stay queued in its sockets (up to `kv_events.hwm` messages); the "
            "next cell starts once they are applied (backlog column). Sequence gaps: the router's count after its "
            "last cell.\n\n")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import shlex
    from pathlib import Path

    from loadtests.kv_flood_rounds import measure
    from loadtests.machine import busy_processes, contention_note
    from loadtests.report import write_section
    from router.state.precise_mirror import key_sets
    from router.state.precise_native import table_kind

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--modes", nargs="+", default=["sidecar", "in-process"],
                   choices=["in-process", "sidecar", "sidecar-deltas", "sidecar-python-sets", "sidecar-python-tables"])
    p.add_argument("--layouts", nargs="+", default=["flood-apart", "unpinned"],
                   choices=["flood-apart", "router-alone", "unpinned"], help="which cores run what (kv_flood_rounds)")
    p.add_argument("--events-per-s", type=int, nargs="+", default=[50_000, 100_000])
    p.add_argument("--request-rate", type=float, default=200.0)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per cell")
    p.add_argument("--rounds", type=int, default=3, help="times each cell runs, interleaved")
    p.add_argument("--write", action="store_true")
    p.add_argument("--section", default=SECTION, help="the docs/benchmarks.md section --write replaces or appends")
    p.add_argument("--skip-set-updates", action="store_true",
                   help="the router's mirrors take no key changes (loadtests/kv_flood_skip): what the flood costs "
                        "the router besides the set updates; sidecar mode only; never with --write")
    args = p.parse_args(argv)
    if args.skip_set_updates:
        if args.write:
            p.error("--skip-set-updates measures a router that drops what it is sent: not for docs/benchmarks.md")
        skip = str(Path(__file__).resolve().parent / "kv_flood_skip")
        os.environ["KV_FLOOD_SKIP_SET_UPDATES"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(d for d in (skip, os.environ.get("PYTHONPATH")) if d)
    load = os.getloadavg()
    out = (f"{contention_note(busy_processes())} Load average at the start: {load[0]:.1f} on {os.cpu_count()} cores.\n\n"
           + describe(args.request_rate, args.rounds, args.duration)
           + measure(args.modes, args.layouts, args.events_per_s, args.request_rate,
                     args.duration, args.rounds))
    cost, python_cost = in_process_cost(), in_process_cost(native_tables=False)
    out += (f"\n\nDecoding and applying the same messages in one process, without sockets: {cost:.2f} µs of CPU per "
            f"event ({table_kind()} table; {python_cost:.2f} on Python's `BlockTable`; "
            f"`loadtests.kv_flood.in_process_cost`), a ceiling of {1e6 / cost:,.0f} events/s on a core of its own. "
            f"What the sidecar leaves on the loop, framing, decoding and applying the deltas of the same messages "
            f"(31 per delta, 10 ms at 100k/s) without sockets: {loop_apply_cost():.2f} µs of CPU per event "
            f"({key_sets()} key sets), {loop_apply_cost(native=False):.2f} with Python sets, best of 3 "
            "(`loadtests.kv_flood.loop_apply_cost`). Everything the sidecar does with them but sockets and "
            f"sequence checks (decode, keys, its tables, a delta encoded every 31 messages): {sidecar_cost():.2f} µs "
            f"of CPU per event ({table_kind()} tables), {sidecar_cost(native_tables=False):.2f} on Python tables, "
            "best of 3 (`loadtests.kv_flood.sidecar_cost`).")
    out += f"\n\nLoad average at the end: {os.getloadavg()[0]:.1f}."
    print(out)
    if args.write:
        command = shlex.join(["python", "loadtests/kv_flood.py", *(sys.argv[1:] if argv is None else argv)])
        write_section(args.section, command, out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    sys.exit(main())
