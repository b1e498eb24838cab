"""Instructions the router's process executes per answered request (valgrind callgrind, user space).

Why another measure beside ``cpu_per_request.py``: on this shared 2-core machine the CPU time
of one build moves by 10-15% between two 3 s cells as the other tenants' load changes, so a
change worth 2-5% cannot be told from noise even side by side. The instructions the process
runs per request barely move with that load: it is a count, not a time (callgrind simulates
the process; other processes only slow it down). What it leaves out is kernel time — the
socket syscalls, which every router pays — so it measures the Python work a change removes,
not the whole CPU bill.

Each build serves the benchmark's workload (two zero-work backends, 64 shared-prefix
prompts, non-streaming and streaming ``/v1/completions``) under callgrind, warmed up
uninstrumented; then the process is instrumented idle for a few seconds (health checks,
metric export: their rate is subtracted) and under load at a small concurrency for a fixed
time. Net instructions per request = (instructions under load - idle rate x load time) /
answered requests. Builds alternate, ``--repeats`` times each.

``--redis`` puts every build on the Redis store (a redis-server started here, a namespace per
router process) and also reads, from each router's metrics, how many of its decisions ran the
policy again after the round trip (``pd_router_state_revisions_total``, where the build has it).

    python loadtests/instructions_per_request.py [--baseline REF ...] [--repeats 2] [--redis] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.loadgen import encode_post, new_event_loop, run_load  # noqa: E402
from loadtests.cpu_per_request import redis_server  # noqa: E402
from loadtests.overhead import request_bodies, router_source, source_label, zero_backend  # noqa: E402
from loadtests.report import table, write_section  # noqa: E402
from router.tools.process import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Router instructions per request (callgrind)"


def _totals(prefix: str) -> int:
    """Instructions (Ir) over every dump callgrind wrote so far for ``prefix``."""
    total = 0
    for path in glob.glob(prefix + ".*"):
        with open(path, errors="replace") as fh:
            for line in fh:
                if line.startswith("totals:"):
                    total += int(line.split()[1])
    return total


@contextlib.contextmanager
def callgrind_router(backends: Sequence[str], source: Path, workdir: str,
                     redis_url: str | None = None) -> Iterator[tuple[int, int, str]]:
    """``pd-router serve`` from ``source`` under callgrind (instrumentation off until asked),
    on the Redis store at ``redis_url`` when given: (pid, port, dump prefix)."""
    config: dict[str, object] = {"instances": [{"url": u, "name": f"z{i}"} for i, u in enumerate(backends)]}
    if redis_url:
        config["state"] = {"backend": "redis", "redis_url": redis_url, "key_prefix": f"cg{time.monotonic_ns()}"}
    config_path = os.path.join(workdir, f"config-{time.monotonic_ns()}.yaml")
    Path(config_path).write_text(yaml.safe_dump(config))
    port = free_port("127.0.0.1")
    prefix = os.path.join(workdir, f"cg-{time.monotonic_ns()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PD_ROUTER_")}
    env["PYTHONPATH"] = str(source)
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={prefix}.%p",
                             sys.executable, "-m", "router", "serve", "--config", config_path, "--port", str(port),
                             "--log-level", "warning"], cwd=source, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # start-up runs some 50x slower under valgrind
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router under callgrind did not start (exit {proc.poll()})")
            time.sleep(0.5)
        yield proc.pid, port, prefix
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def revisions(port: int) -> float | None:
    """Share of the router's decisions that ran the policy again (None: the build does not count them)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30, trust_env=False).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("pd_router_state_revisions_total", "pd_router_state_round_trips_total"):
            values[name] = float(value)
        elif name.startswith("pd_router_decisions_total{"):
            values["decisions"] = values.get("decisions", 0.0) + float(value)
    if "pd_router_state_revisions_total" not in values or not values.get("decisions"):
        return None
    return values["pd_router_state_revisions_total"] / values["decisions"]


