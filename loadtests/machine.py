"""Is the machine quiet enough to benchmark on? Other tenants' heavy processes, found with ``ps``.

Why: the benchmark machines have 2 cores shared with other engineers' jobs (trace replays,
test suites). A benchmark started next to one measures the neighbour as much as the router,
so the scripts wait (bounded) for quiet and record in the docs what they ran next to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Busy:
    pid: int
    cpu: float  # % of one core, as ps reports it (lifetime average)
    command: str


def busy_processes(threshold: float = 25.0, ignore: set[int] | None = None) -> list[Busy]:
    """Processes other than this one (and ``ignore``) above ``threshold`` % CPU."""
    skip = {os.getpid(), os.getppid()} | (ignore or set())
    try:
        out = subprocess.run(["ps", "-eo", "pid=,pcpu=,args="], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        try:
            pid, cpu = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if pid not in skip and cpu >= threshold and not parts[2].startswith("ps "):
            found.append(Busy(pid, cpu, parts[2][:120]))
    return found


def wait_until_quiet(max_wait_s: float, poll_s: float = 30.0, threshold: float = 25.0) -> list[Busy]:
    """Poll until no other heavy process runs or ``max_wait_s`` passed; return what still runs."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy = busy_processes(threshold)
        if not busy or time.monotonic() >= deadline:
            return busy
        print(f"waiting for a quiet machine ({len(busy)} busy: {busy[0].command[:80]} ...)", file=sys.stderr)
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def contention_note(busy: list[Busy]) -> str:
    """One line for the docs: measured on a quiet machine, or next to what."""
    if not busy:
        return "No other heavy process was running when the measurement started."
    names = "; ".join(f"`{b.command[:90]}` (~{b.cpu:.0f}% CPU)" for b in busy[:3])
    return f"**Measured under contention**: other processes were running: {names}."
