"""The cells of the quality matrix: workloads, cache pressure, router knowledge, and the
engine parameters drawn at random per cell from the seed.

Every workload is a seeded trace of content blocks (router/tools/replay/trace.py), so the
same cell runs in the offline replay and live against emulated engines. Cache pressure is
measured, not assumed: the hot set is every block that occurs in two or more requests,
and each engine's cache is sized so the cluster holds ``1 / pressure`` of it (never less
than two of the largest requests, so every request fits).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from router.tools.emulator.perf import PROFILES, get_profile
from router.tools.localrun import profile_timing
from router.tools.replay.bound import bound_ttfts
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.trace import Trace, TraceRequest

BLOCK = 128  # trace block tokens
WORKLOADS = ("b2b_uniform", "b2b_zipf", "chat", "longdoc", "dispersed", "bursty")
PRESSURES = (0.5, 2.0, 8.0)
KNOWLEDGE = ("defaults", "facts")
ENGINES = 4


@dataclass(frozen=True)
class Cell:
    workload: str
    pressure: float
    knowledge: str

    @property
    def name(self) -> str:
        return f"{self.workload}/{self.pressure:g}x/{self.knowledge}"

    def seed(self, base: int) -> int:
        return zlib.crc32(f"{base}:{self.name}".encode())


def all_cells() -> list[Cell]:
    return [Cell(w, p, k) for w in WORKLOADS for p in PRESSURES for k in KNOWLEDGE]


def select(patterns: list[str] | None) -> list[Cell]:
    """Cells whose name contains every '/'-separated part of one pattern (e.g. 'chat/2x')."""
    cells = all_cells()
    if not patterns:
        return cells
    return [c for c in cells if any(all(part in c.name.split("/") for part in p.split("/")) for p in patterns)]


@dataclass(frozen=True)
class Drawn:
    """One cell's engines and traffic, drawn from its seed."""

    cell: Cell
    trace: Trace
    spec: ClusterSpec
    rate: float  # arrivals per second
    utilisation: float  # of the cluster's engine time (prefill + decode), by a router keeping 1/pressure of the bound's hits
    hot_tokens: int

    def describe(self) -> str:
        return (f"{self.spec.profile}, slowdown {self.spec.slowdown:.2f}, {self.spec.cache_tokens} KV tokens x {ENGINES}, "
                f"hot set {self.hot_tokens} tokens, {len(self.trace.requests)} req at {self.rate:.2f}/s "
                f"(utilisation {self.utilisation:.2f})")


class _Ids:
    def __init__(self) -> None:
        self.next = 1

    def take(self, tokens: int) -> tuple[int, ...]:
        n = max(1, math.ceil(tokens / BLOCK))
        out = tuple(range(self.next, self.next + n))
        self.next += n
        return out


def _zipf(rng: random.Random, n: int, s: float = 1.1) -> int:
    weights = [1 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights)[0]


def _arrivals(rng: random.Random, n: int, bursty: bool) -> Iterator[float]:
    """Poisson at 1 req/s on average; bursty = 3x for a third of each 12 s cycle, idle otherwise."""
    t = 0.0
    for _ in range(n):
        if not bursty:
            t += rng.expovariate(1.0)
        else:
            t += rng.expovariate(3.0)
            if t % 12.0 > 4.0:
                t += 12.0 - t % 12.0
        yield t


def _requests(workload: str, rng: random.Random, n: int) -> list[TraceRequest]:
    ids = _Ids()
    out: list[TraceRequest] = []
    output = rng.choice((32, 64, 128))
    if workload in ("b2b_uniform", "b2b_zipf", "bursty"):
        tenants = rng.randint(8, 32)
        prefix = rng.randint(1000, 3000)
        prefixes = [ids.take(prefix) for _ in range(tenants)]
        for t in _arrivals(rng, n, workload == "bursty"):
            k = _zipf(rng, tenants) if workload == "b2b_zipf" else rng.randrange(tenants)
            q = rng.randint(50, 300)
            out.append(TraceRequest(t, len(prefixes[k]) * BLOCK + q, output, prefixes[k] + ids.take(q)))
    elif workload == "longdoc":
        docs = [ids.take(rng.randint(6000, 16000)) for _ in range(rng.randint(6, 16))]
        for t in _arrivals(rng, n, False):
            d = docs[_zipf(rng, len(docs), 0.8)]
            q = rng.randint(30, 120)
            out.append(TraceRequest(t, len(d) * BLOCK + q, output, d + ids.take(q)))
    elif workload == "dispersed":
        system = ids.take(256)
        for t in _arrivals(rng, n, False):
            fresh = rng.randint(800, 3000)
            out.append(TraceRequest(t, len(system) * BLOCK + fresh, output, system + ids.take(fresh)))
    elif workload == "chat":
        system = ids.take(rng.randint(300, 1200))
        histories: dict[int, tuple[int, ...]] = {}
        sessions = rng.randint(20, 60)
        for t in _arrivals(rng, n, False):
            s = rng.randrange(sessions)
            hist = histories.get(s, system)
            user = ids.take(rng.randint(50, 400))
            blocks = hist + user
            if len(blocks) * BLOCK > 24000:  # a long chat starts over
                blocks = system + user
            out.append(TraceRequest(t, len(blocks) * BLOCK, output, blocks))
            histories[s] = blocks + ids.take(output)  # the answer joins the history
    else:
        raise ValueError(f"unknown workload {workload!r}")
    return out


def hot_tokens(requests: list[TraceRequest]) -> int:
    counts = Counter(b for r in requests for b in set(r.blocks))
    return sum(BLOCK for c in counts.values() if c >= 2)


def draw(cell: Cell, base_seed: int, requests: int) -> Drawn:
    rng = random.Random(cell.seed(base_seed))
    profile = rng.choice(sorted(PROFILES))
    slowdown = round(rng.uniform(0.5, 2.0), 2)
    reqs = _requests(cell.workload, rng, requests)
    hot = hot_tokens(reqs)
    largest = max(r.input_tokens + r.output_tokens for r in reqs)
    cache = max(2 * largest, int(hot / (cell.pressure * ENGINES)))
    spec = ClusterSpec(mixed=ENGINES, profile=profile, cache_tokens=cache, slowdown=slowdown, told=cell.knowledge == "facts")
    unit = Trace(cell.name, BLOCK, tuple(reqs))
    _, cached, prompt = bound_ttfts(unit, spec)
    # A perfect router still misses what the cluster's cache cannot hold: of the bound's
    # hits, it keeps at most the share of the hot set that fits (1 / pressure).
    per_request = max(1.0, (prompt - cached * min(1.0, 1.0 / cell.pressure)) / len(reqs))
    timing = profile_timing(get_profile(profile), slowdown)
    # Engine seconds per request: its prefill, and its share of decode steps (batches of <= 8:
    # every decode step reads the weights, however few sequences it advances).
    # A cache that holds few requests at once also caps the batch.
    outputs = sum(r.output_tokens for r in reqs) / len(reqs)
    inputs = sum(r.input_tokens for r in reqs) / len(reqs)
    batch = max(1.0, min(8.0, cache / (inputs + outputs)))
    seconds = per_request / timing["prefill_tokens_per_s"] + timing["request_overhead_s"] \
        + outputs * timing["decode_step_base_s"] / batch
    utilisation = round(rng.uniform(0.4, 0.8), 2)
    rate = utilisation * ENGINES / seconds
    return Drawn(cell, unit.scaled(rate), spec, rate, utilisation, hot)
