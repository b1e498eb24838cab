"""Instructions one request's metric records cost, per build (valgrind callgrind, user space).

A request records 11 samples (in flight up and down, time to first byte, requests and latency
by outcome, the decision's latency, rule, mode, cached ratio, predicted and routed tokens), each
as router/request/hooks.py and router/scheduling/decide.py record them in that build (through
``Metrics.engine`` and ``Metrics.decided`` where the build has them, else ``Metrics.child``). A
fresh interpreter records them ``--records`` times under callgrind and once with none; the
difference over ``--records`` is the cost per request. A count, not a time: the other tenants
of the machine do not move it (two runs agree to a few instructions).

    python loadtests/metrics_cost.py [--baseline REF ...] [--records 20000] [--write]
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
from loadtests.overhead import router_source, source_label  # noqa: E402
from loadtests.report import table, write_section  # noqa: E402

SECTION = "Metric records per request (callgrind)"
_RECORDS = """
import sys
from router.core.metrics import Metrics
m = Metrics()
c = m.child
if hasattr(m, "engine"):  # the engine's series and the decision's, looked up once per request
    for _ in range(int(sys.argv[1])):
        m.engine("z0").inflight.inc()
        latency, decisions, modes = m.decided("ttft", "best", "colocated")
        latency.observe(0.00012)
        decisions.inc()
        modes.inc()
        s = m.engine("z0")
        s.cached_ratio.observe(0.6)
        s.predicted_cached.inc(640 * 0.9)
        s.routed_prompt.inc(700)
        m.engine("z0").ttfb.observe(0.0011)
        s = m.engine("z0")
        s.inflight.dec()
        requests, latency = s.outcome("", "ok")
        requests.inc()
        latency.observe(0.0013)
    sys.exit(0)
for _ in range(int(sys.argv[1])):  # builds before Metrics.engine: a child per record
    c("inflight", "z0").inc()
    c("store_latency", "decide").observe(0.00012)
    c("decisions", "ttft", "best").inc()
    c("modes", "colocated").inc()
    c("cached_ratio", "z0").observe(0.6)
    c("predicted_cached", "z0").inc(640 * 0.9)
    c("routed_prompt", "z0").inc(700)
    c("ttfb", "z0").observe(0.0011)
    c("inflight", "z0").dec()
    c("requests", "z0", "", "ok").inc()
    c("latency", "z0", "", "ok").observe(0.0013)
"""


def instructions(source: Path, records: int) -> int:
    """Instructions (Ir) of a whole interpreter run recording ``records`` requests' samples."""
    return callgrind.instructions(_RECORDS, [str(records)], source, 900)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", nargs="*", default=[], metavar="REF", help="also measure these git commits (or directories holding router/)")
    parser.add_argument("--records", type=int, default=20000, help="requests' worth of records per run")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    rows = []
    with contextlib.ExitStack() as stack:
        builds = {"pd-router": ROOT, **{f"pd-router@{source_label(ref)}": stack.enter_context(router_source(ref))
                                        for ref in args.baseline}}
        for name, source in builds.items():
            per_request = (instructions(source, args.records) - instructions(source, 0)) / args.records
            print(f"  {name:<28} {per_request / 1000:8.1f} k instructions per request's 11 records", flush=True)
            rows.append([name, f"{per_request / 1000:.1f}"])
    body = table(["build", "k instructions / request (11 records)"], rows)
    print(body)
    if args.write:
        command = "python loadtests/metrics_cost.py" + "".join(f" --baseline {r}" for r in args.baseline)
        write_section(SECTION, command, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
