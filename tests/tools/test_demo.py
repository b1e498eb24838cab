"""`pd-router demo` runs end to end, prints its table, exits 0 and leaves nothing behind."""

import os
import subprocess
import sys
import uuid
from pathlib import Path


def processes_tagged(tag: str) -> set[int]:
    """Live processes whose environment carries ``tag``: the demo's children, however
    deep, and nobody else's (other runs on the machine start the same commands)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "environ").read_bytes():
                    found.add(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


def test_demo_runs_and_cleans_up():
    tag = f"PDR_DEMO_TEST_RUN={uuid.uuid4().hex}"
    name, value = tag.split("=")
    proc = subprocess.run(
        [sys.executable, "-m", "router", "demo", "--requests", "24", "--concurrency", "6", "--time-scale", "0.05"],
        capture_output=True, text=True, timeout=240, env={**os.environ, name: value},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario | policy"))
    rows = [line.split(" | ") for line in lines[header + 2 : header + 6]]
    assert {(r[0], r[1]) for r in rows} == {("colocated", "ttft"), ("colocated", "round_robin"), ("pd", "ttft"), ("pd", "round_robin")}
    for r in rows:
        assert r[2] == "24" and r[3] == "0"  # requests, errors
        assert r[4].endswith("%") and r[5].endswith("ms") and r[6].endswith("ms")
    assert processes_tagged(tag) == set()