def measure(source: Path, mode: str, args: argparse.Namespace, workdir: str,
            redis_url: str | None = None) -> tuple[float, int, float | None]:
    """(net instructions per request, requests answered, share of decisions revised) of one build in one mode."""
    with zero_backend(2) as (backends, _), callgrind_router(backends, source, workdir, redis_url) as (pid, port, prefix):
        bodies = [dict(b, stream=(mode == "stream")) for b in request_bodies()]
        reqs = [encode_post("127.0.0.1", port, "/v1/completions", b) for b in bodies]
        loop = new_event_loop()
        try:
            loop.run_until_complete(run_load("127.0.0.1", port, reqs, args.concurrency, args.warmup, 0.0))

            def control(*flags: str) -> None:
                subprocess.run(["callgrind_control", *flags, str(pid)], capture_output=True, check=False)

            control("-i", "on")
            t0 = time.monotonic()
            time.sleep(args.idle)
            control("-d")
            t1 = time.monotonic()
            idle = _totals(prefix)
            res = loop.run_until_complete(run_load("127.0.0.1", port, reqs, args.concurrency, args.duration, 0.0))
            control("-d")
            t2 = time.monotonic()
            control("-i", "off")
        finally:
            loop.close()
        busy = _totals(prefix) - idle
        if res.errors or not res.completed:
            raise RuntimeError(f"{res.errors} errors, {res.completed} answers: {res.error_sample}")
        revised = revisions(port) if redis_url else None
        return (busy - idle / (t1 - t0) * (t2 - t1)) / res.completed, res.completed, revised


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", nargs="*", default=[], metavar="REF", help="also measure these git commits (or directories holding router/)")
    p.add_argument("--modes", nargs="+", default=["plain", "stream"], choices=["plain", "stream"])
    p.add_argument("--repeats", type=int, default=2, help="runs per build and mode, alternating builds")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0, help="instrumented seconds under load per run")
    p.add_argument("--idle", type=float, default=6.0, help="instrumented idle seconds per run (subtracted)")
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--redis", action="store_true", help="every build on the Redis store (a redis-server started here)")
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--section", default=SECTION,
                   help="title of the docs/benchmarks.md section --write replaces, or appends when new")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (callgrind and callgrind_control)")
    results: dict[tuple[str, str], list[float]] = {}
    answered: dict[tuple[str, str], int] = {}
    revised: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pd-router-callgrind-"))
        redis_url = stack.enter_context(redis_server())[0] if args.redis else None
        builds: dict[str, Path] = {"pd-router": ROOT}
        for ref in args.baseline:
            rev = source_label(ref)
            builds[f"pd-router@{rev}"] = stack.enter_context(router_source(ref))
        for rnd in range(args.repeats):
            for mode in args.modes:
                for name, source in builds.items():
                    per, n, share = measure(source, mode, args, workdir, redis_url)
                    results.setdefault((name, mode), []).append(per)
                    if share is not None:
                        revised.setdefault((name, mode), []).append(share)
                    answered[(name, mode)] = answered.get((name, mode), 0) + n
                    print(f"  run {rnd + 1} {mode:<6} {name:<22} {per / 1e3:8.1f} k instructions/request ({n} answers)",
                          file=sys.stderr, flush=True)
    first = next(iter(builds))
    rows = []
    for mode in args.modes:
        for name in builds:
            runs = results[(name, mode)]
            mean = sum(runs) / len(runs)
            ours = sum(results[(first, mode)]) / len(results[(first, mode)])
            row = [mode, name, f"{mean / 1e3:.0f}", " / ".join(f"{r / 1e3:.0f}" for r in runs),
                   f"{mean / ours:.2f}×" if name != first else "1.00×", answered[(name, mode)]]
            if args.redis:
                shares = revised.get((name, mode))
                row.append(" / ".join(f"{s:.0%}" for s in shares) if shares else "—")
            rows.append(row)
    head = ["mode", "build", "k instructions / request (mean)", "runs", f"vs {first}", "answers"]
    body = table(head + (["decisions revised"] if args.redis else []), rows)
    load = "load average %.1f / %.1f / %.1f (2 cores) at the end" % os.getloadavg()
    print(body + "\n\n" + load)
    if args.write:
        method = (("Redis store (a redis-server started here, a namespace per router). " if args.redis else "") +
                  f"callgrind (user-space instructions of the router process), concurrency {args.concurrency}, "
                  f"{args.duration:.0f} s instrumented under load per run after {args.warmup:.0f} s warm-up, the idle "
                  f"rate over {args.idle:.0f} s subtracted; builds alternate, {args.repeats} runs each. Kernel time "
                  "(socket syscalls) is not counted: compare builds of the router, not routers. " + load + ".")
        write_section(args.section, "python loadtests/instructions_per_request.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), method + "\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
