"""Instructions the ingestion sidecar spends per KV event, per build and table kind
(valgrind callgrind, user space): ``loadtests.kv_flood.sidecar_cost``'s work (decode, router
keys, the tracked table, a delta taken and encoded every 31 messages), no sockets.

A fresh interpreter warms a table with 1,024 of the flood's messages, then applies
``--messages`` more (at most 1,024) under callgrind; a second run applies none, and the difference over
the events is the cost per event. A count, not a time: other tenants of the machine do
not move it, so two builds (``--baseline REF``) or the two table kinds compare run against run.

    python loadtests/kv_sidecar_instructions.py [--baseline REF ...] [--messages 512] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtests import callgrind  # noqa: E402
from loadtests.kv_flood import PER_MESSAGE  # noqa: E402
from loadtests.overhead import router_source, source_label  # noqa: E402
from loadtests.report import table, write_section  # noqa: E402

SECTION = "KV-event sidecar: instructions per event (callgrind)"
_RUN = """
import sys
sys.path.insert(1, sys.argv[3])
from loadtests.kv_flood import sidecar_cost
sidecar_cost(sys.argv[1] == "native", repeats=1, messages=int(sys.argv[2]))
"""


def instructions(source: Path, native: bool, messages: int) -> int:
    """Instructions (Ir) of a whole interpreter run: warm-up, then ``messages`` messages."""
    return callgrind.instructions(_RUN, ["native" if native else "python", str(messages), str(ROOT)], source, 1800)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", nargs="*", default=[], metavar="REF", help="also measure these git commits (or directories holding router/)")
    parser.add_argument("--messages", type=int, default=512, help="messages of 32 events applied after the warm-up")
    parser.add_argument("--write", action="store_true", help="append the table to docs/benchmarks.md")
    parser.add_argument("--section", default=SECTION)
    args = parser.parse_args(argv)
    rows = []
    with contextlib.ExitStack() as stack:
        builds = {"this tree": ROOT, **{source_label(ref): stack.enter_context(router_source(ref)) for ref in args.baseline}}
        for name, source in builds.items():
            kinds = ("native", "python") if (source / "router" / "state" / "precise_native.py").exists() else ("python",)
            for kind in kinds:
                native = kind == "native"
                per_event = ((instructions(source, native, args.messages) - instructions(source, native, 0))
                             / (args.messages * PER_MESSAGE))
                print(f"  {name:<20} {kind:<7} tables {per_event / 1000:8.2f} k instructions per event", flush=True)
                rows.append([name, kind, f"{per_event / 1000:.2f}"])
    body = table(["build", "sidecar tables", "k instructions / event"], rows)
    print(body)
    if args.write:
        command = "python loadtests/kv_sidecar_instructions.py" + "".join(f" --baseline {r}" for r in args.baseline)
        write_section(args.section, command, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
