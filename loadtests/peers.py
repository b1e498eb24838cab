"""Start the peer routers (sglang-router's ``smg``, ``vllm-router``) on loopback for benchmarks.

Why a module of its own: the side-by-side and the overhead benchmarks start the same peers
the same way, and the quirks found running them here (shared/reference/peers-*.md §F) must be
handled once: both default their Prometheus exporter to port 29000 (each gets a free port),
``smg`` defaults to 0.0.0.0 (we pass ``--host 127.0.0.1``), ``vllm-router`` does not bind its
port until every worker answers ``/health`` and polls every 30 s by default
(``--worker-startup-check-interval 1``), and both log every request at INFO (``warn`` here,
like pd-router, so none pays for per-request logging). A peer that is not installed, exits,
or is not ready in time raises :class:`PeerUnavailable` with its log tail, so a benchmark can
report it and go on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from router.tools.process import free_port, read_tail, stop_process, wait_ready

PEERS = ("sglang-router", "vllm-router")  # measured unless --peers says otherwise
# sglang-router's newer release, measured when asked (--peers smg): both it and sglang-router 0.3.2
# install a ``bin/smg``, so each is run through its own package (``sglang-router launch``,
# ``python -m smg launch``), never through whichever ``smg`` script was installed last.
ALL_PEERS = (*PEERS, "smg")


class PeerUnavailable(RuntimeError):
    """A peer router could not be started (not installed, crashed, or never ready)."""


@dataclass(frozen=True)
class Workers:
    """Where a router sends traffic: regular workers, or prefill (with bootstrap port) + decode."""

    regular: tuple[str, ...] = ()
    prefill: tuple[tuple[str, int | None], ...] = ()
    decode: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.regular) + len(self.prefill) + len(self.decode)


def _module(name: str) -> list[str]:
    """``python -m name`` with this interpreter, if the package is installed here."""
    if importlib.util.find_spec(name) is None:
        raise PeerUnavailable(f"{name} is not installed (pip install {name})")
    return [sys.executable, "-m", name]


def _binary(name: str) -> str:
    """The console script next to this interpreter (the venv), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    found = local if os.access(local, os.X_OK) else shutil.which(name)
    if not found:
        raise PeerUnavailable(f"{name} is not installed (pip install -e '.[bench]')")
    return found


def peer_argv(peer: str, workers: Workers, port: int, prometheus_port: int, policy: str = "cache_aware") -> list[str]:
    """The exact command line for ``peer`` in front of ``workers``."""
    if peer == "sglang-router":
        argv = [_binary("sglang-router"), "launch", "--log-level", "warn"]
        pd_flag = "--pd-disaggregation"
    elif peer == "smg":
        argv = [*_module("smg"), "launch", "--log-level", "warn"]
        pd_flag = "--pd-disaggregation"
    elif peer == "vllm-router":
        argv = [_binary("vllm-router"), "--worker-startup-check-interval", "1", "--log-level", "warning"]
        pd_flag = "--vllm-pd-disaggregation"
    else:
        raise ValueError(f"unknown peer {peer!r}; expected one of {ALL_PEERS}")
    argv += ["--host", "127.0.0.1", "--port", str(port), "--policy", policy,
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    if workers.regular:
        argv += ["--worker-urls", *workers.regular]
    else:
        argv.append(pd_flag)
        for url, bootstrap in workers.prefill:
            argv += ["--prefill", url, str(bootstrap) if bootstrap is not None else "none"]
        for url in workers.decode:
            argv += ["--decode", url]
    return argv


@dataclass
class PeerProcess:
    name: str
    argv: list[str]
    url: str
    process: subprocess.Popen[bytes]
    log_path: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, limit: int = 1500) -> str:
        return read_tail(self.log_path, limit)

    def stop(self) -> None:
        stop_process(self.process)


def _ready(client: httpx.Client, url: str, expected_workers: int) -> bool:
    """Both peers answer ``/readiness`` with ``healthy_workers``; wait for all of them."""
    try:
        resp = client.get(url + "/readiness")
    except httpx.HTTPError:
        return False
    if resp.status_code != 200:
        return False
    try:
        healthy = resp.json().get("healthy_workers")
    except ValueError:
        return True
    return healthy is None or int(healthy) >= expected_workers


@contextlib.contextmanager
def peer_router(peer: str, workers: Workers, policy: str = "cache_aware", ready_timeout: float = 45.0) -> Iterator[PeerProcess]:
    """Run ``peer`` in front of ``workers`` until the block exits; raise PeerUnavailable if it cannot."""
    port, prom = free_port("127.0.0.1"), free_port("127.0.0.1")
    argv = peer_argv(peer, workers, port, prom, policy)
    log_fd, log_path = tempfile.mkstemp(prefix=f"{peer}-", suffix=".log")
    with os.fdopen(log_fd, "wb") as log:
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "NO_COLOR": "1", "RUST_LOG_STYLE": "never"})
        except OSError as exc:
            raise PeerUnavailable(f"{peer}: cannot start {argv[0]}: {exc}") from None
    handle = PeerProcess(peer, argv, f"http://127.0.0.1:{port}", proc, log_path)
    try:
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            wait_ready(lambda: _ready(client, handle.url, workers.count), proc, ready_timeout,
                       lambda why: PeerUnavailable(f"{peer} {why}: {handle.log_tail()}"), interval=0.2)
        yield handle
    finally:
        handle.stop()
        with contextlib.suppress(OSError):
            os.unlink(log_path)


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as one shell-readable line with the venv path shortened, for the docs."""
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
