"""Router overhead: direct-to-backend vs through pd-router and the peer routers, side by side.

Why this shape: what a router *adds* only shows against a backend that costs nothing, so all
targets front the same zero-work backend (``zero_backend.py``, two ports = two workers), are
started together, and are measured by the same load generator (``loadgen.py``: raw asyncio +
httptools, closed loop) in interleaved rounds, so drift from the machine's other tenants hits
every target alike. Added latency = a target's percentile minus the direct one at the same
concurrency. Targets:

  direct          the zero backend itself
  pd-router       this checkout (``pd-router serve``: uvloop + httptools, checked in /proc)
  pd-router@REF   with ``--baseline REF``: the router package of a git commit (before/after)
  sglang-router   ``smg launch --policy cache_aware``
  vllm-router     ``vllm-router --policy cache_aware`` (asks the backend for token ids per request)

Requests: non-streaming ``/v1/completions``, 64 distinct prompts (8 shared ~1.5 KB prefixes x 8
questions), ``max_tokens`` 16. ``--profile`` also records pd-router with py-spy under load.

    python loadtests/overhead.py --baseline HEAD --write
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import time
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.loadgen import LoadResult, encode_post, new_event_loop, run_load
from loadtests.machine import busy_processes, contention_note, wait_until_quiet
from loadtests.peers import ALL_PEERS, PEERS, PeerUnavailable, Workers, command_line, peer_router
from loadtests.profile_summary import summarise
from loadtests.report import table, write_section
from router.tools.localrun import RouterProcess, router_process
from router.tools.shared_prefix import SharedPrefix

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Router overhead"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per target, concurrency and round")
    p.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds before each measurement")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (results pooled)")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(ALL_PEERS))
    p.add_argument("--baseline", metavar="REF", help="also measure pd-router as of this git commit (or from a directory holding router/)")
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="py-spy each pd-router target for this long at concurrency 16; print the hottest frames")
    p.add_argument("--profile-dir", default=tempfile.gettempdir(), help="where --profile leaves the collapsed stacks")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for other heavy processes to finish")
    p.add_argument("--workers-redis", metavar="URL",
                   help="also measure `pd-router serve --workers 2` sharing state through the Redis at URL")
    p.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    return p.parse_args(argv)


def request_bodies(seed: int = 0) -> list[dict[str, object]]:
    """64 non-streaming completions: 8 shared prefixes x 8 questions (what cache-aware routers see)."""
    workload = SharedPrefix(groups=8, users=8, system_tokens=200, question_tokens=30, seed=seed)
    texts = workload.texts()
    return [{"model": "zero-model", "prompt": texts.prompt(pair), "max_tokens": 16, "stream": False}
            for pair in workload.pairs()]


@contextlib.contextmanager
def announced(argv: Sequence[str], word: str, what: str) -> Iterator[tuple[str, int]]:
    """A helper process that prints ``word`` and its port(s) once it listens: (what follows
    the word, pid), stopped on exit."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(word + " "):
            raise RuntimeError(f"{what} did not start (exit {proc.poll()})")
        yield line.split()[1], proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def zero_backend(ports: int = 2) -> Iterator[tuple[list[str], int]]:
    """The zero backend on ``ports`` free loopback ports, as (urls, pid)."""
    argv = [sys.executable, str(ROOT / "loadtests" / "zero_backend.py")] + ["--port", "0"] * ports
    with announced(argv, "PORTS", "zero backend") as (listed, pid):
        yield [f"http://127.0.0.1:{p}" for p in listed.split(",")], pid


def source_label(ref: str) -> str:
    """How a ``--baseline`` is named in tables: a directory by its name, a git ref by its short hash."""
    if Path(ref).is_dir():
        return Path(ref).resolve().name
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


def _c_sources(tree: Path) -> dict[str, bytes]:
    return {str(f.relative_to(tree)): f.read_bytes() for f in sorted((tree / "router").rglob("*.[ch]"))}


def built_extensions(root: Path = ROOT) -> list[Path]:
    """The C extensions built in ``root``'s router package (none in a tree never built)."""
    return sorted((root / "router").rglob("*.so"))


def copy_extensions(into: Path, root: Path = ROOT, built: list[Path] | None = None) -> list[str]:
    """Copy ``root``'s built C extensions (``built``: ``built_extensions(root)`` when not given)
    into the ``router`` package at ``into`` when their C sources (every .c and .h of the
    package) are byte-identical there; returns the copied.

    Why: a git archive holds no build products, so a baseline would otherwise run its Python
    fallbacks (block keys, key sets) and differ from this tree by more than its Python."""
    built = built_extensions(root) if built is None else built
    if not built or _c_sources(into) != _c_sources(root):
        return []
    copied = []
    for so in built:
        rel = so.relative_to(root)
        if (into / rel).with_name(so.name.split(".")[0] + ".c").exists():  # an extension of the package, built from it
            shutil.copy2(so, into / rel)
            copied.append(str(rel))
    return copied


