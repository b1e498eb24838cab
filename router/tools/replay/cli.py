"""``pd-router replay TRACE``: replay a request trace offline, once per policy, in virtual time.

TRACE is a Mooncake ``.jsonl`` file, an Azure ``.csv`` file, or ``synthetic:NAME[:k=v,...]``
(shared_prefix, multi_turn, dispersed). Every policy is the router's own object, routing an
emulated cluster; results go to ``--out``: summary.json, summary.md and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from router.scheduling.presets import PRESET_NAMES
from router.tools.emulator.perf import PROFILES
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.precise import RESIDENCIES
from router.tools.replay import capacity
from router.tools.replay.bound import add_gap_closed, reference_summaries
from router.tools.replay.report import markdown, write
from router.tools.replay.run import DEFAULT_POLICIES, Outcome, replay
from router.tools.replay.source import load_trace
from router.tools.replay.trace import Trace, TraceError


class Progress:
    """A one-line progress bar on stderr (a line per 10% when stderr is not a terminal)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self._label = label
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.perf_counter()
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(1, total)
        if not self._tty and (pct // 10 == self._shown // 10 and done < total):
            return
        self._shown = pct
        bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
        line = f"{self._label:<20} [{bar}] {pct:3d}% {done}/{total} arrivals {time.perf_counter() - self._started:6.1f}s"
        self._stream.write(("\r" + line) if self._tty else line + "\n")
        if self._tty and done >= total:
            self._stream.write("\n")
        self._stream.flush()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help=".jsonl (Mooncake) or .csv (Azure) file, or synthetic:NAME[:k=v,...]")
    p.add_argument("--policy", action="extend", nargs="+", choices=PRESET_NAMES, metavar="NAME",
                   help=f"policies to replay, of {', '.join(PRESET_NAMES)} (default: {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--prefill", type=int, default=0, help="prefill instances")
    p.add_argument("--decode", type=int, default=0, help="decode instances")
    p.add_argument("--mixed", type=int, default=None, help="mixed instances (default 8 without --prefill/--decode, else 0)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the arrival rate (timestamps / X)")
    p.add_argument("--profile", default="llama3-8b-h100", choices=sorted(PROFILES))
    p.add_argument("--cache-tokens", type=int, default=None, help="KV cache per engine (default: the profile's)")
    p.add_argument("--router-cache-tokens", type=int, default=None,
                   help="cache size the router is told per engine (default: the engines' real one); e.g. the "
                        "config default 500000, to see what approximate residency predicts when it is wrong")
    p.add_argument("--link-gbps", type=float, default=None, help="P->D KV link bandwidth (default: the profile's)")
    p.add_argument("--out", default="replay-out", help="directory for summary.json, summary.md and plots")
    p.add_argument("--ttft-slo", type=float, default=30.0, help="TTFT SLO in seconds for slo_attainment")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N arrivals")
    p.add_argument("--seed", type=int, default=0, help="seed of the policies' tie breaks and synthetic traces")
    p.add_argument("--residency", choices=RESIDENCIES, default="approximate",
                   help="where the router's residency comes from: its routing history (approximate) or the "
                        "simulated engines' KV events, i.e. their actual cache contents (precise)")
    p.add_argument("--store-tokens", type=int, default=None,
                   help="a KV store all engines share, of this many tokens (default: no store): engines write what they "
                        "compute and load the prefixes they lack from it")
    p.add_argument("--store-gbps", type=float, default=100.0, help="the store's read bandwidth, Gbit/s, shared by loads")
    p.add_argument("--store-unaware", action="store_true",
                   help="the engines share the store but the router is not told (kv_store.enabled off)")
    p.add_argument("--prefill-chunk-tokens", type=int, default=0,
                   help="the engines' step budget the router is told (policy.ttft.prefill_chunk_tokens; the profile's "
                        "is 8192); 0 = not told (the default). With a store, a prefill is priced the delay it causes to "
                        "loads landing where it computes only when told")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-bound", action="store_true", help="leave out the bound row (each request alone, everything earlier cached), the lru_alone row (alone, with the hits of one LRU as large as the cluster's caches) and gap_closed")
    p.add_argument("--sweep", default=None, metavar="X,Y,...",
                   help="capacity sweep: replay every policy at each of these --rate-scale values and report the highest"
                        " each sustains with p90 TTFT <= --ttft-slo (writes capacity.json / capacity.md)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("replay", help="replay a trace offline against the router's policies",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if (args.rate_scale <= 0 or (args.limit is not None and args.limit < 1) or args.ttft_slo <= 0
                or args.prefill_chunk_tokens < 0):
            raise ValueError("--rate-scale and --ttft-slo must be > 0, --limit >= 1 and --prefill-chunk-tokens >= 0")
        mixed = args.mixed if args.mixed is not None else (0 if args.prefill or args.decode else 8)
        spec = ClusterSpec(args.prefill, args.decode, mixed, args.profile, args.cache_tokens, args.link_gbps,
                           router_cache_tokens=args.router_cache_tokens, store_tokens=args.store_tokens,
                           store_gbps=args.store_gbps, store_aware=not args.store_unaware,
                           prefill_chunk_tokens=args.prefill_chunk_tokens)
        base = load_trace(args.trace, args.seed).limited(args.limit)
        trace = base.scaled(args.rate_scale)
        scales = [float(x) for x in args.sweep.split(",")] if args.sweep else []
        if any(x <= 0 for x in scales):
            raise ValueError("--sweep scales must be > 0")
    except TraceError as exc:
        hint = "" if Path(args.trace).exists() or args.trace.startswith("synthetic:") else \
            " (trace files are not in the repository; see ../shared/traces/README.md for where they come from)"
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    policies = list(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    if scales:
        return _sweep(args, base, spec, policies, scales)
    print(f"replaying {len(trace.requests)} requests of {trace.name} ({trace.requests[-1].arrival_s:.0f} s after"
          f" --rate-scale {args.rate_scale:g}) on {spec.prefill}P+{spec.decode}D+{spec.mixed}M {spec.profile},"
          f" {args.residency} residency",
          file=sys.stderr)
    outcomes: list[Outcome] = []
    for name in policies:
        progress = None if args.quiet else Progress(name)
        outcome = replay(trace, spec, name, seed=args.seed, ttft_slo_s=args.ttft_slo, on_progress=progress,
                         residency=args.residency)
        print(f"{name}: {outcome.wall_s:.1f} s wall", file=sys.stderr)
        outcomes.append(outcome)
    out = Path(args.out)
    summaries = [o.summary for o in outcomes]
    if not args.no_bound:
        bound, lru = reference_summaries(trace, spec, args.ttft_slo)
        best = add_gap_closed([*summaries, lru], bound)
        summaries += [bound, lru]
        if best is not None:
            print(f"gap_closed is measured from the best baseline by p90 TTFT: {best}", file=sys.stderr)
    written = write(out, summaries, [o.curves for o in outcomes])
    (out / "timing.json").write_text(json.dumps({o.summary["policy"]: round(o.wall_s, 2) for o in outcomes}, indent=2) + "\n")
    print(markdown(summaries))
    print("wrote " + ", ".join(str(p) for p in [*written, out / "timing.json"]), file=sys.stderr)
    return 0


def _sweep(args: argparse.Namespace, base: Trace, spec: ClusterSpec, policies: list[str], scales: list[float]) -> int:
    def one(name: str, scale: float) -> dict[str, object]:
        outcome = replay(base.scaled(scale), spec, name, seed=args.seed, ttft_slo_s=args.ttft_slo)
        print(f"{name} x{scale:g}: p90 {outcome.summary['ttft_p90']} s ({outcome.wall_s:.1f} s wall)", file=sys.stderr)
        return outcome.summary

    result = capacity.sweep(policies, scales, args.ttft_slo, one)
    result["trace"], result["cluster"] = base.name, f"{spec.prefill}P+{spec.decode}D+{spec.mixed}M {spec.profile}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = capacity.markdown(result)
    (out / "capacity.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "capacity.md").write_text(f"# Capacity of {base.name} on {result['cluster']}\n\n{text}")
    print(text)
    print(f"wrote {out / 'capacity.json'}, {out / 'capacity.md'}", file=sys.stderr)
    return 0
