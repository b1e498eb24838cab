"""Memory of one router process's state at scale: 1,024 instances x 1M residency entries.

Why: the residency index is the only per-request-growing structure; it is bounded by each
instance's cap (its cache in blocks), so its worst case is every instance at cap. This fills a
MemoryStore to ``--entries`` (instance, block key) entries spread over ``--instances``
instances in whole prefixes (as bookings record them), with one request in flight per
instance, and reports the process's RSS growth.

    python loadtests/memory_footprint.py [--instances 1024] [--entries 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.state.base import Booking  # noqa: E402
from router.state.memory import MemoryStore  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


async def fill(instances: int, entries: int, prefix_blocks: int, shared: float, seed: int) -> MemoryStore:
    rng = random.Random(seed)
    per_instance = entries // instances
    store = MemoryStore({f"i{i}": per_instance for i in range(instances)}, 600.0)
    prefixes: list[list[int]] = []
    for i in range(instances):
        inst, held = f"i{i}", 0
        while held < per_instance:
            if prefixes and rng.random() < shared:  # a prefix other instances hold too (shared keys)
                keys = rng.choice(prefixes)
            else:
                keys = [rng.getrandbits(63) for _ in range(prefix_blocks)]
                prefixes.append(keys)
            keys = keys[: per_instance - held]
            store.record_residency(inst, keys)
            held += len(keys)
        store.book(Booking.single(f"live{i}", inst, 100, 1000, []))
    return store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=1024)
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--prefix-blocks", type=int, default=64, help="blocks per recorded prefix (64 x 16 tokens = 1K)")
    p.add_argument("--shared", type=float, default=0.5, help="share of prefixes another instance also holds")
    args = p.parse_args(argv)
    before = rss_mib()
    store = asyncio.run(fill(args.instances, args.entries, args.prefix_blocks, args.shared, 0))
    grown = rss_mib() - before
    print("| instances | residency entries | RSS growth MiB | bytes / entry | process RSS MiB |")
    print("|---|---|---|---|---|")
    print(f"| {args.instances} | {args.entries:,} | {grown:.0f} | {grown * 2**20 / args.entries:.0f} | {rss_mib():.0f} |")
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
