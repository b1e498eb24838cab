"""One Python program under valgrind's callgrind: the instructions it ran, a count that does
not move with the machine's other load (the benchmarks that compare builds use it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def instructions(code: str, args: list[str], source: Path, timeout: float) -> int:
    """Instructions (Ir) of ``python -c code *args`` run in ``source`` with its router first
    on the path (``-c`` puts the working directory first too)."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                          code, *args], capture_output=True, text=True, check=True, cwd=source, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(source)})
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-300:]}")
    return int(found.group(1))
