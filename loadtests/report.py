"""Write one named section of docs/benchmarks.md, leaving the other sections alone.

Every benchmark prints its table and records it here with the command that produced it,
the machine and the date, so the published figures can always be reproduced.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
_HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script named in it; rerun the command to reproduce. "
    "Machine notes are read at run time. These machines are small and noisy (2 cores shared by "
    "the router, the emulated engines and the load generator), so compare figures measured side "
    "by side in one run, not across sections.\n"
)


def machine_note() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def write_section(name: str, command: str, body: str) -> None:
    """Replace (or append) the section titled ``name``."""
    today = _dt.date.today().isoformat()
    section = (
        f"## {name}\n\n"
        f"Command: `{command}`  \nMachine: {machine_note()}  \nDate: {today}\n\n{body.rstrip()}\n"
    )
    text = DOC.read_text() if DOC.exists() else _HEADER
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text.rstrip() + "\n")


def table(headers: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
