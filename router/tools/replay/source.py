"""Where a replay's requests come from: a trace file, or a seeded synthetic workload.

Why its own module: the file parsers (``trace``) and the generators (``synthetic``) both
produce a ``Trace`` (and the generators use the trace module's helpers), so choosing
between them belongs above both.
"""

from __future__ import annotations

from pathlib import Path

from router.tools.replay.synthetic import generate
from router.tools.replay.trace import Trace, TraceError, read_azure, read_mooncake


def load_trace(spec: str, seed: int = 0) -> Trace:
    """A trace file (``.jsonl`` Mooncake, ``.csv`` Azure) or ``synthetic:NAME[:k=v,...]``."""
    if spec.startswith("synthetic:"):
        return generate(spec.removeprefix("synthetic:"), seed)
    path = Path(spec)
    if path.suffix == ".jsonl":
        return read_mooncake(path)
    if path.suffix == ".csv":
        return read_azure(path)
    raise TraceError(f"{spec}: unknown trace kind; use a .jsonl (Mooncake) or .csv (Azure) file, or synthetic:NAME")
