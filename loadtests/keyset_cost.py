"""What a mirror table's key sets cost per key change and per lookup, by implementation:
Python sets (each key of a delta becomes a Python int: ``array.tolist()``), the C extension
``router.state._keyset.KeySet`` (applied straight from the delta's uint64 array), and, when
importable, pyroaring's ``BitMap64`` (the 64-bit roaring bitmap, the nearest library):

    python loadtests/keyset_cost.py [--write]

The work is the sidecar flood's (``kv_flood.py``): random 64-bit router keys, deltas
applied in ``SLICE_KEYS`` slices to a set of ~40k keys (half added, then removed again),
and ``depth`` (the leading run a decision reads) over a held 512-key prompt. CPU time,
best of 5 rounds.
"""

from __future__ import annotations

import random
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any

N_HELD, N_SLICES, SLICE, PROMPT = 40_000, 50, 2048, 512


def _work() -> tuple[list[int], list[array[int]], list[int]]:
    rng = random.Random(1)
    base = [rng.getrandbits(64) for _ in range(N_HELD)]
    slices = [array("Q", [rng.getrandbits(64) for _ in range(SLICE)]) for _ in range(N_SLICES)]
    probes = [rng.getrandbits(64) for _ in range(1000)] + [int(str(k)) for k in base[:1000]]  # fresh int objects
    return base, slices, probes


def implementations() -> dict[str, tuple[Callable[[list[int]], Any], Callable[[Any, array[int]], object],
                                         Callable[[Any, array[int]], object], Callable[..., float]]]:
    """name -> (make from keys, add a slice, remove a slice, depth)."""
    from router.state.precise import leading_depth

    out: dict[str, Any] = {"python set": (set, lambda s, a: s.update(a.tolist()),
                                          lambda s, a: s.difference_update(a.tolist()), leading_depth)}
    try:
        from router.state._keyset import KeySet, depth
        out["KeySet (C)"] = (KeySet, lambda s, a: s.add_keys(a), lambda s, a: s.remove_keys(a), depth)
    except ImportError:
        print("router.state._keyset is not built: Python sets only", file=sys.stderr)
    try:
        from importlib.metadata import version

        from pyroaring import BitMap64  # not a dependency: measured when installed
        out[f"pyroaring {version('pyroaring')} BitMap64 (not a dependency)"] = (BitMap64, lambda s, a: s.update(a), lambda s, a: s.difference_update(BitMap64(a)),
                                     leading_depth)
    except ImportError:
        pass
    return out


def measure(rounds: int = 5) -> list[tuple[str, float, float, float]]:
    """(name, ns per key change, ns per `key in s`, µs per 512-key depth) per implementation."""
    base, slices, probes = _work()
    rows = []
    for name, (make, add, remove, depth) in implementations().items():
        apply_s = lookup_s = depth_s = float("inf")
        for _ in range(rounds):
            s = make(base)
            t0 = time.process_time()
            for a in slices:
                add(s, a)
            for a in slices:
                remove(s, a)
            apply_s = min(apply_s, time.process_time() - t0)
            t0 = time.process_time()
            for _ in range(20):
                for key in probes:
                    key in s  # noqa: B015
            lookup_s = min(lookup_s, time.process_time() - t0)
            gpu, offload, prompt = make(base[:PROMPT + 88]), make([]), base[:PROMPT]
            t0 = time.process_time()
            for _ in range(200):
                depth(prompt, gpu, offload, 0.8)
            depth_s = min(depth_s, time.process_time() - t0)
        rows.append((name, apply_s / (2 * N_SLICES * SLICE) * 1e9, lookup_s / (20 * len(probes)) * 1e9,
                     depth_s / 200 * 1e6))
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    from loadtests.machine import busy_processes, contention_note
    from loadtests.report import write_section

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    rows = measure(args.rounds)
    out = (f"{contention_note(busy_processes())} Load average: {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
           f"end, on {os.cpu_count()} cores.\n\nRandom 64-bit keys; {N_SLICES} slices of {SLICE:,} keys added to a set "
           f"of {N_HELD:,}, then removed; lookups of fresh int objects, half held; depth = the leading run of a held "
           f"{PROMPT}-key prompt (offload tier empty). CPU time, best of {args.rounds}.\n\n"
           "| key sets | ns per key change | ns per `key in s` (Python loop) | µs per 512-key depth |\n|---|---|---|---|\n"
           + "".join(f"| {n} | {a:,.1f} | {c:,.1f} | {d:,.1f} |\n" for n, a, c, d in rows))
    print(out)
    if args.write:
        write_section("Mirror key sets: cost per key change", " ".join(["python loadtests/keyset_cost.py",
                                                                        *(sys.argv[1:] if argv is None else argv)]), out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    sys.exit(main())
