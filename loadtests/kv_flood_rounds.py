"""The rounds of ``kv_flood.py``: one router per ingestion mode routing a paced load while a
publisher floods it with KV events, cells interleaved, with A/A rounds for the noise band.

Why A/A: on 2 shared cores the spread between two runs of the same cell is as large as
what ingestion adds, so each round runs the no-event cell twice (``none`` before the
first flood cell, ``none (A/A)`` before the second) and a flood cell's added latency is
read against the largest A/A difference of the run. Why pinning: with everything on
both cores the sidecar and the publisher take CPU from the router's loop, which is the
machine, not the router; pinned, the router's serving process has core 0 and the
sidecar, publisher, backend and load generator share core 1 (other tenants of the
machine are not pinned away). Router CPU per request (its serving process only) is
reported beside the latency: CPU time does not depend on who else runs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.kv_events_bench import _cpu_s, _events_applied, _flood, _load, _router_metric
from loadtests.overhead import request_bodies, zero_backend
from loadtests.report import table
from router.tools.localrun import router_process
from router.tools.process import free_port

AA = -1  # the second no-event cell of a round


@dataclass(frozen=True)
class Layout:
    """Which cores run what: ``None`` = not pinned (both cores)."""

    name: str
    label: str  # for the table
    router: int | None  # the router's serving process
    rest: int | None  # the load generator (this process) and the zero backend
    flood: int | None  # the publisher and the sidecar


LAYOUTS = {
    # the flood's own processes apart from everything a request needs: what the flood adds to
    # core 0 is the router's own cost
    "flood-apart": Layout("flood-apart", "router, backend, load generator: core 0; publisher, sidecar: core 1", 0, 0, 1),
    # the router alone: core 1 carries the backend and the load generator next to the flood
    "router-alone": Layout("router-alone", "router: core 0; backend, load generator, publisher, sidecar: core 1",
                           0, 1, 1),
    "unpinned": Layout("unpinned", "nothing pinned", None, None, None),
}


@dataclass
class Cell:
    rate: int  # events/s offered; 0 and AA: none
    runs: list[dict[str, float]] = field(default_factory=list)


def children(pid: int) -> list[int]:
    """``pid``'s direct children (the ingestion sidecar), from /proc."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _children_cpu_s(pid: int) -> float:
    total = 0.0
    for child in children(pid):
        try:
            total += _cpu_s(child)
        except OSError:  # it ended meanwhile
            pass
    return total


def pin(pid: int, cores: str) -> None:
    """Every thread of ``pid`` on ``cores`` (threads it starts later inherit it)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cores, str(pid)], check=True, stdout=subprocess.DEVNULL)


def _drain(url: str, timeout_s: float = 120.0) -> float:
    """Wait until the router applied what its sockets still hold, so the next cell starts clean."""
    t0 = time.perf_counter()
    last, still = _events_applied(url), 0
    while still < 2 and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.3)
        now = _events_applied(url)
        still = still + 1 if now == last else 0
        last = now
    return time.perf_counter() - t0 - 0.6


def _one(url: str, pid: int, port: int, rate: int, bodies: list[dict[str, object]], request_rate: float,
         duration: float, layout: Layout) -> dict[str, float]:
    flood = _flood(port, rate, duration + 1.5) if rate > 0 else None
    try:
        if flood is not None:
            if layout.flood is not None:
                pin(flood.pid, str(layout.flood))
            time.sleep(0.5)  # the SUB connects
            assert flood.stdin is not None
            flood.stdin.write("go\n")
            flood.stdin.flush()
        before, t0 = _events_applied(url), time.perf_counter()
        cpu0, side0 = _cpu_s(pid), _children_cpu_s(pid)
        res = _load(url, bodies, request_rate, duration)
        wall = time.perf_counter() - t0
        cpu = _cpu_s(pid) - cpu0
        run = {"p50": res.percentile(0.5) * 1e3, "p99": res.percentile(0.99) * 1e3,
               "applied": (_events_applied(url) - before) / wall, "cpu": cpu / wall,
               "cpu_req_us": cpu / max(res.completed, 1) * 1e6, "side": (_children_cpu_s(pid) - side0) / wall,
               "errors": float(res.errors), "rps": res.rps}
        if flood is not None and flood.stdout is not None:
            run["sent"] = int(flood.stdout.readline().split()[1]) / (duration + 1.5)
    finally:
        if flood is not None:
            flood.wait(timeout=30)
    if flood is not None:
        run["backlog_s"] = _drain(url)
    return run


def run_mode(mode: str, layout: Layout, backends: list[str], rates: list[int], request_rate: float, duration: float,
             rounds: int) -> tuple[dict[int, Cell], float]:
    """Every cell of one router, ``rounds`` times interleaved: none, flood, none (A/A), flood..."""
    bodies = request_bodies()
    port = free_port()
    config = {"instances": [{"url": u, "name": f"z{i}", "model": "zero-model"} for i, u in enumerate(backends)],
              "hashing": {"mode": "tokens"},
              "kv_events": {"enabled": True, "discover": False, "sidecar": mode.startswith("sidecar"),
                            "native_key_sets": mode != "sidecar-python-sets",
                            **({"native_tables": False} if mode == "sidecar-python-tables" else {}),
                            **({"shared_tables": False} if mode == "sidecar-deltas" else {}),
                            "sources": {"z0": {"endpoint": f"tcp://*:{port}", "topic": "kv"}}}}
    order = [0]  # none, first flood, none (A/A), the other floods
    for i, rate in enumerate(r for r in rates if r > 0):
        order += [AA, rate] if i == 1 else [rate]
    if AA not in order:
        order.append(AA)
    cells = {r: Cell(r) for r in order}
    with router_process(config) as router:
        pid = router.process.pid
        if layout.router is not None:
            pin(pid, str(layout.router))
        if layout.flood is not None:
            for child in children(pid):  # the sidecar
                pin(child, str(layout.flood))
        _load(router.url, bodies, request_rate, 1.0)  # warm-up: connections, tokenizer caches
        for n in range(rounds):
            for rate in order:
                cells[rate].runs.append(_one(router.url, pid, port, rate, bodies, request_rate, duration, layout))
                print(f"  {layout.name} {mode} {rate}/s round {n}: "
                      f"{ {k: round(v, 3) for k, v in cells[rate].runs[-1].items()} }", file=sys.stderr)
        gaps = _router_metric(router.url, 'pd_router_kv_event_stream_total{engine="z0",kind="gaps"}')
    return cells, gaps


def diffs(cells: dict[int, Cell], rate: int, key: str) -> list[float]:
    """Per round: a flood cell against the mean of that round's two no-event cells; for
    the A/A cell, the difference between the two."""
    if rate == AA:
        return [b[key] - a[key] for a, b in zip(cells[0].runs, cells[AA].runs)]
    return [run[key] - (a[key] + b[key]) / 2 for run, a, b in zip(cells[rate].runs, cells[0].runs, cells[AA].runs)]


def band(cells: dict[int, Cell], key: str) -> float:
    """The noise band: the largest |A/A - A| of the run's rounds."""
    return max(abs(d) for d in diffs(cells, AA, key))