@contextlib.contextmanager
def router_source(ref: str) -> Iterator[Path]:
    """The ``router`` package as of git ``ref``, unpacked in a temporary directory with this
    tree's C extensions where their sources did not change (``copy_extensions``; a warning on
    stderr otherwise). A directory (a checkout holding ``router/``, e.g. one built another way)
    is used as it is."""
    if Path(ref).is_dir():
        if not (Path(ref) / "router").is_dir():
            raise SystemExit(f"--baseline {ref}: a directory must hold the router package (router/)")
        yield Path(ref)
        return
    with tempfile.TemporaryDirectory(prefix="pd-router-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "router"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        built = built_extensions()
        if built and not copy_extensions(Path(tmp), built=built):
            print(f"baseline {ref}: its C sources differ from this tree's, so it runs without C extensions "
                  "(Python fallbacks)", file=sys.stderr)
        yield Path(tmp)


@contextlib.contextmanager
def pd_router(backends: Sequence[str], source: Path | None = None, redis_url: str | None = None,
              workers: int = 1) -> Iterator[RouterProcess]:
    """``pd-router serve`` in front of ``backends``; from ``source`` (a checkout) when given;
    with ``workers`` processes sharing state through ``redis_url``."""
    config: dict[str, object] = {"instances": [{"url": u, "name": f"z{i}"} for i, u in enumerate(backends)]}
    if redis_url:
        # a namespace per router: routers measured side by side on one redis-server are not replicas of each other
        config["state"] = {"backend": "redis", "redis_url": redis_url, "key_prefix": f"overhead{time.monotonic_ns()}"}
    args = ["--workers", str(workers)] if workers > 1 else []
    with router_process(config, args=args, source=str(source) if source is not None else None) as handle:
        yield handle


def server_stack(pid: int) -> str:
    """Which event loop and HTTP parser a running process has loaded (from /proc/PID/maps)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    loop = "uvloop" if "uvloop/loop." in maps else "asyncio"
    http = "httptools" if "httptools/parser" in maps else "h11"
    return f"{loop} + {http}"


def measure(targets: dict[str, str], concurrencies: Sequence[int], args: argparse.Namespace,
            bodies: Sequence[dict[str, object]]) -> dict[tuple[str, int], LoadResult]:
    """Every (target, concurrency) cell, rounds interleaved and target order rotated per round."""
    results: dict[tuple[str, int], LoadResult] = {}
    loop = new_event_loop()
    names = list(targets)
    try:
        for rnd in range(args.rounds):
            for c in concurrencies:
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    host, port = targets[name].rsplit("//", 1)[1].split(":")
                    reqs = [encode_post(host, int(port), "/v1/completions", b) for b in bodies]
                    res = loop.run_until_complete(run_load(host, int(port), reqs, c, args.duration, args.warmup))
                    results[(name, c)] = results[(name, c)].merge(res) if (name, c) in results else res
                    print(f"  round {rnd + 1} c={c:<3} {name:<22} p50 {res.percentile(0.5) * 1e3:6.2f} ms "
                          f"{res.rps:7.0f} req/s  errors {res.errors}", file=sys.stderr)
    finally:
        loop.close()
    return results


def render(results: dict[tuple[str, int], LoadResult], targets: Sequence[str], concurrencies: Sequence[int]) -> str:
    """The per-cell table, then the target check against sglang-router."""
    rows = []
    for c in concurrencies:
        direct = results[("direct", c)]
        for name in targets:
            r = results[(name, c)]
            added = "" if name == "direct" else (f"{(r.percentile(0.5) - direct.percentile(0.5)) * 1e3:+.2f}",
                                                  f"{(r.percentile(0.99) - direct.percentile(0.99)) * 1e3:+.2f}")
            rows.append([c, name, f"{r.percentile(0.5) * 1e3:.2f}", f"{r.percentile(0.99) * 1e3:.2f}",
                         added[0] if added else "—", added[1] if added else "—", f"{r.rps:.0f}", r.errors])
    out = table(["concurrency", "target", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "req/s", "errors"], rows)
    if "sglang-router" not in targets:
        return out
    check: list[list[object]] = []
    for name in [t for t in targets if t.startswith("pd-router")]:
        for c in concurrencies:
            d, s, p = (results[(t, c)].percentile(0.5) for t in ("direct", "sglang-router", name))
            ratio = (p - d) / (s - d) if s - d > 0 else float("nan")
            check.append([name, f"c={c}", f"{(p - d) * 1e3:.2f} vs {(s - d) * 1e3:.2f} ms", f"{ratio:.2f}×",
                          "yes" if ratio <= 1.2 else "no"])
        best = {t: max(results[(t, c)].rps for c in concurrencies) for t in ("sglang-router", name)}
        share = best[name] / best["sglang-router"] if best["sglang-router"] else float("nan")
        check.append([name, "max req/s", f"{best[name]:.0f} vs {best['sglang-router']:.0f}", f"{share:.0%}",
                      "yes" if share >= 0.9 else "no"])
    return out + "\n\nTarget (pd-router vs sglang-router, same run): added p50 ≤ 1.2×, max req/s ≥ 90%.\n\n" + table(
        ["router", "metric", "pd-router vs sglang-router", "ratio", "target met"], check)


def run_profile(pid: int, url: str, seconds: float, out: str, bodies: Sequence[dict[str, object]]) -> str:
    """py-spy (sampling, 200 Hz, ``--nonblocking``: blocking samples land at syscall boundaries in this
    VM) a router process while driving it at concurrency 16; summarise."""
    spy = subprocess.Popen(["py-spy", "record", "--nonblocking", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                            "--format", "raw", "--output", out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ,
                           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    host, port = url.rsplit("//", 1)[1].split(":")
    reqs = [encode_post(host, int(port), "/v1/completions", b) for b in bodies]
    loop = new_event_loop()
    try:
        loop.run_until_complete(run_load(host, int(port), reqs, 16, seconds + 1, 0.5))
    finally:
        loop.close()
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0:
        return f"py-spy failed (pip install py-spy): {err.decode(errors='replace')[-300:]}"
    return summarise(Path(out).read_text(), top=12)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bodies = request_bodies()
    busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet else busy_processes()
    notes: list[str] = [contention_note(busy)]
    routers: dict[str, RouterProcess] = {}
    with contextlib.ExitStack() as stack:
        backends, backend_pid = stack.enter_context(zero_backend(2))
        targets: dict[str, str] = {"direct": backends[0]}
        ours = routers["pd-router"] = stack.enter_context(pd_router(backends))
        targets["pd-router"] = ours.url
        notes.append(f"pd-router serves on {server_stack(ours.process.pid)} (read from /proc/PID/maps); "
                     f"zero backend on {server_stack(backend_pid)}")
        if args.baseline:
            source = stack.enter_context(router_source(args.baseline))
            rev = source_label(args.baseline)
            routers[f"pd-router@{rev}"] = stack.enter_context(pd_router(backends, source))
            targets[f"pd-router@{rev}"] = routers[f"pd-router@{rev}"].url
        if args.workers_redis:
            name = "pd-router --workers 2 (redis)"
            routers[name] = stack.enter_context(pd_router(backends, redis_url=args.workers_redis, workers=2))
            targets[name] = routers[name].url
        for peer in args.peers:
            try:
                handle = stack.enter_context(peer_router(peer, Workers(regular=tuple(backends))))
            except PeerUnavailable as exc:
                print(f"{peer}: not measured: {exc}", file=sys.stderr)
                notes.append(f"{peer} could not be started: {str(exc).splitlines()[0][:200]}")
                continue
            targets[peer] = handle.url
            notes.append(f"{peer}: `{command_line(handle.argv)}`")
        print(f"targets: {', '.join(targets)}; {args.rounds} rounds x {len(args.concurrency)} concurrencies x "
              f"{args.duration:.0f}+{args.warmup:.0f} s", file=sys.stderr)
        results = measure(targets, args.concurrency, args, bodies)
        profiles = {name: run_profile(r.process.pid, r.url, args.profile, os.path.join(args.profile_dir, f"{name}.stacks"),
                                      bodies) for name, r in routers.items() if "--workers" not in name} if args.profile else {}
    body = render(results, list(targets), args.concurrency)
    for name, summary in profiles.items():
        body += f"\n\nProfile of {name} (py-spy, {args.profile:.0f} s at concurrency 16; % of samples):\n\n```\n{summary}\n```"
    print(body)
    if args.write:
        method = (f"Load generator: `loadtests/loadgen.py` (raw asyncio + httptools on uvloop, closed loop, keep-alive), "
                  f"{args.rounds} interleaved rounds × {args.duration:.0f} s per cell after {args.warmup:.0f} s warm-up; "
                  "non-streaming `/v1/completions`, 64 prompts (8 shared ~1.5 KB prefixes × 8 questions), against "
                  "`loadtests/zero_backend.py` on two ports (two workers). Added = target − direct at the same "
                  "concurrency and percentile. `pd-router@REF` is the router package of git commit REF run from a temporary "
                  "copy with the same config (the before of a before/after). vllm-router's cache_aware asks every worker "
                  "for the prompt's token ids (`/v1/completions/render`, answered by the zero backend) before routing: "
                  "that is part of what it adds.")
        write_section(SECTION, "python loadtests/overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      method + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
