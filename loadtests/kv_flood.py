"""The KV-event flood of kv_events_bench: vLLM-shaped messages from a publisher process,
and what decoding and applying them costs in one process without sockets."""

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
    from router.kvevents.wire import decode_batch_raw
    from router.state.precise import BlockTable

    payloads = flood_payloads()
    writer = TableWriter(BlockTable(1_000_000), "m", 16)
    for payload in payloads:  # warm: the table reaches its steady size
        writer.apply_raw(decode_batch_raw(payload)[1])
    t0 = time.process_time()
    for _ in range(3):
        for payload in payloads:
            writer.apply_raw(decode_batch_raw(payload)[1])
    return (time.process_time() - t0) / (3 * len(payloads) * PER_MESSAGE) * 1e6