HEADERS = ["cores", "ingestion", "event flood", "events/s sent", "events/s applied", "routing p50 ms (rounds)",
           "routing p99 ms", "added p50 ms", "added p99 ms", "router CPU", "router CPU µs per request",
           "added router CPU µs per request", "added router CPU µs per applied event", "sidecar CPU",
           "backlog drained after s", "request errors", "sequence gaps"]


def _verdict(what: str, d: float, b: float, unit: str, fmt: str) -> str:
    inside = "within noise" if abs(d) <= b else f"outside by {abs(d) - b:{fmt}} {unit}"
    return f"{what} {d:+{fmt}} {unit} vs A/A band ±{b:{fmt}}: {inside}"


def rows(layout: Layout, mode: str, cells: dict[int, Cell], gaps: float) -> tuple[list[list[object]], list[str]]:
    """Table rows (medians over rounds; added = paired per round) and a verdict per flood cell."""
    cores = layout.name
    out: list[list[object]] = []
    verdicts = []
    for rate, cell in cells.items():
        def med(k: str, cell: Cell = cell) -> float:
            return statistics.median(r.get(k, 0.0) for r in cell.runs)

        flood = rate > 0
        added: list[str] = ["—"] * 4
        if rate != 0:
            d50, d99, dcpu = (statistics.median(diffs(cells, rate, k)) for k in ("p50", "p99", "cpu_req_us"))
            per_event = "—"
            if flood and med("applied"):
                per_event = f"{statistics.median(diffs(cells, rate, 'cpu')) / med('applied') * 1e6:.2f}"
            added = [f"{d50:+.2f}", f"{d99:+.2f}", f"{dcpu:+.0f}", per_event]
        if flood:
            verdicts.append(f"- {layout.name}, {mode}, {rate:,} events/s: " + "; ".join([
                _verdict("p50", d50, band(cells, "p50"), "ms", ".2f"),
                _verdict("p99", d99, band(cells, "p99"), "ms", ".2f"),
                _verdict("router CPU", dcpu, band(cells, "cpu_req_us"), "µs/request", ".0f")]))
        label = "none (A/A)" if rate == AA else ("none" if rate == 0 else f"{rate:,}/s")
        out.append([cores, mode, label, f"{med('sent'):,.0f}" if flood else "—",
                    f"{med('applied'):,.0f}" if flood else "—", ", ".join(f"{r['p50']:.2f}" for r in cell.runs),
                    f"{med('p99'):.2f}", added[0], added[1], f"{med('cpu'):.0%}", f"{med('cpu_req_us'):.0f}",
                    added[2], added[3], f"{med('side'):.0%}" if mode.startswith("sidecar") else "—",
                    f"{med('backlog_s'):.1f}" if flood else "—", f"{sum(r['errors'] for r in cell.runs):.0f}",
                    f"{gaps:.0f}" if rate == max(cells) else ""])
    return out, verdicts


def measure(modes: list[str], layouts: list[str], rates: list[int], request_rate: float, duration: float,
            rounds: int) -> str:
    all_rows: list[list[object]] = []
    verdicts: list[str] = []
    everything = os.sched_getaffinity(0)
    try:
        for layout in (LAYOUTS[name] for name in layouts):
            # this process (the load generator) and what it starts inherit this; the router and
            # the publisher are pinned once started
            os.sched_setaffinity(0, everything if layout.rest is None else {layout.rest})
            with zero_backend(2) as (backends, _pid):
                for mode in modes:
                    cells, gaps = run_mode(mode, layout, backends, rates, request_rate, duration, rounds)
                    r, v = rows(layout, mode, cells, gaps)
                    all_rows += r
                    verdicts += v
    finally:
        os.sched_setaffinity(0, everything)
    legend = "; ".join(f"`{lay.name}`: {lay.label}" for lay in (LAYOUTS[name] for name in layouts))
    return f"Cores: {legend}.\n\n" + table(HEADERS, all_rows) + "\n\n" + "\n".join(verdicts)
