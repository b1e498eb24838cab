"""CPU cost of recording a prompt in the residency index (every booking does it).

Two workloads of 2,000 records of 500-block prompts (400 shared by a tenant, 100 unique)
into 4 instances of 4,000 blocks: 8 tenants (the tenants fit; few evictions come back) and
64 tenants (every record evicts ~440 blocks and finds most of them in the ghost list).
Prints microseconds of CPU per record, best of 5. The router package comes from the path,
so the same script measures another checkout:

    python loadtests/residency_record_cost.py
    PYTHONPATH=/path/to/other/checkout python loadtests/residency_record_cost.py
"""

from __future__ import annotations

import random
import time

from router.state.residency import ResidencyIndex


def per_record_us(tenants: int, records: int = 2000, rounds: int = 5) -> float:
    rng = random.Random(1)
    prompts = []
    for i in range(records):
        t = rng.randrange(tenants)
        prompts.append([t * 100_000 + k for k in range(400)] + [10**9 + i * 1000 + k for k in range(100)])
    best = float("inf")
    for _ in range(rounds):
        index = ResidencyIndex(600.0)
        started = time.process_time()
        for n, prompt in enumerate(prompts):
            index.record(f"m{n % 4}", prompt, 4000, n * 0.01)
        best = min(best, time.process_time() - started)
    return best / records * 1e6


def main() -> None:
    for tenants in (8, 64):
        print(f"{tenants} tenants: {per_record_us(tenants):.0f} us CPU per record of 500 blocks")


if __name__ == "__main__":
    main()
