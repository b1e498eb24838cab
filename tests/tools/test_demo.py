"""`pd-router demo` runs end to end, prints its table, exits 0 and leaves nothing behind."""

import os
import subprocess
import sys
import uuid
from pathlib import Path


def processes_marked(mark: str) -> set[str]:
    """Live processes whose environment carries ``mark``: the demo's own children inherit it,
    so emulators or routers other tests (or other checkouts) run at the same time never count."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() in (proc / "environ").read_bytes():
                found.add(proc.name)
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_demo_runs_and_cleans_up():
    mark = f"PDR_DEMO_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    proc = subprocess.run(
        [sys.executable, "-m", "router", "demo", "--requests", "24", "--concurrency", "6", "--time-scale", "0.05"],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario | policy"))
    rows = [line.split(" | ") for line in lines[header + 2 : header + 6]]
    assert {(r[0], r[1]) for r in rows} == {("colocated", "ttft"), ("colocated", "round_robin"), ("pd", "ttft"), ("pd", "round_robin")}
    for r in rows:
        assert r[2] == "24" and r[3] == "0"  # requests, errors
        assert r[4].endswith("%") and r[5].endswith("ms") and r[6].endswith("ms")
    assert processes_marked(mark) == set()
