"""`pd-router demo` runs end to end, prints its table, exits 0 and leaves nothing behind."""

import os
import subprocess
import sys


def emulator_processes() -> set[str]:
    """Emulators and routers started from this checkout (the machine may run other checkouts' tests)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    here = os.getcwd()
    found = set()
    for line in out.splitlines():
        if "router.tools.emulator" in line or "router serve" in line:
            pid = line.split()[0]
            try:
                if os.readlink(f"/proc/{pid}/cwd") == here:
                    found.add(pid)
            except OSError:
                continue  # gone already, or not ours to read
    return found


def test_demo_runs_and_cleans_up():
    before = emulator_processes()
    proc = subprocess.run(
        [sys.executable, "-m", "router", "demo", "--requests", "24", "--concurrency", "6", "--time-scale", "0.05"],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario | policy"))
    rows = [line.split(" | ") for line in lines[header + 2 : header + 6]]
    assert {(r[0], r[1]) for r in rows} == {("colocated", "ttft"), ("colocated", "round_robin"), ("pd", "ttft"), ("pd", "round_robin")}
    for r in rows:
        assert r[2] == "24" and r[3] == "0"  # requests, errors
        assert r[4].endswith("%") and r[5].endswith("ms") and r[6].endswith("ms")
    assert emulator_processes() <= before
