"""Reuse through a shared KV store and session migration, each against its target.

    python loadtests/store_bench.py replay [--trace PATH] [--limit N] [--rate-scale X] [--jobs J] [--write]
    python loadtests/store_bench.py migrate [--flavor vllm|sglang] [--rounds N] [--prompt-tokens N ...] [--variants V ...] [--write]

replay: the Mooncake conversation trace (../shared/traces/conversation_trace.jsonl) on the
colocated cluster of replay_bench (8 mixed engines, arrivals x2), without a store and with one
every engine shares (--store-tokens, --store-gbps; the router told of it, and not told). The
router is told the engines' step budget (policy.ttft.prefill_chunk_tokens) in every cluster:
a load landing while another prefill computes waits for that prefill's chunks.
Targets: hit ratio (local cache + store) of ``ttft`` with the store >= 1.8x the same cluster
without one; p90 TTFT gap_closed >= 0.7, i.e. (best baseline without a store - ttft with it) /
(best baseline without a store - bound). Also shown: gap_closed against the baselines on the
same store cluster (the store helps them too).

migrate: live, emulated vLLM engines (1 prefill + 2 decode, slowed --time-scale times so the
CPU of a loaded machine weighs little; figures in model time) behind the router; a
decode instance drops a stream after 64 tokens and the router continues it on the other
decode instance (router/request/continuation.py). Measured at the client: time from the last
token before the break to the next token, with a shared store (the continuation's prompt +
generated blocks load from it) and without (re-prefill), against the TTFT of the same prompt
fully cached. Target: with a store, the next token within 2x that TTFT. Also with a warm standby
(kv_store.standby: the backup decode instance loads the prompt ahead of the failure) and its cost.
--flavor sglang: SGLang engines, where the continuation goes through a prefill+decode pair.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.report import table, write_section
from router.tools.replay.bound import bound_summary, gap_closed
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import replay
from router.tools.replay.source import load_trace
from router.tools.replay.trace import Trace, TraceError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
BASELINES = ("llmd_weighted", "sglang_cache_aware")
RATE_SCALE = 2.0
REPLAY_SECTION = "Shared KV store: replay of the conversation trace"


def _trace(path: str, limit: int | None, rate_scale: float = RATE_SCALE) -> Trace:
    return load_trace(path, 0).limited(limit).scaled(rate_scale)


def cluster(chunk: int | None = None, **fields: object) -> ClusterSpec:
    """The bench's cluster: 8 mixed engines, the router told their step budget
    (``policy.ttft.prefill_chunk_tokens``: the engines' own, unless ``chunk``; 0 = not told)."""
    spec = ClusterSpec(mixed=8, **fields)  # type: ignore[arg-type]
    return replace(spec, prefill_chunk_tokens=spec.step_budget() if chunk is None else chunk)


def _one(job: tuple[str, int | None, float, str, str, dict[str, object]]) -> tuple[str, str, dict[str, object]]:
    path, limit, rate_scale, label, policy, spec_fields = job
    return label, policy, replay(_trace(path, limit, rate_scale), cluster(**spec_fields), policy).summary  # type: ignore[arg-type]


def run_replay(args: argparse.Namespace) -> int:
    try:
        trace = _trace(args.trace, args.limit, args.rate_scale)
    except TraceError as exc:
        print(f"trace not readable: {args.trace}: {exc} (see ../shared/traces/README.md)", file=sys.stderr)
        return 2
    chunk = {"chunk": args.prefill_chunk_tokens}
    store = {**chunk, "store_tokens": args.store_tokens, "store_gbps": args.store_gbps}
    configs = {"no store": chunk, "store": store, "store, router not told": {**store, "store_aware": False}}
    jobs = [(args.trace, args.limit, args.rate_scale, label, policy, fields) for label, fields in configs.items()
            for policy in ("ttft", *BASELINES) if label != "store, router not told" or policy == "ttft"]
    results: dict[tuple[str, str], dict[str, object]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for label, policy, summary in pool.map(_one, jobs):
            results[(label, policy)] = summary
            print(f"{label} / {policy}: p90 {summary['ttft_p90']} s, hit {summary['hit_ratio']}", file=sys.stderr)
    bound = bound_summary(trace, ClusterSpec(mixed=8), 30.0)
    b90 = float(bound["ttft_p90"])  # type: ignore[arg-type]

    def p90(label: str, policy: str) -> float:
        return float(results[(label, policy)]["ttft_p90"])  # type: ignore[arg-type]

    best_plain = min(BASELINES, key=lambda p: p90("no store", p))
    best_store = min(BASELINES, key=lambda p: p90("store", p))
    rows = []
    for (label, policy), s in results.items():
        rows.append([label, policy, s["ttft_p50"], s["ttft_p90"], s["ttft_p99"], s["hit_ratio"], s["local_hit_ratio"],
                     s["store_hit_ratio"], round(gap_closed(p90(label, policy), p90("no store", best_plain), b90), 2)])
    rows.append(["bound", "-", bound["ttft_p50"], bound["ttft_p90"], bound["ttft_p99"], bound["hit_ratio"], "-", "-", "-"])
    hit_x = float(results[("store", "ttft")]["hit_ratio"]) / float(results[("no store", "ttft")]["hit_ratio"])  # type: ignore[arg-type]
    gap = gap_closed(p90("store", "ttft"), p90("no store", best_plain), b90)
    gap_same = gap_closed(p90("store", "ttft"), p90("store", best_store), b90)
    body = table(["cluster", "policy", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s", "hit ratio", "local hit", "store hit",
                  "gap closed (vs best baseline, no store)"], rows)
    body += (
        f"\n\n{len(trace.requests)} requests, 8 mixed llama3-8b-h100 engines, arrivals x{args.rate_scale:g}; store "
        f"{args.store_tokens:,} tokens at {args.store_gbps:g} Gbit/s shared by concurrent loads; the router told the "
        f"engines' step budget (prefill_chunk_tokens {cluster(args.prefill_chunk_tokens).prefill_chunk_tokens}). Virtual time: the "
        f"figures do not depend on the machine's load.\n\n"
        f"- hit ratio, `ttft` with the store / without: **{hit_x:.2f}x** (target >= 1.8x).\n"
        f"- p90 gap_closed of `ttft` with the store, from the best baseline without one (`{best_plain}`, "
        f"{p90('no store', best_plain):.3f} s) to the bound ({b90:.3f} s): **{gap:.2f}** (target >= 0.7).\n"
        f"- the same from the best baseline on the same store cluster (`{best_store}`, "
        f"{p90('store', best_store):.3f} s): {gap_same:.2f}: the store helps every policy; pricing it is worth "
        f"{p90('store, router not told', 'ttft') - p90('store', 'ttft'):+.3f} s of p90 to `ttft` "
        f"(not told: {p90('store, router not told', 'ttft'):.3f} s).\n")
    print(body)
    if args.write:
        command = ("python loadtests/store_bench.py replay --trace ../shared/traces/conversation_trace.jsonl --write"
                   + (f" --limit {args.limit}" if args.limit else "")
                   + (f" --rate-scale {args.rate_scale:g}" if args.rate_scale != RATE_SCALE else "")
                   + (f" --prefill-chunk-tokens {args.prefill_chunk_tokens}" if args.prefill_chunk_tokens is not None else ""))
        if args.section != REPLAY_SECTION:
            command += f" --section {shlex.quote(args.section)}"
        write_section(args.section, command, body)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("replay", help="hit ratio and gap_closed with and without a store")
    r.add_argument("--trace", default=str(DEFAULT_TRACE))
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--rate-scale", type=float, default=RATE_SCALE, help="arrivals this many times the trace's rate")
    r.add_argument("--store-tokens", type=int, default=20_000_000)
    r.add_argument("--store-gbps", type=float, default=100.0)
    r.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    r.add_argument("--prefill-chunk-tokens", type=int, default=None,
                   help="the step budget the router is told (default: the engines' own; 0 = not told)")
    r.add_argument("--write", action="store_true")
    r.add_argument("--section", default=REPLAY_SECTION, help="the docs/benchmarks.md section --write replaces or appends")
    m = sub.add_parser("migrate", help="failure -> next token, store vs re-prefill")
    m.add_argument("--rounds", type=int, default=5)
    m.add_argument("--prompt-tokens", type=int, nargs="+", default=[8000], help="one table per size")
    m.add_argument("--variants", nargs="+", default=None, help="clusters to measure (default: all)")
    m.add_argument("--time-scale", type=float, default=10.0, help="wall seconds per model second of the engines")
    m.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm",
                   help="PD protocol of the engines (sglang: the continuation goes through a prefill+decode pair)")
    m.add_argument("--write", action="store_true")
    m.add_argument("--section", default=None,
                   help="the docs/benchmarks.md section --write replaces or appends (default: one per prompt size)")
    args = p.parse_args()
    if args.mode == "replay":
        return run_replay(args)
    from loadtests.store_migrate import DEFAULT_VARIANTS, VARIANTS, run_migrate
    args.variants = args.variants or DEFAULT_VARIANTS[args.flavor]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    return run_migrate(args)


if __name__ == "__main__":
    sys.exit(main())
